"""What the installed pytest plugin costs a pytest run that has nothing to do with conformance.

Runs, alternately and `--repeats` times each, in one throwaway folder holding a trivial test file:

    python -m pytest -q -p no:cacheprovider                          (the plugin loaded, unused)
    python -m pytest -q -p no:cacheprovider -p no:conformance        (the plugin not loaded)

and prints the medians and their ratio (target: at most 1.25x), with the load average. The plugin
must import nothing heavy (no torch) until a --conformance-* option asks for the cases.

    python benchmarks/plugin_cost.py [--repeats 15]
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
    if proc.returncode != 0 or "1 passed" not in proc.stdout:
        sys.exit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    runs = {"with": base, "without": base + ["-p", "no:conformance"]}
    walls: dict[str, list[float]] = {name: [] for name in runs}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="plugin-cost-") as folder:
        with open(os.path.join(folder, "test_trivial.py"), "w") as fh:
            fh.write("def test_trivial():\n    assert 1 + 1 == 2\n")
        timed(base, folder)  # warm the file cache
        for _ in range(args.repeats):
            for name, command in runs.items():
                walls[name].append(timed(command, folder))
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, v41_conformance.pytest_cases; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
    )
    medians = {name: statistics.median(values) for name, values in walls.items()}
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"median with the plugin    {medians['with']:.3f} s  (min {min(walls['with']):.3f})")
    print(f"median -p no:conformance  {medians['without']:.3f} s  (min {min(walls['without']):.3f})")
    print(f"importing the plugin imports torch: {probe.stdout.strip()}")
    print(f"ratio: {medians['with'] / medians['without']:.2f}  (target <= 1.25)")


if __name__ == "__main__":
    main()
