"""The runner's own overhead per case, side by side with simply loading every golden.

Measures, in one process and one run, for every golden in the manifest:
  load:    safetensors.torch.load_file(path)                        (the floor: reading the golden)
  runner:  harness.runner.run_case with the reference implementation, minus the time spent
           inside the implementation's run() calls (measured around each call): manifest hash
           check, decode, schema checks, input copies, the step drivers, every comparison and
           the result record.
Prints both per-case means and their ratio (target: at most 3x). Best of a few repeats.

    python benchmarks/run_overhead.py [--repeats 3] [--select PATTERN]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from harness.adapters.reference import ReferenceAdapter
from harness.config import load_config
from harness.golden import golden_path, read_manifest
from harness.ids import matches, parse_select
from harness.runner import run_case


class TimedReference(ReferenceAdapter):
    """The reference, with the time spent inside run() accumulated so it can be subtracted."""

    def __init__(self):
        self.inside = 0.0

    def run(self, component, inputs, params):
        start = time.perf_counter()
        try:
            return super().run(component, inputs, params)
        finally:
            self.inside += time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--select", default=None)
    args = parser.parse_args()
    config = load_config(Path(__file__).resolve().parents[1] / "conformance.yaml")
    manifest = read_manifest(config.goldens)
    ids = [i for i in sorted(manifest) if matches(i, parse_select(args.select))]
    torch.set_num_threads(1)
    impl = TimedReference()
    paths = [golden_path(config.goldens, i) for i in ids]

    def time_load() -> float:
        start = time.perf_counter()
        for path in paths:
            load_file(path)
        return time.perf_counter() - start

    def time_runner() -> float:
        impl.inside = 0.0
        start = time.perf_counter()
        for case_id in ids:
            result = run_case(case_id, config, impl, "reference", manifest)
            if result.status != "pass":
                raise SystemExit(f"the reference did not pass {case_id}: {result.status} {result.message[:200]}")
        return time.perf_counter() - start - impl.inside

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
