"""The runner's own overhead per case, side by side with simply loading every golden.

Measures, in one process and one run, for every golden in the manifest:
  load:   safetensors.torch.load_file(path)                         (the floor: reading the golden)
  runner: harness.runner.run_case with an oracle implementation that returns the golden's own
          outputs from memory (so the implementation costs nothing): manifest hash check, decode,
          schema checks, input copies, the step driver, every comparison and the result record.
Prints both per-case means and their ratio (target: at most 3x). Best of a few repeats.

    python benchmarks/run_overhead.py [--repeats 3] [--select PATTERN]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from safetensors.torch import load_file

from harness.config import load_config
from harness.golden import golden_path, load_verified, read_manifest
from harness.ids import matches, parse_select
from harness.runner import run_case


class Oracle:
    """Returns the golden's outputs (per step for stateful components) without computing."""

    def __init__(self, outputs_by_case):
        self.outputs_by_case = outputs_by_case
        self.current = None

    def supports(self, component):
        return True

    def run(self, component, inputs, params):
        outputs = self.outputs_by_case[self.current]
        if "step" in params:
            prefix = f"s{int(params['step']):02d}."
            return {k[len(prefix):]: v.clone() for k, v in outputs.items() if k.startswith(prefix)}
        return {k: v.clone() for k, v in outputs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--select", default=None)
    args = parser.parse_args()
    config = load_config(Path(__file__).resolve().parents[1] / "conformance.yaml")
    manifest = read_manifest(config.goldens)
    ids = [i for i in sorted(manifest) if matches(i, parse_select(args.select))]
    oracle = Oracle({i: load_verified(config.goldens, i, manifest).outputs for i in ids})
    paths = [golden_path(config.goldens, i) for i in ids]

    def time_load() -> float:
        start = time.perf_counter()
        for path in paths:
            load_file(path)
        return time.perf_counter() - start

    def time_runner() -> float:
        start = time.perf_counter()
        for case_id in ids:
            oracle.current = case_id
            result = run_case(case_id, config, oracle, "oracle", manifest)
            if result.status != "pass":
                raise SystemExit(f"oracle did not pass {case_id}: {result.status} {result.message[:200]}")
        return time.perf_counter() - start

    time_load(), time_runner()  # warm the page cache and imports
    load = min(time_load() for _ in range(args.repeats))
    runner = min(time_runner() for _ in range(args.repeats))
    total_bytes = sum(p.stat().st_size for p in paths)
    print(f"{len(ids)} goldens, {total_bytes / 1e6:.2f} MB")
    print(f"load only : {1e3 * load / len(ids):8.3f} ms/case  ({load:.3f} s total)")
    print(f"runner    : {1e3 * runner / len(ids):8.3f} ms/case  ({runner:.3f} s total)")
    print(f"ratio runner/load: {runner / load:.2f}x (target <= 3x)")


if __name__ == "__main__":
    main()
