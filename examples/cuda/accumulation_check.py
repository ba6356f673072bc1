"""gpu_check step: this GPU's bf16 GEMM accumulation against the harness's allowance for it.

The ratio-1 compressor's latent is a bf16 GEMM over K = dim (5120 at production) followed by RMSNorm;
an element that cancels has a small value and a large sum of |terms|, and every GPU moves it by a few
fp32 units of that sum. harness/accumulation.py allows BF16_GEMM_ALLOWANCE x sum_k |x_k w_k| per
element (22.6 fp32 units, 2^-24; the first H200 runs measured 8.6 in the worst of 2,097,152). This runs
torch's own bf16 GEMM (cuBLAS, what upstream's F.linear calls) on random rows at that shape, measures
each element's distance from the exact product sum beyond its final rounding, in fp32 units of its
sum of |terms|, and exits 0 when the worst is within the allowance.
"""

from __future__ import annotations

import sys

import torch

from v41_conformance.accumulation import BF16_GEMM_ALLOWANCE
from v41_conformance.ulps import ulp_of

UNIT = 2.0**-24  # one fp32 unit of a term magnitude


def measure(m: int, k: int, n: int, seed: int) -> tuple[float, float, int]:
    """(worst, 99.99th percentile) accumulation error in fp32 units of sum|terms|, and the elements."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    exact = x.double() @ w.double().T
    terms = x.double().abs() @ w.double().abs().T
    y = torch.nn.functional.linear(x.cuda(), w.cuda()).cpu().double()  # bf16 out, as upstream's Linear
    beyond = ((y - exact).abs() - ulp_of(y, torch.bfloat16) / 2).clamp_min(0.0)  # past its own rounding
    units = (beyond / (UNIT * terms)).flatten()
    return float(units.max()), float(units.kthvalue(max(1, int(0.9999 * units.numel()))).values), units.numel()


def main() -> int:
    if not torch.cuda.is_available():
        print("accumulation_check: no CUDA device", file=sys.stderr)
        return 2
    allowed = BF16_GEMM_ALLOWANCE / UNIT
    worst_all = 0.0
    for m, k, n in [(1030, 5120, 512), (4096, 5120, 512), (1030, 4096, 1024), (1030, 5120, 32)]:
        worst, p9999, count = measure(m, k, n, seed=m + k + n)
        worst_all = max(worst_all, worst)
        print(
            f"bf16 GEMM {m}x{k}x{n}: worst {worst:.2f}, 99.99% {p9999:.2f} fp32 units of sum|terms| ({count} elements)"
        )
    print(f"allowed {allowed:.2f}: worst uses {worst_all / allowed:.2f} of it")
    return 0 if worst_all <= allowed else 1


if __name__ == "__main__":
    sys.exit(main())
