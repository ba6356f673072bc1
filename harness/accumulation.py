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
narrower than the hardware's reach 20 to 110 (block sums in bf16, no promotion across K). A dot
product that cancels has a small output and a large A: its relative precision is legitimately low,
which a flat ulp count cannot know. The reference's own GEMMs are exact (float64 sums of exact
products, one rounding), so the allowance is the hardware's, not the reference's.

A bounds one element; it does not bound the error of the whole output. Each block's losses are
independent of the other blocks', so the error an element typically carries is u x R, where R adds
the blocks' magnitudes in quadrature (`Terms.rms`): at K = 32 R equals A, at K = 8192 (wo_b) it is
about A / 16. The comparator subtracts only the arguments' allowance before its rel L2 bound and
widens that bound by the energy u x R predicts (`expected_spread`), so a bug that moves every element
a little cannot hide under a long GEMM's elementwise allowance. Measured on the small tier's
linear.fp8 cases: y scaled by 1 + 2^-6 or 1 + 2^-7 fails every case (rel L2 0.0155 and 0.0077
against allowances of 0.0063 to 0.0077); 1 + 2^-8 passes (0.0057); the 14-bit accumulator passes
every case at rel L2 0.0004 to 0.0021. The model is conservative: its typical error is 5 to 40 times
the measured one, so it expects nearly every element of a long fp8 GEMM to change its bf16 rounding.

