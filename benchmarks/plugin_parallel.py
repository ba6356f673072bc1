"""The pytest plugin over every small-tier case, `-n 2` side by side with a serial run.

Runs, alternately and `--repeats` times each, in one throwaway folder (no conftest, no
conformance.yaml: the packaged or checkout store):

    python -m pytest -q -p no:cacheprovider --conformance-impl reference           (serial)
    python -m pytest -q -p no:cacheprovider --conformance-impl reference -n 2      (two xdist workers)

and prints every wall time, the medians and their ratio (target: `-n 2` at most 0.9x the serial
time on 2 cores), with the load average before and after, since other processes on the machine
change both numbers.

    python benchmarks/plugin_parallel.py [--repeats 3] [--workers 2] [--select PATTERN] [--no-isolate]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def timed(args: list[str], cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--select", default=None)
    parser.add_argument("--no-isolate", action="store_true")
    args = parser.parse_args()
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--conformance-impl", "reference"]
    if args.select:
        base += ["--conformance-select", args.select]
    if args.no_isolate:
        base.append("--conformance-no-isolate")
    runs = {"serial": base, f"-n {args.workers}": base + ["-n", str(args.workers)]}
    walls: dict[str, list[float]] = {name: [] for name in runs}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="plugin-parallel-") as folder:
        timed(base + ["--collect-only"], folder)  # warm the file cache and the rebuilt-input cache alike
        for repeat in range(args.repeats):
            for name, command in runs.items():
                walls[name].append(timed(command, folder))
                print(f"repeat {repeat + 1}: {name:8s} {walls[name][-1]:6.2f} s", flush=True)
    load_after = os.getloadavg()
    medians = {name: statistics.median(values) for name, values in walls.items()}
    parallel = f"-n {args.workers}"
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} cores)")
    for name, value in medians.items():
        print(f"median {name:8s} {value:6.2f} s  (runs: {', '.join(f'{w:.2f}' for w in walls[name])})")
    print(f"ratio {parallel} / serial: {medians[parallel] / medians['serial']:.2f}  (target <= 0.90)")


if __name__ == "__main__":
    main()
