"""The runner's own overhead per case, side by side with simply reading every golden.

Measures, in one process and one run, for every golden of the tier:
  load:    reading the case: safetensors.torch.load_file(path), and the bytes of the inputs it
           regenerates from its seed as they sit in the local cache (the floor: the case's data);
  runner:  v41_conformance.runner.run_case with the reference implementation, minus the time spent
           inside the implementation's run() calls (measured around each call): manifest and cache
           hash checks, decode, schema checks, input copies, the step drivers, the chain (the
           reference returns every intermediate: each is checked against the golden's digests,
           and a stage whose rows differ would be rederived), every comparison and the record.
Prints both per-case means and their ratio (target: at most 3x). The two passes alternate (load,
runner, load, runner, ...) so a burst of load from other processes hits both; each figure is the
median of `--repeats`, the ratio the median of the per-pair ratios, with the load average. The
process keeps freed memory as the `conformance` command's processes do
(`v41_conformance.allocator`) and settles its garbage collector once the implementation is loaded,
as an isolation child does (`v41_conformance.collector`); `--glibc-defaults` and `--gc-defaults`
measure without either, for comparison.

    python benchmarks/run_overhead.py [--tier small|production] [--repeats 5] [--select PATTERN]
                                      [--glibc-defaults] [--gc-defaults]

The production tier's goldens must be built first (`conformance generate --tier production`); its
attention case runs the reference for about two minutes per repeat, which is not counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from v41_conformance import cache
from v41_conformance.allocator import keep_freed_memory
from v41_conformance.collector import settle
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.config import load_config
from v41_conformance.golden import golden_path, read_manifest
from v41_conformance.ids import matches, parse_select
from v41_conformance.known import components
from v41_conformance.regenerated import CACHE_KIND
from v41_conformance.runner import run_case


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


def regenerated_files(path: Path) -> list[Path]:
    """The cache files of the inputs a golden regenerates (present after one run has cached them)."""
    import json

    with open(path, "rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    meta = json.loads(header["__metadata__"]["conformance"])
    root = cache.cache_dir()
    if root is None:
        return []
    return [
        root / CACHE_KIND / want["sha256"][:2] / want["sha256"]
        for want in (meta.get("regenerated_inputs") or {}).values()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--select", default=None)
    parser.add_argument("--glibc-defaults", action="store_true", help="leave malloc as glibc sets it")
    parser.add_argument("--gc-defaults", action="store_true", help="leave Python's garbage collector as it starts")
    args = parser.parse_args()
    tuned = not args.glibc_defaults and keep_freed_memory()
    config = load_config(Path(__file__).resolve().parents[1] / "conformance.yaml").for_tier(args.tier)
    manifest = read_manifest(config.goldens)
    ids = [i for i in sorted(manifest) if matches(i, parse_select(args.select))]
    torch.set_num_threads(1 if args.tier == "small" else torch.get_num_threads())
    impl = TimedReference()
    if not args.gc_defaults:
        components()  # loaded before settling, as an isolation child loads them
        settle()
    paths = [golden_path(config.goldens, i) for i in ids]

    def time_runner() -> float:
        impl.inside = 0.0
        start = time.perf_counter()
        for case_id in ids:
            result = run_case(case_id, config, impl, "reference", manifest)
            if result.status != "pass":
                raise SystemExit(f"the reference did not pass {case_id}: {result.status} {result.message[:200]}")
        return time.perf_counter() - start - impl.inside

    first = time_runner()  # warms the page cache, the imports and the regenerated-input cache
    extra = [f for p in paths for f in regenerated_files(p)]

    def time_load() -> float:
        start = time.perf_counter()
        for path in paths:
            load_file(path)
        for path in extra:
            path.read_bytes()
        return time.perf_counter() - start

    time_load()
    before = os.getloadavg()
    pairs = [(time_load(), time_runner()) for _ in range(args.repeats)]
    after = os.getloadavg()
    load = statistics.median(a for a, _ in pairs)
    runner = statistics.median(b for _, b in pairs)
    ratio = statistics.median(b / a for a, b in pairs)
    total_bytes = sum(p.stat().st_size for p in paths) + sum(p.stat().st_size for p in extra if p.exists())
    print(
        f"malloc: {'freed memory kept, as conformance run does' if tuned else 'glibc defaults'}; "
        f"garbage collector: {'defaults' if args.gc_defaults else 'settled, as an isolation child does'}"
    )
    print(
        f"{args.tier} tier: {len(ids)} goldens, {total_bytes / 1e6:.2f} MB ({len(extra)} regenerated inputs from the cache); "
        f"first runner pass {first:.3f} s (cold)"
    )
    print(f"load average {before[0]:.2f} before, {after[0]:.2f} after ({os.cpu_count()} cores); {args.repeats} pairs")
    print(f"load only : {1e3 * load / len(ids):8.3f} ms/case  (median {load:.3f} s total)")
    print(f"runner    : {1e3 * runner / len(ids):8.3f} ms/case  (median {runner:.3f} s total)")
    print(
        f"ratio runner/load: {ratio:.2f}x, median of {args.repeats} side-by-side pairs "
        f"(min {min(b / a for a, b in pairs):.2f}x; target <= 3x)"
    )


if __name__ == "__main__":
    main()