Pure functions of tensors; float64 magnitudes (every product of e4m3 values is exact there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, NamedTuple

import torch

from .reference import numerics as nx
from .reference.fp8_linear import BLOCK, Fp8Weight, derived, e4m3_value, weight_blocks

FP8_ACCUMULATOR_BITS = 14  # an H800's fp8 tensor core (DeepSeek-V3 technical report, §3.3.2)
WALK = BLOCK**0.5  # the losses of a block's additions, as a random walk over its BLOCK additions
# A bf16 GEMM on tensor cores multiplies exactly and accumulates in an fp32-wide adder that aligns each
# group of products to the largest and truncates (Fasi et al., PeerJ CS 2021), in whatever K order the
# library picks; CPU libraries round to nearest. An element that cancels (a small value, a large sum of
# |terms|) moves by a few fp32 units (2^-24) of its sum of |terms|, far past the flat allowances the CPU
# orders were calibrated on. The fp8 model's form with an fp32 accumulator, u x WALK = 11.3 units, twice:
# 22.6. Measured with torch's own bf16 GEMM on an H200 (cuBLAS; examples/cuda/accumulation_check.py,
# K 4096-5120): the worst element 4.4 units of 527,360, 6.2 of 1,054,720, 8.6 of 2,097,152 (99.99% of
# them within 2.5): the worst grows with the output's size, as a truncating adder's one-signed losses
# do, and the factor of two keeps outputs four times the production latent's clear. The CPU's (oneDNN)
# worst at that shape: 0.1. First seen as the production attention case's ratio-1 compressor `latent`
# (K = 5120), where the flat 2^-20 of max|expected| let two elements of 527,360 through (3.3 units).
FP32_ACCUMULATOR_BITS = 24
BF16_GEMM_ALLOWANCE = 2 * 2.0 ** (1 - FP32_ACCUMULATOR_BITS) * WALK
ACC = ".acc"  # context suffix: `<output>.acc` holds A, the magnitude of the fp8 GEMM terms behind each element
ACC_RMS = ".acc_rms"  # `<output>.acc_rms`: R, the blocks' magnitudes summed as independent errors


class Terms(NamedTuple):
    """The magnitudes behind each output of an fp8 GEMM (float64, the output's shape), both scaled by
    WALK: `peak` sums the blocks' magnitudes (A: what one element's error may reach); `rms` adds them
    in quadrature (R: the size of a typical element's error, the blocks' losses being independent, each
    following the sign of its block's sum). At K = 32 they are one; at K = 8192 (wo_b) R is about
    A / 16: the elementwise bound takes A, the global error (rel L2) takes R, so a bug that moves every
    element a little (a scale off by 2^-6) cannot hide in the elementwise allowance of a long GEMM."""

    peak: torch.Tensor
    rms: torch.Tensor

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Terms":
        return Terms(fn(self.peak), fn(self.rms))

    def context(self, name: str) -> dict[str, torch.Tensor]:
        """The comparator's context entries for output `name`."""
        return {name + ACC: self.peak, name + ACC_RMS: self.rms}


def unit(bits: float) -> float:
    """u: the relative error of one accumulator of `bits` significant bits (truncating: 2^(1 - bits))."""
    return 2.0 ** (1 - bits)


def fp8_terms(x: torch.Tensor, weight: Fp8Weight, elems: int = 1 << 22) -> Terms:
    """The magnitudes of the terms the block-scaled fp8 GEMM of act_quant(x) and `weight` sums into each
    output (x bf16 [..., K]; Terms of [..., N]): per block b of 32 along K, T_b = sum of |qa_k * qw_k| *
    sa * sw; A = WALK x sum_b T_b, R = WALK x sqrt(sum_b T_b^2). `elems` bounds the rows taken at once
    (rows x N fp32 values per block).

    A is one float64 GEMM of |qa| and |qw|: the sum over blocks of the blocks' sums is the sum over K
    (every product of e4m3 values times powers of two is exact in float64, and so is every block's sum).
    R needs each block's sum on its own; it sets only the size of the error a correct kernel is expected
    to carry (`expected_spread`: a share of rounding flips and an rms error, both statistics over the
    whole output, with a margin of FLIP_MARGIN), so fp32 is plenty there: its products are exact, its
    block sums and their squares' sum within about 1e-7 of the exact ones (2e-5 at worst at K = 8192),
    where the model itself is 5 to 40 times conservative (module docstring)."""
    n, k = weight.shape
    q = nx.fp8_qdq_ue8m0(x, BLOCK)
    nb = k // BLOCK
    qa = e4m3_value(q.codes).abs().reshape(-1, nb, BLOCK).double() * q.scales.reshape(-1, nb, 1).double()
    qw = weight_blocks(weight)  # [K/32, 32, N]: the values by block, exact
    m = qa.shape[0]
    magnitudes = derived(weight, "magnitudes", lambda: qw.reshape(k, n).abs().double())  # [K, N]
    peak = torch.mm(qa.reshape(m, k), magnitudes)
    squares = _block_squares(qa, qw, torch.float32, elems)
    if not bool(torch.isfinite(squares).all()):  # past fp32's range (or a NaN): as the float64 values say
        squares = _block_squares(qa, qw, torch.float64, elems)
    shape = (*x.shape[:-1], n)
    return Terms(WALK * peak.reshape(shape), WALK * squares.double().sqrt_().reshape(shape))


def _block_squares(qa: torch.Tensor, qw: torch.Tensor, dtype: torch.dtype, elems: int) -> torch.Tensor:
    """sum_b T_b^2 in `dtype` ([M, N]): qa float64 |values| [M, K/32, 32], qw values by block [K/32, 32, N]."""
    m, n = qa.shape[0], qw.shape[-1]
    by_block = qa.to(dtype).transpose(0, 1).contiguous()  # [K/32, M, 32]
    squares = torch.zeros(m, n, dtype=dtype)
    rows = max(1, elems // max(n, 1))
    block = torch.empty(min(rows, m), n, dtype=dtype)
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        t, acc = block[: r1 - r0], squares[r0:r1]
        for kb in range(qw.shape[0]):
            torch.mm(by_block[kb, r0:r1], qw[kb].abs().to(dtype), out=t)  # T_b
            acc.addcmul_(t, t)
    return squares


def gemm_terms(x: torch.Tensor, weight) -> Terms | None:
    """The fp8 GEMM's term magnitudes for an fp8 weight; None for a bf16 or fp32 one (accumulated in
    fp32 on every device: the flat allowances cover its order)."""
    return fp8_terms(x, weight) if isinstance(weight, Fp8Weight) else None


def through_rms_norm(y: torch.Tensor, weight: torch.Tensor, terms: Terms, eps: float) -> Terms:
    """Terms carried through RMSNorm(y) = weight * y / rms(y): a change d of y moves output i by
    |weight_i| d_i / rms plus |out_i| times the relative change of rms, sum_j y_j d_j / (n rms^2)
    (for A, |y_j| d_j summed; for R, independent d_j: (y_j d_j)^2 summed under a root)."""
    yd = y.double()
    ms = yd.square().mean(-1, keepdim=True) + eps
    rms = ms.sqrt()
    out = weight.double() * yd / rms
    n = yd.shape[-1]
    peak_shift = (yd.abs() * terms.peak).sum(-1, keepdim=True) / (n * ms)
    rms_shift = (yd * terms.rms).square().sum(-1, keepdim=True).sqrt() / (n * ms)
    w = weight.double().abs()
    return Terms(w * terms.peak / rms + out.abs() * peak_shift, w * terms.rms / rms + out.abs() * rms_shift)


def through_rope(terms: Terms, rope_dim: int) -> Terms:
    """Terms carried through RoPE on the last `rope_dim` channels (interleaved pairs): each rotated
    channel moves by at most the sum of its pair's (A), by their root sum of squares (R)."""
    if not rope_dim:
        return terms

    def rotated(t: torch.Tensor, combine: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        out = t.clone()
        tail = t[..., -rope_dim:].unflatten(-1, (-1, 2))
        out[..., -rope_dim:] = combine(tail).expand_as(tail).flatten(-2)
        return out

    return Terms(
        rotated(terms.peak, lambda p: p.sum(-1, keepdim=True)),
        rotated(terms.rms, lambda p: p.square().sum(-1, keepdim=True).sqrt()),
    )


# The error a correct kernel's accumulation carries is an expectation (the share of differing elements,
# the global error); twice it keeps a correct kernel clear of its own spread.
FLIP_MARGIN = 2.0


def accumulation_allowance(
    name: str, expected: torch.Tensor, bits: float, context: Mapping[str, torch.Tensor]
) -> torch.Tensor | float:
    """u x A where the comparator's context holds A (`<name>.acc`), else 0 (float64, expected's shape):
    what one element's accumulation error may reach."""
    terms = context.get(name + ACC)
    if terms is None or not bool((terms > 0).any()):
        return 0.0
    return unit(bits) * terms.double().reshape(expected.shape)


class Spread(NamedTuple):
    """What a correct kernel's accumulation does to an output as a whole: `flips`, the number of
    elements it is expected to move off the reference's rounding; `energy`, the squared error it is
    expected to carry (summed over the elements)."""

    flips: float
    energy: float


def expected_spread(
    name: str,
    expected: torch.Tensor,
    bits: float,
    context: Mapping[str, torch.Tensor],
    ulp: torch.Tensor,
    finite: torch.Tensor | None,
) -> Spread | None:
    """From R (`<name>.acc_rms`, else A): per element, a typical error e = u x R; the chance that it
    carries the value across a rounding midpoint, p = min(1, 2 e / ulp); its expected squared error,
    e^2 + p ulp^2. None where the context holds no magnitudes."""
    terms = context.get(name + ACC_RMS, context.get(name + ACC))
    if terms is None or not bool((terms > 0).any()):
        return None
    typical = unit(bits) * terms.double().reshape(expected.shape)
    ulp = ulp.double()
    chance = (2 * typical / ulp).clamp(max=1.0)
    energy = typical.square() + chance * ulp.square()
    if finite is not None:
        chance, energy = torch.where(finite, chance, 0.0), torch.where(finite, energy, 0.0)
    return Spread(float(chance.sum()), float(energy.sum()))
