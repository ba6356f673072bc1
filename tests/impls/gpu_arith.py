"""CPU models of the arithmetic GPU kernels use, and the gates and mutants built from them on UpstreamTorch.

Each model below reproduces, bit for bit and deterministically, one way a GPU kernel rounds: what
the hardware does, where the fact comes from, and what the model simplifies are in its docstring.
The gates (`GATES`) are correct implementations as real kernels compute them: `UpstreamTorch` with
one or more `upstream_ops` functions swapped for a model for the duration of a call, so every gate
returns exactly the intermediates UpstreamTorch returns and the chain judges each stage given its
own inputs; a component a model does not reach runs as UpstreamTorch runs it. The mutants
(`MUTANTS`) are real bugs next to those models, each with the stage that must hold it.

Run one: `conformance run --impl tests/impls/gpu_arith.py:Fp8Tc14 --no-isolate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

import upstream_attention as ua
import upstream_ops as up
from gate_upstream import UpstreamTorch
from patching import patched

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
LOG2E_F32 = torch.tensor(math.log2(math.e), dtype=F32)  # log2(e) as a kernel holds it: one fp32 constant
M_INIT = up.ATTN_MAX_INIT
TC_BITS = 14  # significant bits an H800 fp8 tensor core keeps while it accumulates (DeepSeek-V3 report, §3.3.2)
FP32_TINY = 2.0**-126  # smallest normal fp32: .ftz instructions flush anything below to zero
# Elements of one tile of a GEMM model's running sums: torch runs an elementwise op of at most 32768
# elements on one thread, in cache; larger ones are split across threads, whose synchronisation per
# op dominates these long loops of small ops (30x slower on a busy machine). Speed only.
_TILE_ELEMS = 1 << 15


# --- bits ---------------------------------------------------------------------------------------


def truncate_significant(x: torch.Tensor, bits: int) -> torch.Tensor:
    """float64 `x` rounded toward zero to `bits` significant bits, by clearing the low fraction bits
    of each IEEE double (sign-magnitude: clearing bits moves every value toward zero; 0 stays 0)."""
    if x.dtype != F64:
        raise ValueError(f"truncate_significant works on float64 values, got {x.dtype}")
    keep = -(1 << (52 - (bits - 1)))  # sign, exponent and bits - 1 fraction bits
    return (x.contiguous().view(torch.int64) & keep).view(F64)


def _mix(bits: torch.Tensor) -> torch.Tensor:
    """A deterministic pseudo-random int64 in [0, 2^16) from int32 bit patterns (multiplicative hash)."""
    h = (bits.to(torch.int64) & 0xFFFFFFFF) * 0x9E3779B1
    return (h >> 16) & 0xFFFF


def step_ulps(y: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """fp32 `y` moved by `steps` (int) units in the last place, for positive normal y; anything else
    (0, subnormal, inf, NaN) is returned as it is."""
    moved = (y.contiguous().view(torch.int32) + steps.to(torch.int32)).view(F32)
    movable = torch.isfinite(y) & (y >= FP32_TINY)
    return torch.where(movable, moved, y)


def fp32_ulp(y: torch.Tensor) -> torch.Tensor:
    """float64 ulp of each positive normal fp32 value: 2^(exponent - 23)."""
    _, exponent = torch.frexp(y.double())
    return torch.ldexp(torch.ones_like(y, dtype=F64), exponent - 24)


# --- fp8 GEMM: block sums on a tensor core, promotion to fp32 ----------------------------------------


class Fp8Operands(NamedTuple):
    """An fp8 GEMM's operands as float64 values (all exact): qa [M, K] and qw [K, N] e4m3 values,
    sa [M, K/32] activation scales, sw [K/32, N] weight tile scales (powers of two)."""

    qa: torch.Tensor
    sa: torch.Tensor
    qw: torch.Tensor
    sw: torch.Tensor

    @property
    def blocks(self) -> int:
        return self.qa.shape[1] // up.FP8_BLOCK


def fp8_operands(q: up.Quantised, w_codes: torch.Tensor, w_scale_bytes: torch.Tensor) -> Fp8Operands:
    """The operands of upstream's fp8_gemm from act_quant's result and the checkpoint's weight."""
    n, k = w_codes.shape
    nb = k // up.FP8_BLOCK
    qa = q.codes.view(torch.float8_e4m3fn).double().reshape(-1, k)
    sa = (q.scale_bytes.to(torch.int32) << 23).view(F32).double().reshape(-1, nb)
    qw = w_codes.view(torch.float8_e4m3fn).double().T.contiguous()
    sw = (w_scale_bytes.to(torch.int32) << 23).view(F32).double().repeat_interleave(up.FP8_BLOCK, 0)[:n].T.contiguous()
    return Fp8Operands(qa, sa, qw, sw)


