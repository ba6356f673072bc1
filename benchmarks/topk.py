"""Throughput of the torch CPU top-k emulation against torch.topk, side by side in one run.

Rows are tie-heavy like the indexer's: bf16-quantised Gaussian scores with a third of them
-inf (masked) and a clump of exact zeros (ReLU'd positions). For each production-like width
(n = 4096, 16384, 65536; k = 512 and 2048 where k <= n; sorted False as at M:579 and True as at
M:607) it prints the best of a few repeats per row, as time and elements per second, for
`harness.reference.topk.torch_cpu_topk` (key building included) and for torch.topk with one
thread, plus their ratio. Prints only; no assertions on time. Runs in a few seconds:

    .venv/bin/python benchmarks/topk.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from harness.reference.topk import torch_cpu_topk, uses_partial_sort

CASES = [(4096, 512), (4096, 2048), (16384, 512), (16384, 2048), (65536, 512), (65536, 2048)]


def tie_heavy_row(n: int, seed: int) -> torch.Tensor:
    """bf16 [n]: Gaussian scores, ~1/3 -inf, ~1/8 exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(torch.bfloat16)  # [n]
    x[torch.rand(n, generator=g) < 1 / 3] = -torch.inf
    x[torch.rand(n, generator=g) < 1 / 8] = 0.0
    return x


def best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs per case")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread; best of {args.repeats}; per row")
    print(f"{'n':>6} {'k':>5} {'sorted':>6} {'branch':>7} | {'emulation':>10} {'Melem/s':>8} | "
          f"{'torch':>9} {'Melem/s':>8} | {'ratio':>6}")
    for n, k in CASES:
        if k > n:
            continue
        x = tie_heavy_row(n, seed=n + k)
        for sorted_ in (False, True):
            emu = best_of(lambda: torch_cpu_topk(x, k, sorted=sorted_), args.repeats)
            ref = best_of(lambda: torch.topk(x, k, sorted=sorted_), args.repeats)
            branch = "partial" if uses_partial_sort(n, k) else "nth"
            print(f"{n:>6} {k:>5} {str(sorted_):>6} {branch:>7} | "
                  f"{emu * 1e3:>8.2f}ms {n / emu / 1e6:>8.2f} | "
                  f"{ref * 1e6:>7.1f}us {n / ref / 1e6:>8.1f} | {emu / ref:>5.0f}x")


if __name__ == "__main__":
    main()
