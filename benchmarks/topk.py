"""Throughput of the torch CPU top-k emulation and of the dispatcher, against torch.topk.

Rows are tie-heavy like the indexer's: bf16-quantised Gaussian scores with a third of them
-inf (masked) and a clump of exact zeros (ReLU'd positions); the production widths also run on
plain float32 Gaussian rows (no ties). Three sections, each the best of a few repeats per row,
torch with one thread:

1. the start-up probe (`v41_conformance.reference.topk.torch_topk_matches`): its verdict and how
   long it took, the first time, in this fresh process;
2. the emulation (`emulate_topk`, key building included) against torch.topk, per width
   (n = 2050, 4096, 16384, 65536; k = 512 and 2048 where k <= n; sorted False as at M:579 and
   True as at M:607): time, elements per second and their ratio;
3. the dispatcher (`torch_cpu_topk`, the top-k the reference uses) on the production rows
   (16384/512, 65536/512, 2050/2048), as a ratio to torch.topk: about 1 where the probe
   passed (the target is <= 1.5), the emulation's ratio where it did not; with the
   emulation's own time on those rows. `production_summary` prints the probe and this section
   alone (benchmarks/fast_by_default.py calls it).

Prints only; no assertions on time. Runs in a few seconds:

    .venv/bin/python benchmarks/topk.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from v41_conformance.reference.topk import emulate_topk, topk_mode, torch_cpu_topk, uses_partial_sort
from v41_conformance.reference.topk import torch_topk_matches

PRODUCTION = [(16384, 512), (65536, 512), (2050, 2048)]
CASES = [(2050, 2048), (4096, 512), (4096, 2048), (16384, 512), (16384, 2048), (65536, 512), (65536, 2048)]
DISPATCH_TARGET = 1.5  # dispatcher time / torch.topk time where the probe passed


def tie_heavy_row(n: int, seed: int) -> torch.Tensor:
    """bf16 [n]: Gaussian scores, ~1/3 -inf, ~1/8 exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(torch.bfloat16)  # [n]
    x[torch.rand(n, generator=g) < 1 / 3] = -torch.inf
    x[torch.rand(n, generator=g) < 1 / 8] = 0.0
    return x


def plain_row(n: int, seed: int) -> torch.Tensor:
    """float32 [n]: Gaussian scores, no ties."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def rows() -> list[tuple[str, int, int, torch.Tensor]]:
    out = [("tie", n, k, tie_heavy_row(n, seed=n + k)) for n, k in CASES]
    return out + [("plain", n, k, plain_row(n, seed=n + k)) for n, k in PRODUCTION]


def best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def report_probe() -> bool:
    t0 = time.perf_counter()
    passed = torch_topk_matches()  # the first call in this process runs the probe
    took = time.perf_counter() - t0
    print(
        f"probe: {'passed' if passed else 'FAILED'} in {took * 1e3:.1f} ms "
        f"({'torch.topk' if passed else 'the emulation'} serves the probed CPU dtypes; "
        f"CONFORMANCE_TOPK={topk_mode()})"
    )
    return passed


def report_emulation(cases: list[tuple[str, int, int, torch.Tensor]], repeats: int) -> None:
    print(f"\nemulation (emulate_topk) vs torch.topk; best of {repeats}; per row")
    print(
        f"{'row':>5} {'n':>6} {'k':>5} {'sorted':>6} {'branch':>7} | {'emulation':>10} {'Melem/s':>8} | "
        f"{'torch':>9} {'Melem/s':>8} | {'ratio':>6}"
    )
    for kind, n, k, x in cases:
        for sorted_ in (False, True):
            emu = best_of(lambda: emulate_topk(x, k, sorted=sorted_), repeats)
            ref = best_of(lambda: torch.topk(x, k, sorted=sorted_), repeats)
            branch = "partial" if uses_partial_sort(n, k) else "nth"
            print(
                f"{kind:>5} {n:>6} {k:>5} {str(sorted_):>6} {branch:>7} | "
                f"{emu * 1e3:>8.3f}ms {n / emu / 1e6:>8.2f} | "
                f"{ref * 1e6:>7.1f}us {n / ref / 1e6:>8.1f} | {emu / ref:>5.0f}x"
            )


def report_production(repeats: int, passed: bool) -> None:
    """Dispatcher / torch.topk and the emulation's time on the production rows."""
    target = f"target <= {DISPATCH_TARGET}" if passed else "probe failed: the emulation serves these"
    print(f"\nreference top-k (torch_cpu_topk) / torch.topk on the production rows; best of {repeats}; {target}")
    print(
        f"{'row':>5} {'n':>6} {'k':>5} {'sorted':>6} | {'dispatcher':>10} {'torch':>9} {'ratio':>6} | "
        f"{'emulation':>10} {'Melem/s':>8}"
    )
    for kind, n, k, x in rows():
        if (n, k) not in PRODUCTION:
            continue
        for sorted_ in (False, True):
            used = best_of(lambda: torch_cpu_topk(x, k, sorted=sorted_), repeats)
            ref = best_of(lambda: torch.topk(x, k, sorted=sorted_), repeats)
            emu = best_of(lambda: emulate_topk(x, k, sorted=sorted_), max(3, repeats // 4))
            print(
                f"{kind:>5} {n:>6} {k:>5} {str(sorted_):>6} | {used * 1e6:>8.1f}us {ref * 1e6:>7.1f}us "
                f"{used / ref:>6.2f} | {emu * 1e3:>8.3f}ms {n / emu / 1e6:>8.2f}"
            )


def production_summary(repeats: int = 20) -> None:
    """The probe's verdict and cost, then `report_production` (used by fast_by_default.py)."""
    torch.set_num_threads(1)
    report_production(repeats, report_probe())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs per case")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread")
    passed = report_probe()
    report_emulation(rows(), args.repeats)
    report_production(max(args.repeats, 20), passed)


if __name__ == "__main__":
    main()