def block_sum_sequential(a: torch.Tensor, w: torch.Tensor, bits: int = TC_BITS) -> torch.Tensor:
    """One K block summed product by product in an accumulator of `bits` significant bits that
    truncates after every addition: s <- trunc(s + a_c * w_c), c in order. a [R, C], w [C, N]
    float64 (e4m3 values), -> float64 [R, N] (each value has at most `bits` significant bits).

    Hardware fact: DeepSeek-V3's report (§3.3.2, "Increasing Accumulation Precision") measured that
    the fp8 GEMM of an H800's tensor cores keeps about 14 significant bits while it accumulates. The
    product of two e4m3 values (4 significant bits each) is exact; it is the running sum that loses
    bits. Exact here: a product has 8 significant bits and an unscaled block spans at most 2^-18 to
    2^17.6, so each float64 addition is exact before the truncation."""
    s = torch.zeros(a.shape[0], w.shape[1], dtype=F64)
    bits_view = s.view(torch.int64)
    keep = -(1 << (52 - (bits - 1)))
    columns = a.T.contiguous().unsqueeze(-1)  # [C, R, 1]
    rows = w.contiguous().unsqueeze(1)  # [C, 1, N]
    for c in range(a.shape[1]):
        s.addcmul_(columns[c], rows[c])
        bits_view.bitwise_and_(keep)
    return s


def block_sum_aligned(a: torch.Tensor, w: torch.Tensor, bits: int = TC_BITS) -> torch.Tensor:
    """One K block as a tensor core adds it: every exact product aligned to the exponent e of the
    block's largest product and truncated toward zero at the bit 2^(e - bits + 1), so the largest
    keeps `bits` significant bits and what is shifted past the adder's width is lost; then the
    aligned products summed exactly. a [R, C], w [C, N] float64, -> float64 [R, N].

    Hardware fact: tensor cores add a group of products with one multi-operand adder after aligning
    their significands to the largest exponent, truncating what falls off the end (Fasi, Higham,
    Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021); for fp8 on an
    H800 the width is about 14 bits (DeepSeek-V3 report, §3.3.2). The model aligns all 32 products of
    a block (one wgmma k-step of 32 fp8 values) against a zero accumulator."""
    return aligned_sum(a[:, :, None] * w[None, :, :], bits)  # products [R, C, N], exact


def aligned_sum(terms: torch.Tensor, bits: int) -> torch.Tensor:
    """float64 terms [R, C, N] summed over C as a multi-operand adder sums them: each aligned to the largest
    one's exponent e and truncated toward zero at 2^(e - bits + 1), so the largest keeps `bits` significant
    bits; the aligned terms, integers of that unit, then summed exactly. -> [R, N]."""
    largest = terms.abs().amax(1)  # [R, N]
    exponent = (largest.view(torch.int64) >> 52) - 1023  # floor(log2) of a normal double
    exponent = torch.where(largest > 0, exponent, torch.zeros_like(exponent))
    unit = ((exponent - (bits - 1) + 1023) << 52).view(F64)  # 2^(exponent - bits + 1): the last bit kept
    return torch.trunc(terms / unit[:, None, :]).sum(1) * unit


