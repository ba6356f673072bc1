"""Fast by default (issue 15): each figure a ratio of two runs measured side by side, here, now.

  1. full reference run, default isolation / --no-isolate                  (target <= 1.15)
  2. -n 2 / -n 0 on the full run, and -n auto / -n 0 for several --select   (<= 0.9; auto <= 1.0)
  3. a child restart after a crash, in seconds                               (<= 0.2 s)
  4. reference top-k / torch.topk on production rows, where the probe passes (<= 1.5), and the
     emulation's speed on those rows

Runs alternate (A, B, A, B, ...) and the best of `--repeats` is kept, so a burst of load hits
both sides. Wall times of the real CLI in fresh processes, as a user runs it. Prints only.

    .venv/bin/python benchmarks/fast_by_default.py [--repeats 2] [--quick]
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "impls"), str(ROOT / "benchmarks")]

SELECTS = ["quant.e2m1/*", "quant.*", "sparse_attn/*", "linear.fp8/*", "compressor/*", "attention/*", ""]


def wall(args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as report:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "v41_conformance", "run", "--impl", "reference", "--report-dir", report, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"conformance run {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return elapsed


def side_by_side(a: list[str], b: list[str], repeats: int) -> tuple[float, float]:
    best_a = best_b = float("inf")
    for _ in range(repeats):
        best_a = min(best_a, wall(a))
        best_b = min(best_b, wall(b))
    return best_a, best_b


def select_args(pattern: str) -> list[str]:
    return ["--select", pattern] if pattern else []


def restart_after_crash(repeats: int = 5) -> tuple[float, float, float]:
    """(case in a warm child, the same case right after a crash, the difference) in seconds."""
    from v41_conformance.config import load_config
    from v41_conformance.pool import executor_for
    from v41_conformance.rundir import RunDir

    config = load_config(ROOT / "conformance.yaml")
    with tempfile.TemporaryDirectory() as folder, RunDir(Path(folder)) as run_dir:
        run = {
            "token": "bench",
            "run_dir": str(run_dir.path),
            "config": str(config.path),
            "tier": "small",
            "goldens_dir": str(config.goldens),
            "cases_dir": str(config.cases),
            "device": "cpu",
            "timeout": 60,
            "isolate": True,
            "workers": 1,
            "prefetch": False,
            "impl": {
                "name": "segfaults",
                "kind": "python",
                "target": f"{ROOT}/tests/impls/wrong.py:Segfaults",
                "root": str(ROOT),
                "conf": {},
            },
        }
        executor = executor_for(run)
        ok, crash = "norm.rms/latent-6x128", "norm.rms/latent-4x512"
        executor.run(ok)  # the first child, the fork server
        warm, after = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            assert executor.run(ok).status == "pass"
            warm.append(time.perf_counter() - start)
            assert executor.run(crash).status == "crash"
            start = time.perf_counter()
            assert executor.run(ok).status == "pass"
            after.append(time.perf_counter() - start)
        executor.close()
    w, a = statistics.median(warm), statistics.median(after)
    return w, a, a - w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="skip the per-select -n auto table")
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} cores; best of {args.repeats}, alternating; wall seconds of `conformance run --impl reference`"
    )

    iso, plain = side_by_side([], ["--no-isolate"], args.repeats)
    print(f"1. full run, isolated {iso:.2f} s / --no-isolate {plain:.2f} s = {iso / plain:.2f} (target <= 1.15)")

    two, zero = side_by_side(["-n", "2"], ["-n", "0"], args.repeats)
    print(f"2. full run, -n 2 {two:.2f} s / -n 0 {zero:.2f} s = {two / zero:.2f} (target <= 0.9)")
    if not args.quick:
        worst = 0.0
        for pattern in SELECTS:
            auto, serial = side_by_side(
                ["-n", "auto", *select_args(pattern)], ["-n", "0", *select_args(pattern)], args.repeats
            )
            worst = max(worst, auto / serial)
            print(
                f"   --select {pattern or '(all)':<14} -n auto {auto:.2f} s / -n 0 {serial:.2f} s = {auto / serial:.2f}"
            )
        print(f"   worst -n auto / -n 0: {worst:.2f} (target <= 1.0; within noise of 1.0 where auto chose serial)")

    warm, after, restart = restart_after_crash()
    print(
        f"3. child restart after a crash: a case in a warm child {warm * 1e3:.0f} ms, right after a crash "
        f"{after * 1e3:.0f} ms: restart {restart:.3f} s (target <= 0.2 s)"
    )

    import topk as topk_bench

    topk_bench.production_summary()


if __name__ == "__main__":
    main()
