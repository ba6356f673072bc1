"""Time and peak memory of the production tier (docs/tiers.md), case by case.

For every production case: `conformance generate --tier production --select CASE` and
`conformance run --impl reference --tier production --select CASE --no-isolate`, each in a
process of its own, with its wall time and peak resident memory (from the kernel's rusage of
that process). Prints each against the aims of issue 12 (under 2 minutes on 2 cores, under
8 GB): a ratio below 1.0 meets the aim.

    python benchmarks/production_tier.py [--select PATTERN]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AIM_S, AIM_GB = 120.0, 8.0


def measure(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in GB, exit code) of `python -m v41_conformance ARGS`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "v41_conformance", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss / 1e6, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--select", default="")
    args = parser.parse_args()
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "v41_conformance",
            "list",
            "--tier",
            "production",
            *(["--select", args.select] if args.select else []),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    cases = listed.stdout.split()
    print(f"{os.cpu_count()} CPU(s); aims: generate and run each case in < {AIM_S:g} s, < {AIM_GB:g} GB")
    print(f"{'case':48s} {'generate s':>10s} {'x aim':>6s} {'GB':>5s} {'run s':>7s} {'x aim':>6s} {'GB':>5s}")
    for case in cases:
        gen_s, gen_gb, gen_rc = measure(["generate", "--tier", "production", "--select", case])
        run_s, run_gb, run_rc = measure(
            [
                "run",
                "--impl",
                "reference",
                "--tier",
                "production",
                "--select",
                case,
                "--no-isolate",
                "--report-dir",
                "reports/bench-production",
            ]
        )
        flags = "" if gen_rc == run_rc == 0 else f"  (exit {gen_rc}/{run_rc})"
        print(
            f"{case:48s} {gen_s:10.1f} {gen_s / AIM_S:6.2f} {gen_gb:5.2f} {run_s:7.1f} {run_s / AIM_S:6.2f} "
            f"{run_gb:5.2f}{flags}"
        )


if __name__ == "__main__":
    main()