def _tiles(m: int, n: int, per_element: int = 1):
    """(rows, cols) slices of an [m, n] output whose tiles hold at most _TILE_ELEMS / per_element elements."""
    budget = max(1, _TILE_ELEMS // per_element)
    cols = min(n, budget) if n else 1
    rows = max(1, budget // max(1, cols))
    for r0 in range(0, m, rows):
        for c0 in range(0, max(n, 1), cols):
            yield slice(r0, min(m, r0 + rows)), slice(c0, min(n, c0 + cols))


def fp8_promoted(block_sum: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """The accumulate step of an fp8 GEMM that promotes every 32-wide K block: the block's sum from
    `block_sum` (float64 values a tensor core produces, exact in fp32), times the activation and
    tile scales, added to an fp32 accumulator in K order. -> (Fp8Operands) -> fp32 [M, N].

    Hardware fact: DeepGEMM copies each block's tensor-core partial sum into fp32 registers on the
    CUDA cores and adds it there, scaled (DeepSeek-V3 report §3.3.2, "promotion to CUDA cores"); with
    one scale per 32 values along K the scales force a promotion every 32. Scaling by powers of two
    is exact, so the only roundings are the block sum's own and the fp32 additions."""

    def accumulate(ops: Fp8Operands) -> torch.Tensor:
        m, n = ops.qa.shape[0], ops.qw.shape[1]
        out = torch.empty(m, n, dtype=F32)
        per_element = up.FP8_BLOCK if block_sum is block_sum_aligned else 1  # it holds a block's products
        for rows, cols in _tiles(m, n, per_element):
            acc = torch.zeros(rows.stop - rows.start, cols.stop - cols.start, dtype=F32)
            for kb in range(ops.blocks):
                ks = slice(kb * up.FP8_BLOCK, (kb + 1) * up.FP8_BLOCK)
                block = block_sum(ops.qa[rows, ks], ops.qw[ks, cols]).float()  # exact: at most 14 significant bits
                acc.add_(block.mul_(ops.sa[rows, kb : kb + 1].float()).mul_(ops.sw[kb, cols].float()))
            out[rows, cols] = acc
        return out

    accumulate.__name__ = f"promoted_{block_sum.__name__}"
    return accumulate


def fp8_unpromoted(ops: Fp8Operands, bits: int = TC_BITS) -> torch.Tensor:
    """MUTANT: the tensor core's narrow accumulator carried across all of K, never promoted: every
    scaled product added in order to one accumulator of `bits` significant bits that truncates after
    each addition. fp32 [M, N]. DeepSeek-V3's report (§3.3.2) measured relative errors near 2% for
    this at K = 4096; it is why DeepGEMM promotes."""
    m, n = ops.qa.shape[0], ops.qw.shape[1]
    a = ops.qa * ops.sa.repeat_interleave(up.FP8_BLOCK, 1)  # exact: powers of two
    w = ops.qw * ops.sw.repeat_interleave(up.FP8_BLOCK, 0)
    out = torch.empty(m, n, dtype=F32)
    for rows, cols in _tiles(m, n):
        out[rows, cols] = block_sum_sequential(a[rows], w[:, cols], bits).float()
    return out


def fp8_bf16_block_accumulator(ops: Fp8Operands) -> torch.Tensor:
    """MUTANT: exact block sums (rounded once to fp32, as the reference), scaled, added across the
    K blocks in a bf16 accumulator (rounded to bf16 after every block). fp32 [M, N] of bf16 values."""
    m, n = ops.qa.shape[0], ops.qw.shape[1]
    acc = torch.zeros(m, n, dtype=BF16)
    for kb in range(ops.blocks):
        ks = slice(kb * up.FP8_BLOCK, (kb + 1) * up.FP8_BLOCK)
        block = (ops.qa[:, ks] @ ops.qw[ks]).float() * ops.sa[:, kb : kb + 1].float() * ops.sw[kb].float()
        acc = (acc.float() + block).to(BF16)
    return acc.float()


def fp8_exact(ops: Fp8Operands) -> torch.Tensor:
    """The reference's fp8 GEMM accumulator: exact block sums rounded once to fp32, scaled, added in
    fp32 in K order. fp32 [M, N] (what the golden rounds to bf16)."""
    m, n = ops.qa.shape[0], ops.qw.shape[1]
    acc = torch.zeros(m, n, dtype=F32)
    for kb in range(ops.blocks):
        ks = slice(kb * up.FP8_BLOCK, (kb + 1) * up.FP8_BLOCK)
        acc.add_((ops.qa[:, ks] @ ops.qw[ks]).float().mul_(ops.sa[:, kb : kb + 1].float()).mul_(ops.sw[kb].float()))
    return acc


def fp8_term_scale(ops: Fp8Operands) -> torch.Tensor:
    """float64 [M, N]: the magnitude of the terms the GEMM sums, Σ_blocks sa·sw Σ_k |qa_k qw_k|."""
    a = (ops.qa * ops.sa.repeat_interleave(up.FP8_BLOCK, 1)).abs()
    w = (ops.qw * ops.sw.repeat_interleave(up.FP8_BLOCK, 0)).abs()
    return a @ w


# --- bf16 tensor-core GEMMs with split K ---------------------------------------------------------


def split_bounds(k: int, splits: int, step: int) -> list[tuple[int, int]]:
    """[k0, k1) chunks of K for `splits` partial sums, each a whole number of `step`-wide k-steps
    where K allows (the last chunk takes the rest); empty chunks are dropped."""
    steps = -(-k // step)
    cuts = [min(k, round(i * steps / splits) * step) for i in range(splits + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def split_k_matmul(x: torch.Tensor, w: torch.Tensor, splits: int = 4, step: int = 16) -> torch.Tensor:
    """fp32 [M, N] = x [M, K] @ w [N, K].T for bf16 x and w, as a split-K tensor-core GEMM computes
    it: K cut into `splits` chunks, each chunk an fp32 partial that adds one k-step of `step`
    products at a time (their exact sum, rounded once into the accumulator), the partials then
    summed in fp32 in chunk order.

    Hardware fact: a bf16 mma/wgmma multiplies bf16 values exactly and accumulates in fp32, k = 16
    products per instruction (PTX ISA, "Matrix multiply-accumulate" shapes m16n8k16 / wgmma k16);
    cuBLAS and CUTLASS split K across thread blocks for small M x N and reduce the fp32 partials in
    a second pass (CUTLASS "split-K" / "stream-K" reductions). Exact here: 16 products of bf16
    values (16 significant bits each) sum exactly in float64 unless their exponents span more than
    about 2^33."""
    xd, wd = x.double(), w.double().T
    total = None
    for k0, k1 in split_bounds(x.shape[-1], splits, step):
        partial = torch.zeros(x.shape[0], w.shape[0], dtype=F32)
        for g0 in range(k0, k1, step):
            g1 = min(k1, g0 + step)
            partial = (partial.double() + xd[:, g0:g1] @ wd[g0:g1]).float()
        total = partial if total is None else total + partial
    if total is None:
        return torch.zeros(x.shape[0], w.shape[0], dtype=F32)
    return total


def tc_bf16_matmul(x: torch.Tensor, w: torch.Tensor, step: int = 16, bits: int = 24) -> torch.Tensor:
    """fp32 [M, N] = x [M, K] @ w [N, K].T for bf16 x and w, as a tensor core accumulates when nothing is
    rounded to nearest: each k-step's `step` exact products and the running sum aligned to the largest
    of them and truncated toward zero at its 2^(e - bits + 1), summed exactly, the result truncated to
    `bits` significant bits; K in order, one accumulator (no split).

    Hardware fact: tensor cores add a group of products and the accumulator with one multi-operand adder
    after aligning their significands to the largest exponent, truncating what falls off the end, and
    normalise the result toward zero (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA
    tensor cores", PeerJ CS 2021). A truncating adder is biased, so its losses add up faster than an fp32
    FMA's. Exact here: a product of bf16 values has 16 significant bits, each aligned term is an integer
    multiple of the step below 2^bits, and 17 of them sum below 2^29."""
    xd, wd = x.double(), w.double().T
    s = torch.zeros(x.shape[0], w.shape[0], dtype=F64)
    for g0 in range(0, x.shape[-1], step):
        g1 = min(x.shape[-1], g0 + step)
        terms = torch.cat([s[:, None, :], xd[:, g0:g1, None] * wd[None, g0:g1, :]], 1)  # [M, 1 + C, N]
        s = truncate_significant(aligned_sum(terms, bits), bits)
    return s.float()


def bf16_accumulator_matmul(x: torch.Tensor, w: torch.Tensor, step: int = 16) -> torch.Tensor:
    """fp32 [M, N] = x @ w.T whose running sum is rounded to bf16 after every k-step of `step` products."""
    xd, wd = x.double(), w.double().T
    s = torch.zeros(x.shape[0], w.shape[0], dtype=F64)
    for g0 in range(0, x.shape[-1], step):
        s = (s + xd[:, g0 : g0 + step] @ wd[g0 : g0 + step]).to(BF16).double()
    return s.float()


# --- index logits ----------------------------------------------------------------------------------


def index_logits_fp32(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """bf16 [b, S, T] = Σ_h relu(q_h · k) w_h with every step in fp32 and one rounding to bf16 at the
    end: fp32 dot products of the (fp4-round-tripped) bf16 q and k, ReLU, times the head weight
    promoted to fp32, the heads summed in fp32 (torch's order), bf16 out.

    Hardware fact: DeepGEMM's MQA-logits kernels (fp8_mqa_logits and its paged form) take fp32 head
    weights, accumulate each head's q·k on tensor cores in fp32, apply ReLU and the weight on the
    CUDA cores and reduce over heads in fp32 registers, writing fp32 logits (DeepGEMM README,
    "Indexer"); the bf16 rounding is the model's one concession to the harness's bf16 output. The
    head weights keep upstream's softmax scale (M:555)."""
    dots = torch.einsum("bshd,btd->bsht", q.float(), k.float())
    return (dots.relu() * w.float().unsqueeze(-1)).sum(dim=2).to(BF16) + 0.0


def index_logits_head_sum_bf16(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """MUTANT: fp32 dots, ReLU and weights as `index_logits_fp32`, but the heads summed in a bf16
    accumulator (rounded to bf16 after every head)."""
    terms = torch.einsum("bshd,btd->bsht", q.float(), k.float()).relu() * w.float().unsqueeze(-1)
    acc = torch.zeros(terms.shape[0], terms.shape[1], terms.shape[3], dtype=BF16)
    for h in range(terms.shape[2]):
        acc = (acc.float() + terms[:, :, h]).to(BF16)
    return acc + 0.0


def index_logit_terms(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 [b, S, T]: the magnitude of the terms a logit sums, Σ_h |w_h| Σ_d |q_hd k_d|."""
    return torch.einsum("bshd,btd->bsht", q.double().abs(), k.double().abs()).mul(w.double().abs().unsqueeze(-1)).sum(2)


# --- fast math ----------------------------------------------------------------------------------------


def exp2_fp32(x: torch.Tensor) -> torch.Tensor:
    """2^x correctly rounded to fp32 (float64 evaluation, one rounding); the exact exp2 next to which
    `ex2_approx` is measured."""
    return torch.exp2(x.double()).float()


def ex2_approx(x: torch.Tensor) -> torch.Tensor:
    """fp32 2^x as `ex2.approx.ftz.f32` computes it, deterministically: the correctly rounded value
    moved by 1 or 2 ulps up or down (a pattern hashed from x's bits), results below the smallest
    normal flushed to zero.

    Hardware fact: PTX's ex2.approx.f32 is an SFU approximation with a maximum relative error of
    about 2 ulps (2^-22 over its range; PTX ISA, "ex2"), and the .ftz form (what --use_fast_math and
    FlashMLA's exp2f compile to) flushes subnormal results to zero. The model always errs by 1-2 ulps,
    so it is at least as far from 2^x as the hardware."""
    xf = x.float()
    exact = exp2_fp32(xf)
    pattern = _mix(xf.contiguous().view(torch.int32)) % 4
    steps = torch.where(pattern < 2, pattern - 2, pattern - 1)  # -2, -1, +1, +2
    out = step_ulps(exact, steps)
    return torch.where(out < FP32_TINY, torch.zeros_like(out), out)


def exp_fast(x: torch.Tensor) -> torch.Tensor:
    """fp32 e^x as `__expf` / --use_fast_math compute it: ex2.approx of fp32(x * fp32(log2 e)).

    Hardware fact: CUDA's __expf multiplies by log2(e) in fp32 and calls ex2.approx (CUDA C++
    Programming Guide, "Intrinsic Functions": error 2 + floor(|1.173 x|) ulps, the second part from
    rounding x * log2 e)."""
    return ex2_approx(x.float() * LOG2E_F32)


def rsqrt_fp32(x: torch.Tensor) -> torch.Tensor:
    """1/sqrt(x) correctly rounded to fp32 (float64 evaluation, one rounding)."""
    return (1.0 / torch.sqrt(x.double())).float()


def rsqrt_approx(x: torch.Tensor) -> torch.Tensor:
    """fp32 1/sqrt(x) as `rsqrt.approx.ftz.f32` computes it, deterministically: the correctly rounded
    value moved one ulp up or down (a pattern hashed from x's bits); a subnormal x counts as 0.

    Hardware fact: PTX's rsqrt.approx.f32 has a maximum relative error of 2^-22.9 over its range
    (PTX ISA, "rsqrt"); CUDA's rsqrtf and --use_fast_math RMSNorm kernels use it. One ulp plus the
    half ulp of rounding is up to 1.5 ulps, at least the hardware's error."""
    xf = x.float()
    xf = torch.where(xf.abs() < FP32_TINY, torch.zeros_like(xf), xf)
    steps = (_mix(xf.contiguous().view(torch.int32)) % 2) * 2 - 1  # -1 or +1
    return step_ulps(rsqrt_fp32(xf), steps)


# --- reductions -------------------------------------------------------------------------------------------


def warp_tree_sum(v: torch.Tensor, lanes: int = 32) -> torch.Tensor:
    """fp32 sum over the last dim as one warp reduces it: lane l adds elements l, l + 32, l + 64, ...
    in order (fp32), then a butterfly of shuffles adds lane pairs 16, 8, 4, 2, 1 apart (fp32), every
    lane ending with the same total. -> v.shape[:-1].

    Hardware fact: the CUDA reduction idiom (__shfl_xor_sync butterfly; CUDA C++ Programming Guide,
    "Warp Shuffle Functions"), as RMSNorm kernels (e.g. apex, vLLM, FlashInfer) and softmax row sums
    use it."""
    v = v.float()
    pad = (-v.shape[-1]) % lanes
    grid = F.pad(v, (0, pad)).unflatten(-1, (-1, lanes))  # [..., rounds, lanes]
    part = grid[..., 0, :].clone()
    for r in range(1, grid.shape[-2]):
        part = part + grid[..., r, :]
    lane = torch.arange(lanes)
    offset = lanes // 2
    while offset:
        part = part + part[..., lane ^ offset]
        offset //= 2
    return part[..., 0]


def sum_last(v: torch.Tensor) -> torch.Tensor:
    """torch's own fp32 sum over the last dim (the CPU's order)."""
    return v.sum(-1)


# --- RMSNorm ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormArith:
    """How an RMSNorm kernel rounds: the reduction of the squares and the reciprocal square root."""

    row_sum: Callable[[torch.Tensor], torch.Tensor] | None = None  # None: torch's mean, as upstream
    rsqrt: Callable[[torch.Tensor], torch.Tensor] = torch.rsqrt

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm (M:281-293) with this arithmetic: fp32 squares, their sum (by `row_sum`) divided by
        D in fp32, plus eps, `rsqrt`, times x, times the weight in fp32, one cast back."""
        xf = x.float()
        if self.row_sum is None:
            var = xf.pow(2).mean(-1, keepdim=True)
        else:
            var = self.row_sum(xf * xf).unsqueeze(-1) / xf.shape[-1]
        return (weight * (xf * self.rsqrt(var + eps))).to(x.dtype)


# --- sparse attention ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxArith:
    """How a sparse-attention kernel rounds its online softmax (module `sparse_attention`)."""

    folded: bool = False  # exp2 with log2(e) folded into the score scale (FlashMLA); False: exp as upstream
    exp: Callable[[torch.Tensor], torch.Tensor] = torch.exp  # the unfolded exponential
    exp2: Callable[[torch.Tensor], torch.Tensor] = exp2_fp32  # the folded one
    row_sum: Callable[[torch.Tensor], torch.Tensor] = sum_last  # a tile's sum of P
    reciprocal: bool = False  # o = acc * fp32(1 / l), as FlashAttention-style epilogues, instead of acc / l
    max_splits: int = 1  # > 1: split-KV, the lanes in 2..max_splits partitions merged by log-sum-exp
    bf16_p: bool = True  # P rounded to bf16 before P·V, as every kernel here does (False: for the model's tests)


class Partial(NamedTuple):
    """One online softmax over some lanes: acc fp32 [b, m, h, d] (unnormalised), l fp32 [b, m, h] (the
    sum of P), top fp32 [b, m, h] (running max, in the exponent's units)."""

    acc: torch.Tensor
    l: torch.Tensor
    top: torch.Tensor


def online_softmax(
    q: torch.Tensor, kv: torch.Tensor, ids: torch.Tensor, scale: float, arith: SoftmaxArith, tile: int = up.ATTN_TILE
) -> Partial:
    """The running-max softmax over `ids` [b, m, K] in tiles of `tile` lanes (K41:296-403's loop):
    fp32 scores, P rounded to bf16 before P·V, fp32 accumulators. Folded: scores times fp32(scale *
    log2 e) and exp2 (the max and P in log2 units); else scores times scale and exp, as upstream."""
    b, m, h, d = q.shape
    qf = q.float()
    mult = torch.tensor(scale * math.log2(math.e) if arith.folded else scale, dtype=F32)
    expf = arith.exp2 if arith.folded else arith.exp
    top = torch.full((b, m, h), M_INIT, dtype=F32)
    l = torch.zeros((b, m, h), dtype=F32)
    acc = torch.zeros((b, m, h, d), dtype=F32)
    for lo in range(0, ids.shape[-1], tile):
        rows, present = up._gather_tile(kv, ids[..., lo : lo + tile])
        s = torch.einsum("bmhd,bmtd->bmht", qf, rows) * mult
        s = s.masked_fill(~present.unsqueeze(2), float("-inf"))
        new_top = torch.maximum(top, s.amax(-1))
        alpha = expf(top - new_top)
        p = expf(s - new_top.unsqueeze(-1))
        l = l * alpha + arith.row_sum(p)
        pv = p.to(BF16).float() if arith.bf16_p else p
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bmht,bmtd->bmhd", pv, rows)
        top = new_top
    return Partial(acc, l, top)


def _sink_units(attn_sink: torch.Tensor, arith: SoftmaxArith) -> torch.Tensor:
    """The sink logit (a raw logit: not scaled) in the exponent's units: fp32(sink * log2 e) folded."""
    sink = attn_sink.float()
    return sink * LOG2E_F32 if arith.folded else sink


def _normalise(acc: torch.Tensor, l: torch.Tensor, reciprocal: bool) -> torch.Tensor:
    return acc * (1.0 / l).unsqueeze(-1) if reciprocal else acc / l.unsqueeze(-1)


def partition_bounds(lanes: int, max_splits: int, tile: int = up.ATTN_TILE) -> list[tuple[int, int]]:
    """Contiguous lane ranges of a split-KV kernel: 2..max_splits partitions (one per `tile` lanes,
    at least 2 where there are 2 lanes), of near-equal size."""
    parts = min(max_splits, max(2, -(-lanes // tile)), max(1, lanes))
    cuts = [round(i * lanes / parts) for i in range(parts + 1)]
    return [(a, c) for a, c in zip(cuts, cuts[1:]) if c > a]


def sparse_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    attn_sink: torch.Tensor,
    ids: torch.Tensor,
    softmax_scale: float,
    arith: SoftmaxArith,
) -> torch.Tensor:
    """Sparse attention with a sink (upstream semantics, K41:296-403: the sink adds exp(sink - max) to
    the denominator only) in the arithmetic `arith` describes. bf16 [b, m, h, d].

    One pass (max_splits 1): the online softmax over every lane, the sink added to l at the end.
    Split-KV: each partition's online softmax gives o_i = acc_i / l_i and lse_i = log2 l_i + top_i;
    the merge is o = Σ_i 2^(lse_i - lse) o_i with lse = log(Σ_i 2^lse_i + 2^sink) over the
    partitions and the sink (FlashMLA's / flash-decoding's combine kernel), all in fp32."""
    h = q.shape[2]
    sink = _sink_units(attn_sink, arith).view(1, 1, h)
    if arith.max_splits <= 1:
        part = online_softmax(q, kv, ids, softmax_scale, arith)
        expf = arith.exp2 if arith.folded else arith.exp
        l = part.l + expf(sink - part.top)
        return _normalise(part.acc, l, arith.reciprocal).to(BF16)
    return _split_kv(q, kv, sink, ids, softmax_scale, arith).to(BF16)


def _split_kv(q, kv, sink, ids, scale, arith: SoftmaxArith) -> torch.Tensor:
    """fp32 [b, m, h, d]: the partitions' normalised outputs merged by their log-sum-exp."""
    expf = arith.exp2 if arith.folded else arith.exp
    logf = (lambda v: torch.log2(v.double()).float()) if arith.folded else (lambda v: torch.log(v.double()).float())
    outs, lses = [], []
    for lo, hi in partition_bounds(ids.shape[-1], arith.max_splits):
        part = online_softmax(q, kv, ids[..., lo:hi], scale, arith)
        empty = part.l == 0
        normalised = _normalise(part.acc, torch.where(empty, 1.0, part.l), arith.reciprocal)
        o = torch.where(empty.unsqueeze(-1), 0.0, normalised)  # FlashMLA's guard: an empty partition gives 0
        outs.append(o)
        lses.append(torch.where(empty, float("-inf"), logf(part.l) + part.top))
    sink = sink.expand_as(lses[0]) if lses else sink
    top = torch.stack(lses + [sink]).amax(0).clamp_min(M_INIT)
    total = expf(sink - top)
    for lse in lses:
        total = total + expf(lse - top)
    lse_all = logf(total) + top
    o = torch.zeros_like(outs[0]) if outs else torch.zeros(*q.shape, dtype=F32)
    for oi, lse in zip(outs, lses):
        o = o + expf(lse - lse_all).unsqueeze(-1) * oi
    return o


# --- the compressor's softmax over a group -----------------------------------------------------------


def pool_groups_with(exp: Callable[[torch.Tensor], torch.Tensor]):
    """upstream_ops.pool_groups with the group softmax as exp(score - max) / Σ exp, `exp` the kernel's."""

    def pool_groups(latent: torch.Tensor, score: torch.Tensor, member_dim: int) -> torch.Tensor:
        e = exp(score - score.amax(member_dim, keepdim=True))
        return (latent * (e / e.sum(member_dim, keepdim=True))).sum(dim=member_dim)

    return pool_groups


# --- the gates -------------------------------------------------------------------------------------------


class GpuGate(UpstreamTorch):
    """UpstreamTorch with the `upstream_ops` functions a GPU computes otherwise swapped for models for
    the duration of each call. A subclass sets the models it uses; None keeps upstream's."""

    fp8_accumulate: Callable[[Fp8Operands], torch.Tensor] | None = None  # -> fp32 [M, N]
    bf16_matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # (x [M, K], w [N, K]) -> fp32
    index_logits: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    softmax: SoftmaxArith | None = None
    norm: NormArith | None = None
    group_exp: Callable[[torch.Tensor], torch.Tensor] | None = None  # the compressor's group softmax

    def patches(self) -> dict[tuple[object, str], Callable]:
        """(module, name) -> replacement for every model this gate uses."""
        swap: dict[tuple[object, str], Callable] = {}
        if self.fp8_accumulate is not None:
            swap[up, "fp8_linear"] = self._fp8_linear
        if self.bf16_matmul is not None:
            swap[up, "linear"] = self._linear
            swap[ua, "output_rank"] = self._output_rank
        if self.index_logits is not None:
            swap[up, "index_scores"] = self.index_logits
        if self.softmax is not None:
            arith = self.softmax
            swap[up, "sparse_attn"] = lambda q, kv, sink, ids, scale: sparse_attention(q, kv, sink, ids, scale, arith)
        if self.norm is not None:
            swap[up, "rms_norm"] = self.norm.rms_norm
        if self.group_exp is not None:
            swap[up, "pool_groups"] = pool_groups_with(self.group_exp)
        return swap

    def run(self, component, inputs, params):
        with ExitStack() as stack:
            for (module, name), replacement in self.patches().items():
                stack.enter_context(patched(module, name, replacement))
            return super().run(component, inputs, params)

    def _fp8_linear(self, x, w_codes, w_scale_bytes, promote: int = up.FP8_BLOCK):
        """upstream_ops.fp8_linear with this gate's accumulation: act_quant, the GEMM, bf16 out."""
        q = up.act_quant(x)
        acc = self.fp8_accumulate(fp8_operands(q, w_codes, w_scale_bytes))
        return acc.reshape(*x.shape[:-1], w_codes.shape[0]).to(BF16), q

    def _linear(self, x, w):
        """upstream_ops.linear with bf16 GEMMs by this gate's matmul (fp8 and fp32 ones as upstream)."""
        if isinstance(w, tuple):
            return up.fp8_linear(x, *w)[0]
        if x.dtype == BF16 and w.dtype == BF16:
            y = self.bf16_matmul(x.reshape(-1, x.shape[-1]), w)
            return y.reshape(*x.shape[:-1], w.shape[0]).to(BF16)
        return F.linear(x, w)

    def _output_rank(self, o, inputs, cfg):
        """upstream_attention.output_rank (wo_a, a grouped bf16 GEMM) by this gate's matmul, group by group."""
        b, S = o.shape[:2]
        wo_a = inputs["wo_a"].view(cfg.o_groups, cfg.o_lora_rank, -1)
        groups = o.reshape(b * S, cfg.o_groups, -1)
        z = [self.bf16_matmul(groups[:, g], wo_a[g]) for g in range(cfg.o_groups)]
        return torch.stack(z, 1).to(BF16).reshape(b, S, -1)


def _split_k4(x, w):
    return split_k_matmul(x, w, splits=4)


FLASH_MLA = SoftmaxArith(folded=True, reciprocal=True)


class Fp8Tc14(GpuGate):
    """fp8 GEMMs whose 32-wide K blocks sum in a 14-bit truncating accumulator, promoted to fp32."""

    fp8_accumulate = staticmethod(fp8_promoted(block_sum_sequential))


class Fp8Tc14Aligned(GpuGate):
    """fp8 GEMMs whose K blocks sum as a tensor core adds: products aligned to the largest, 14 bits kept."""

    fp8_accumulate = staticmethod(fp8_promoted(block_sum_aligned))


class SplitKBf16(GpuGate):
    """bf16 GEMMs (every bf16 Linear and wo_a) as split-K tensor-core GEMMs: 4 fp32 partials."""

    bf16_matmul = staticmethod(_split_k4)


class Bf16TcTruncating(GpuGate):
    """bf16 GEMMs (every bf16 Linear and wo_a) on tensor cores that align and truncate, K in one order."""

    bf16_matmul = staticmethod(tc_bf16_matmul)


class Fp32IndexLogits(GpuGate):
    """Index logits as DeepGEMM's MQA-logits kernels: fp32 throughout, one rounding to bf16."""

    index_logits = staticmethod(index_logits_fp32)


class FlashMlaSparse(GpuGate):
    """Sparse attention as FlashMLA: online softmax over 64-lane blocks, exp2 with log2 e folded in."""

    softmax = FLASH_MLA


class SplitKvDecode(GpuGate):
    """Sparse attention as a split-KV kernel: 2-4 partitions, each its own online softmax, LSE merge."""

    softmax = SoftmaxArith(folded=True, reciprocal=True, max_splits=4)


class FastMath(GpuGate):
    """exp as ex2.approx(x * log2 e) (attention, the compressor's softmax), rsqrt.approx in RMSNorm."""

    softmax = SoftmaxArith(exp=exp_fast)
    norm = NormArith(rsqrt=rsqrt_approx)
    group_exp = staticmethod(exp_fast)


class WarpTree(GpuGate):
    """RMSNorm's sum of squares and attention's P row sums as warp-tree reductions."""

    softmax = SoftmaxArith(row_sum=warp_tree_sum)
    norm = NormArith(row_sum=warp_tree_sum)


class AllGpu(GpuGate):
    """Every model at once: Fp8Tc14, SplitKBf16, Fp32IndexLogits, split-KV FlashMLA with ex2.approx and
    warp-tree sums, rsqrt.approx and warp-tree sums in RMSNorm, fast exp in the compressor."""

    fp8_accumulate = staticmethod(fp8_promoted(block_sum_sequential))
    bf16_matmul = staticmethod(_split_k4)
    index_logits = staticmethod(index_logits_fp32)
    softmax = SoftmaxArith(folded=True, exp2=ex2_approx, row_sum=warp_tree_sum, reciprocal=True, max_splits=4)
    norm = NormArith(row_sum=warp_tree_sum, rsqrt=rsqrt_approx)
    group_exp = staticmethod(exp_fast)


# --- the mutants ------------------------------------------------------------------------------------------


class Fp8Tc14NoPromotion(GpuGate):
    """BUG: the 14-bit tensor-core accumulator carried across all of K, never promoted to fp32."""

    fp8_accumulate = staticmethod(fp8_unpromoted)


class Bf16GemmBf16Accumulator(GpuGate):
    """BUG: bf16 GEMMs whose running sum is rounded to bf16 after every k-step (accumulated in the output's
    dtype)."""

    bf16_matmul = staticmethod(bf16_accumulator_matmul)


class Fp8BlockSumsBf16(GpuGate):
    """BUG: the fp8 GEMM's scaled block sums accumulated across K in bf16."""

    fp8_accumulate = staticmethod(fp8_bf16_block_accumulator)


def _unrounded(x: torch.Tensor, block: int = up.FP4_BLOCK) -> up.Quantised:
    """An fp4 'round trip' that returns its input: the codes and scales are the real quantiser's."""
    q = ORIGINAL_FP4_E8M0(x, block)
    return up.Quantised(x.to(BF16), q.codes, q.scale_bytes)


def _indexer_query_unrounded(*args, **kwargs):
    """upstream_ops.indexer_forward scoring the query without its fp4 round trip."""
    with patched(up, "fp4_act_quant_e8m0", _unrounded):
        return ORIGINAL_INDEXER_FORWARD(*args, **kwargs)


def _indexer_query_rounded(*args, **kwargs):
    """upstream_ops.indexer_forward with the query's real fp4 round trip (inside a key-side patch)."""
    with patched(up, "fp4_act_quant_e8m0", ORIGINAL_FP4_E8M0):
        return ORIGINAL_INDEXER_FORWARD(*args, **kwargs)


ORIGINAL_FP4_E8M0, ORIGINAL_INDEXER_FORWARD = up.fp4_act_quant_e8m0, up.indexer_forward


class IndexLogitsNoFp4Q(Fp32IndexLogits):
    """BUG: fp32 index logits of the query before its fp4 round trip."""

    def patches(self):
        return {**super().patches(), (up, "indexer_forward"): _indexer_query_unrounded}


class IndexLogitsNoFp4K(Fp32IndexLogits):
    """BUG: fp32 index logits of keys that skipped their fp4 round trip (the key owner writes the
    index-key cache unrounded; the query keeps its own)."""

    def patches(self):
        return {
            **super().patches(),
            (up, "fp4_act_quant_e8m0"): _unrounded,
            (up, "indexer_forward"): _indexer_query_rounded,
        }


class IndexLogitsHeadSumBf16(GpuGate):
    """BUG: index logits with fp32 dots, summed over the heads in bf16."""

    index_logits = staticmethod(index_logits_head_sum_bf16)


# --- the registry -----------------------------------------------------------------------------------------


class MutantSpec(NamedTuple):
    """A mutant and where it must fail: `stage`, the first divergent stage of the attention chain
    (the last part of sNN.lK.<stage>) in the attention cases its bug reaches (the fp8 ones for the
    fp8 GEMM bugs), and `outputs`, component -> the output that must fail in at least one of that
    component's cases (the fp8 GEMM bugs: the production-shape linear.fp8 cases, K >= 1280)."""

    cls: type
    stage: str
    outputs: dict[str, str]


GATES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Fp8Tc14,
        Fp8Tc14Aligned,
        SplitKBf16,
        Bf16TcTruncating,
        Fp32IndexLogits,
        FlashMlaSparse,
        SplitKvDecode,
        FastMath,
        WarpTree,
        AllGpu,
    )
}

MUTANTS: dict[str, MutantSpec] = {
    "Fp8Tc14NoPromotion": MutantSpec(Fp8Tc14NoPromotion, "qr", {"linear.fp8": "y"}),
    "Fp8BlockSumsBf16": MutantSpec(Fp8BlockSumsBf16, "qr", {"linear.fp8": "y"}),
    "Bf16GemmBf16Accumulator": MutantSpec(Bf16GemmBf16Accumulator, "qr", {"compressor": "rows"}),
    "IndexLogitsNoFp4Q": MutantSpec(IndexLogitsNoFp4Q, "index_scores", {"indexer": "scores"}),
    "IndexLogitsNoFp4K": MutantSpec(IndexLogitsNoFp4K, "index_k_rows", {"kv.finish": "index_k"}),
    "IndexLogitsHeadSumBf16": MutantSpec(
        IndexLogitsHeadSumBf16, "index_scores", {"indexer.scores": "scores", "indexer": "scores"}
    ),
}
