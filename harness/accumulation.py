"""The accumulator model: how far a GPU's own fp8 GEMM accumulation may move an output, per element
(docs/verdicts.md, "GPU arithmetic").

An fp8 tensor core sums a block of K products in an accumulator of limited width (DeepSeek-V3's
report: about 14 significant bits on an H800), and DeepGEMM promotes each block's sum into an fp32
accumulator on the CUDA cores. Each addition inside a block may lose u of the running sum's magnitude
(u = 2^(1 - bits)); the running sums of a block are at most the magnitude of its terms, and the
losses of its 32 additions add up like a random walk (their signs follow the partial sums'): about
sqrt(32) u times that magnitude. The fp32 additions across blocks add next to nothing. So an
output's accumulation allowance is u x A, where A is sqrt(32) times the sum over K of |a_k b_k| (the
magnitude of every term, scaled as the GEMM scales it), carried through what follows the GEMM before
the next decision: RMSNorm (`through_rms_norm`), RoPE (`through_rope`). Measured: a sequential
14-bit truncating accumulator reaches 4.3 x u x sum|a b| in its worst element (of thousands of fresh
cases), one aligning the products to the block's largest exponent 1.2; accumulators that are
narrower than the hardware's reach 20 to 110 (block sums in bf16, no promotion across K). A dot product that cancels has a
small output and a large A: its relative precision is legitimately low, which a flat ulp count
cannot know. The reference's own GEMMs are exact (float64 sums of exact products, one rounding), so
the allowance is the hardware's, not the reference's.

Pure functions of tensors; float64 magnitudes (every product of e4m3 values is exact there).
"""

from __future__ import annotations

import torch

from .reference import numerics as nx
from .reference.fp8_linear import BLOCK, Fp8Weight, e4m3_value

FP8_ACCUMULATOR_BITS = 14  # an H800's fp8 tensor core (DeepSeek-V3 technical report, §3.3.2)
WALK = BLOCK ** 0.5  # the losses of a block's additions, as a random walk over its BLOCK additions
ACC = ".acc"  # context suffix: `<output>.acc` holds A, the magnitude of the fp8 GEMM terms behind each element


def unit(bits: float) -> float:
    """u: the relative error of one accumulator of `bits` significant bits (truncating: 2^(1 - bits))."""
    return 2.0 ** (1 - bits)


def fp8_terms(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """float64 [..., N]: A = WALK x sum over K of |qa_k * qw_k| * sa * sw, from the magnitude of the
    terms the block-scaled fp8 GEMM of act_quant(x) and `weight` sums into each output (x bf16 [..., K])."""
    n, k = weight.shape
    q = nx.fp8_qdq_ue8m0(x, BLOCK)
    nb = k // BLOCK
    qa = (e4m3_value(q.codes).abs().reshape(-1, nb, BLOCK).double() * q.scales.reshape(-1, nb, 1).double()).reshape(-1, k)
    sw = nx.e8m0_value(weight.scale_bytes).double().repeat_interleave(BLOCK, dim=0)[:n]  # [N, K/32]
    qw = e4m3_value(weight.codes).abs().double() * sw.repeat_interleave(BLOCK, dim=1)
    return WALK * (qa @ qw.T).reshape(*x.shape[:-1], n)


def gemm_terms(x: torch.Tensor, weight) -> torch.Tensor | None:
    """The fp8 GEMM's term magnitudes for an fp8 weight; None for a bf16 or fp32 one (accumulated in
    fp32 on every device: the flat allowances cover its order)."""
    return fp8_terms(x, weight) if isinstance(weight, Fp8Weight) else None


def through_rms_norm(y: torch.Tensor, weight: torch.Tensor, terms: torch.Tensor, eps: float) -> torch.Tensor:
    """A carried through RMSNorm(y) = weight * y / rms(y): a change d of y moves output i by
    |weight_i| d_i / rms plus |out_i| times the relative change of rms, sum_j |y_j| d_j / (n rms^2)."""
    yd = y.double()
    ms = yd.square().mean(-1, keepdim=True) + eps
    rms = ms.sqrt()
    out = weight.double() * yd / rms
    return weight.double().abs() * terms / rms + out.abs() * (yd.abs() * terms).mean(-1, keepdim=True) / ms


def through_rope(terms: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """A carried through RoPE on the last `rope_dim` channels (interleaved pairs): each rotated
    channel moves by at most the sum of its pair's."""
    if not rope_dim:
        return terms
    out = terms.clone()
    tail = terms[..., -rope_dim:].unflatten(-1, (-1, 2))
    out[..., -rope_dim:] = tail.sum(-1, keepdim=True).expand_as(tail).flatten(-2)
    return out


# The share of differing elements an fp8 GEMM's accumulation can flip is an expectation; twice it keeps a
# correct kernel clear of its own spread.
FLIP_MARGIN = 2.0


def accumulation_allowance(name: str, expected: torch.Tensor, bits: float,
                           context: dict[str, torch.Tensor]) -> torch.Tensor | float:
    """u x A where the comparator's context holds A (`<name>.acc`), else 0 (float64, expected's shape)."""
    terms = context.get(name + ACC)
    if terms is None or not bool((terms > 0).any()):
        return 0.0
    return unit(bits) * terms.double().reshape(expected.shape)


def expected_flips(allowance, ulp: torch.Tensor, finite: torch.Tensor | None) -> tuple[float, float]:
    """How many roundings an error of up to `allowance` may flip, and the squared error they carry: per
    element, the chance that it carries the value across a rounding midpoint, min(1, 2 allowance / ulp),
    each flip one ulp."""
    if isinstance(allowance, float):
        return 0.0, 0.0
    chance = (2 * allowance / ulp).clamp(max=1.0)
    if finite is not None:
        chance = torch.where(finite, chance, 0.0)
    return float(chance.sum()), float((chance * ulp.double().square()).sum())
