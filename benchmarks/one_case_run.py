"""A one-case run against `python -c "import torch"`, side by side (target: at most 1.3x).

What a developer feels after changing one kernel: `conformance run --impl reference --select
quant.e2m1/midpoints`, start to exit, in a fresh process as a user runs it (default isolation), and
beside it the floor any torch program pays, a fresh interpreter importing torch. The two alternate
(A, B, A, B, ...), so a burst of load from other processes hits both; each figure is the median of
`--repeats`, and the load average before and after is printed with it. Prints only.

    .venv/bin/python benchmarks/one_case_run.py [--repeats 9] [--select quant.e2m1/midpoints]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.3


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--select", default="quant.e2m1/midpoints")
    args = parser.parse_args()
    torch_only = [sys.executable, "-c", "import torch"]
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as report:
        one_case = [
            sys.executable,
            "-m",
            "v41_conformance",
            "run",
            "--impl",
            "reference",
            "--select",
            args.select,
            "--report-dir",
            report,
        ]
        wall(one_case)  # the page cache and the regenerated-input cache, as after any earlier run
        runs, imports = [], []
        for _ in range(args.repeats):
            runs.append(wall(one_case))
            imports.append(wall(torch_only))
    after = os.getloadavg()
    run, floor = statistics.median(runs), statistics.median(imports)
    print(f"load average {load[0]:.2f} before, {after[0]:.2f} after ({os.cpu_count()} cores)")
    print(f"conformance run --select {args.select}: median {run:.3f} s (min {min(runs):.3f}, max {max(runs):.3f})")
    print(f"python -c 'import torch'          : median {floor:.3f} s (min {min(imports):.3f}, max {max(imports):.3f})")
    print(f"ratio one-case run / import torch: {run / floor:.2f}x (target <= {TARGET}x)")


if __name__ == "__main__":
    main()
