"""Float64: a correct implementation that is more accurate than the reference (a gate).

Every tolerance-compared step is evaluated in float64 and rounded ONCE, to bf16 or fp32, at the
rounding points of upstream (docs/v41-reference.md §8): GEMMs, norms, RoPE, softmax and sums.
The reference rounds some of those results twice (float64 -> fp32 -> bf16) and evaluates RoPE
and the YaRN table in fp32, so this implementation differs from the goldens by rounding only. It
exists to prove that the tolerances do not fail a correct implementation that rounds differently.

What is not a tolerance question is done exactly as upstream decides it:
- the quantisers' scale rules and e2m1/e4m3 roundings (§6.1-6.2), including the fp32 products and
  quotients the kernels round before deciding (float64 is used where it gives the same bits);
- selections: torch's own CPU top-k (as upstream calls it), masks, candidate blocks.

`attention` reuses the reference's bookkeeping (ring writes, window ids, runtime publication) and
swaps every arithmetic helper of `v41_conformance.reference.attention` for its float64 version here, for
the duration of one call.

Run: conformance run --impl tests/impls/gate_float64.py:Float64 --no-isolate
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple
from unittest import mock

import torch
import torch.nn.functional as F

import v41_conformance.reference.attention as ref_attention
from gate import Gate, bare
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference.fp8_linear import Fp8Weight, weight_input
from v41_conformance.reference.kv_finish import KvFinish

NINF = float("-inf")
SCORE, LATENT = 0, 1  # (score, latent) axis of a compressor ring slot (docs/schedules.md)
TILE = 64  # sparse_attn lanes per tile (K41:328)
M_INIT = -1e30  # sparse_attn running-max start (K41:352-355)
FP8_BLOCK, FP4_INDEX_BLOCK, FP4_MAIN_BLOCK = 32, 32, 16


# ---------------------------------------------------------------------------------------------
# Exact roundings of float64 values
# ---------------------------------------------------------------------------------------------


def _fp32_constant(value: float) -> float:
    """A kernel literal as the fp32 number it becomes."""
    return torch.tensor(value, dtype=torch.float32).item()


INV_6 = _fp32_constant(1.0 / 6.0)  # fp4 scale multiplier (K41:138)
INV_448 = _fp32_constant(1.0 / 448.0)  # fp8 scale multiplier (K41:47)
FP8_AMAX_FLOOR = _fp32_constant(1e-4)  # K41:76-77
FP4_E8M0_AMAX_FLOOR = 6.0 * 2.0**-126  # K41:163-164
FP4_E4M3_AMAX_FLOOR = 6.0 * 2.0**-9  # K41:158-161


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent as float64, built from the IEEE bits (exact; exponent in [-1022, 1023])."""
    return ((exponent.long() + 1023) << 52).view(torch.float64)


def _exponent(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) of nonzero finite float64 values, int64."""
    return torch.frexp(x).exponent.long() - 1


def _round_even(x: torch.Tensor, mantissa_bits: int, min_exponent: int) -> torch.Tensor:
    """float64 x rounded to nearest-even on a binary grid with `mantissa_bits` fraction bits and
    subnormals below 2^min_exponent. Exact: x / ulp and the product back are power-of-two scalings."""
    finite = torch.isfinite(x) & (x != 0)
    exponent = _exponent(torch.where(finite, x, 1.0)).clamp_min(min_exponent)
    ulp = _pow2(exponent - mantissa_bits)
    return torch.where(finite, torch.round(x / ulp) * ulp, x)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """float64 -> bf16 in ONE rounding (torch's own cast rounds through fp32 first)."""
    return _round_even(x.double(), 7, -126).to(torch.bfloat16)


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 -> bf16 or fp32, one rounding."""
    return round_bf16(x) if dtype == torch.bfloat16 else x.to(dtype)


def as_fp32(x: torch.Tensor) -> torch.Tensor:
    """float64 values rounded to fp32 and kept in float64 (a kernel's fp32 intermediate)."""
    return x.float().double()


def pow2_ceil(y: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 y) of positive float64 values (the kernels' power-of-two scale rounding)."""
    floor = _pow2(_exponent(y))
    return torch.where(floor == y, floor, 2.0 * floor)


@dataclass(frozen=True)
class MiniFloat:
    """A small float format with saturation: rounding and bit encoding (sign, exponent, mantissa)."""

    exponent_bits: int
    mantissa_bits: int
    min_exponent: int  # exponent of the smallest normal
    max_value: float

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """Nearest-even value of the format (float64), saturating at +-max_value; sign kept."""
        return _round_even(x.clamp(-self.max_value, self.max_value), self.mantissa_bits, self.min_exponent)

    def bits(self, v: torch.Tensor) -> torch.Tensor:
        """uint8 bit patterns of float64 values that lie on the format's grid (-0 sets the sign)."""
        mag = v.abs()
        normal = mag >= 2.0**self.min_exponent
        exponent = torch.where(normal, _exponent(torch.where(normal, mag, 1.0)), self.min_exponent)
        field = torch.where(normal, exponent - self.min_exponent + 1, 0)
        mantissa = (mag / _pow2(exponent - self.mantissa_bits)).long() - normal.long() * (1 << self.mantissa_bits)
        sign = torch.signbit(v).long() << (self.exponent_bits + self.mantissa_bits)
        return (sign | field << self.mantissa_bits | mantissa).to(torch.uint8)


E2M1 = MiniFloat(exponent_bits=2, mantissa_bits=1, min_exponent=0, max_value=6.0)
E4M3 = MiniFloat(exponent_bits=4, mantissa_bits=3, min_exponent=-6, max_value=448.0)


def e8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two scales -> biased exponents (value 2^(byte - 127))."""
    return (_exponent(scale) + 127).to(torch.uint8)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 4-bit codes [..., D] -> [..., D/2], element 2i in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


# ---------------------------------------------------------------------------------------------
# Quantisers (§6.1-6.2): exact rounding decisions
# ---------------------------------------------------------------------------------------------


class Quantised(NamedTuple):
    y: torch.Tensor  # bf16 dequantised values
    codes: torch.Tensor  # uint8 per element
    scale_bytes: torch.Tensor  # uint8 per block


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [..., D/block, block] of x and each block's max |x|."""
    xg = x.double().unflatten(-1, (-1, block))
    return xg, xg.abs().amax(dim=-1)


def _fp4(xg: torch.Tensor, scale: torch.Tensor, scale_bytes: torch.Tensor) -> Quantised:
    """e2m1 codes of the kernel's fp32 quotient clamp(x / s, -6, 6); y = e2m1 * s (exact in bf16).

    Rounding the float64 quotient to fp32 gives the fp32 division's result (53 >= 2 * 24 + 2 bits,
    so the double rounding is innocuous)."""
    q = E2M1.round(as_fp32(xg / scale.unsqueeze(-1)))
    y = round_bf16((q * scale.unsqueeze(-1)).flatten(-2))
    return Quantised(y, E2M1.bits(q).flatten(-2), scale_bytes)


def fp4_e8m0(x: torch.Tensor, block: int = FP4_INDEX_BLOCK) -> Quantised:
    """fp4 QDQ with power-of-two scales: s = pow2_ceil(fp32(amax * fp32(1/6))), amax >= 6 * 2^-126."""
    xg, amax = _blocks(x, block)
    scale = pow2_ceil(as_fp32(amax.clamp_min(FP4_E8M0_AMAX_FLOOR) * INV_6))
    return _fp4(xg, scale, e8m0_bytes(scale))


def fp4_e4m3(x: torch.Tensor, block: int = FP4_MAIN_BLOCK) -> Quantised:
    """fp4 QDQ with e4m3 scales: s = e4m3(fp32(amax / 6)), amax >= 6 * 2^-9."""
    xg, amax = _blocks(x, block)
    scale = E4M3.round(as_fp32(amax.clamp_min(FP4_E4M3_AMAX_FLOOR) / 6.0))
    return _fp4(xg, scale, E4M3.bits(scale))


def fp8_ue8m0(x: torch.Tensor, block: int = FP8_BLOCK) -> Quantised:
    """fp8 e4m3 QDQ with power-of-two scales: s = pow2_ceil(fp32(amax * fp32(1/448))), amax >= fp32(1e-4)."""
    xg, amax = _blocks(x, block)
    scale = pow2_ceil(as_fp32(amax.clamp_min(FP8_AMAX_FLOOR) * INV_448))
    q = E4M3.round(xg / scale.unsqueeze(-1))  # exact quotient: s is a power of two
    y = round_bf16((q * scale.unsqueeze(-1)).flatten(-2))
    return Quantised(y, E4M3.bits(q).flatten(-2), e8m0_bytes(scale))


# ---------------------------------------------------------------------------------------------
# Linear, RMSNorm, RoPE
# ---------------------------------------------------------------------------------------------


def linear64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T in float64 (not rounded)."""
    return F.linear(x.double(), w.double())


def linear_bf16(x: torch.Tensor, w) -> torch.Tensor:
    """A Linear with a bf16 output: float64 GEMM, one rounding to bf16. An fp8 weight (`Fp8Weight`)
    first quantises x as act_quant decides it (§6.4), then multiplies in float64 as well."""
    if isinstance(w, Fp8Weight):
        return round_bf16(linear64(fp8_ue8m0(x).y, fp8_weight64(w.codes, w.scale_bytes)))
    return round_bf16(linear64(x, w))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-20) -> torch.Tensor:
    """RMSNorm (M:281-293) in float64, one rounding to x's dtype."""
    x64 = x.double()
    y = weight.double() * x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    return round_to(y, x.dtype)


def rotate(x: torch.Tensor, rows: torch.Tensor, rope_dim: int, inverse: bool = False) -> torch.Tensor:
    """Rotate the last rope_dim channels of x (interleaved pairs) by the (cos, sin) rows of its
    tokens, in float64, one rounding to x's dtype. x [S, D], [B, S, D] or [B, S, H, D]."""
    cos, sin = rows[..., 0].double(), rows[..., 1].double()  # [S, rope_dim/2]
    if inverse:
        sin = -sin
    if x.ndim == 4:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    tail = x[..., -rope_dim:].double().unflatten(-1, (-1, 2))
    re, im = tail[..., 0], tail[..., 1]
    rotated = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).flatten(-2)
    out = x.clone()
    out[..., -rope_dim:] = round_to(rotated, x.dtype)
    return out


def yarn_inv_freq(
    dim: int,
    base: float,
    original_seq_len: int = 0,
    factor: float = 16.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """float64 [dim/2] inverse frequencies with the YaRN ramp (M:368-389), not rounded."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if original_seq_len <= 0:
        return inv

    def correction(rotations: float) -> float:
        return dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction(beta_fast)), 0)
    high = min(math.ceil(correction(beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return inv * (ramp / factor + (1 - ramp))


def table_rows(inv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """fp32 [P, dim/2, 2] (cos, sin) of the float64 angle p * inv, rounded once."""
    angle = positions.double().unsqueeze(1) * inv.double()
    return torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1).float().contiguous()


def freqs_table(
    dim: int,
    seqlen: int,
    base: float,
    original_seq_len: int = 0,
    factor: float = 16.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """The whole table, fp32 [seqlen, dim/2, 2]."""
    inv = yarn_inv_freq(dim, base, original_seq_len, factor, beta_fast, beta_slow)
    return table_rows(inv, torch.arange(seqlen))


# ---------------------------------------------------------------------------------------------
# Compressor (M:429-485) with the harness's fp32 state ring
# ---------------------------------------------------------------------------------------------


class CompressorStep(NamedTuple):
    rows: torch.Tensor  # bf16 [b, G, hd]
    row_positions: torch.Tensor  # int64 [G]
    ring: torch.Tensor  # fp32 [b, S, 2, hd]


def _write_ring(
    ring: torch.Tensor, x: torch.Tensor, start: int, wkv: torch.Tensor, wgate: torch.Tensor
) -> torch.Tensor:
    """New ring with each position's (score, latent) projections, rounded to fp32 (ring state)."""
    projections = torch.stack([linear64(x, wgate), linear64(x, wkv)], dim=2).float()  # [b, n, 2, hd]
    ring = ring.clone()
    slots = ring.shape[1]
    for t in range(x.shape[1]):
        ring[:, (start + t) % slots] = projections[:, t]
    return ring


def _pool(ring: torch.Tensor, group: int, ratio: int) -> torch.Tensor:
    """bf16 [b, 1, hd]: the group's softmax-weighted latent in float64, one rounding to bf16."""
    slots = [(group * ratio + m) % ring.shape[1] for m in range(ratio)]
    members = ring[:, slots].double()  # [b, r, 2, hd]
    weights = torch.softmax(members[:, :, SCORE], dim=1)
    return round_bf16((weights * members[:, :, LATENT]).sum(dim=1, keepdim=True))


def compressor_step(
    x: torch.Tensor,
    start: int,
    ring: torch.Tensor,
    wkv: torch.Tensor,
    wgate: torch.Tensor,
    norm_w: torch.Tensor,
    eps: float,
    ratio: int,
) -> CompressorStep:
    """Positions start .. start+n-1 of x bf16 [b, n, dim]: write them, pool the groups they complete."""
    groups = range(start // ratio, (start + x.shape[1]) // ratio)
    positions = torch.tensor([j * ratio for j in groups], dtype=torch.int64)
    if ratio == 1:  # no state: RMSNorm(bf16 wkv(x)) per position
        return CompressorStep(rms_norm(linear_bf16(x, wkv), norm_w, eps), positions, ring)
    ring = _write_ring(ring, x, start, wkv, wgate)
    rows = [rms_norm(_pool(ring, j, ratio), norm_w, eps) for j in groups]
    b, hd = x.shape[0], norm_w.shape[0]
    out = torch.cat(rows, dim=1) if rows else torch.empty(b, 0, hd, dtype=torch.bfloat16)
    return CompressorStep(out, positions, ring)


# ---------------------------------------------------------------------------------------------
# kv.finish (M:537-548, M:746-761)
# ---------------------------------------------------------------------------------------------


KV_FINISH_OUTPUTS = (
    "main",
    "main_rope",
    "main_packed",
    "main_scale_bytes",
    "index_k",
    "index_norm",
    "index_packed",
    "index_scale_bytes",
)


def kv_finish(
    latent: torch.Tensor,
    positions: torch.Tensor,
    table: torch.Tensor,
    rope_dim: int,
    wk: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-20,
) -> KvFinish:
    """Main row: RoPE at the group's first position, fp4/e4m3 QDQ. Index key (with wk):
    k_norm(wk(latent)), RoPE, fp4/e8m0 QDQ. latent bf16 [b, G, hd], positions int64 [G]."""
    rows = table[positions]
    main_rope = rotate(latent, rows, rope_dim)
    main = fp4_e4m3(main_rope)
    if wk is None:
        return KvFinish(main.y, main_rope, pack_nibbles(main.codes), main.scale_bytes, None, None, None, None, None)
    index_norm = rms_norm(linear_bf16(latent, wk), k_norm, eps)
    index_rope = rotate(index_norm, rows, rope_dim)
    index = fp4_e8m0(index_rope)
    return KvFinish(
        main.y,
        main_rope,
        pack_nibbles(main.codes),
        main.scale_bytes,
        index.y,
        index_norm,
        pack_nibbles(index.codes),
        index.scale_bytes,
        index_rope,
    )


# ---------------------------------------------------------------------------------------------
# Indexer (M:527-580) and candidate blocks (M:583-610)
# ---------------------------------------------------------------------------------------------


def head_weights(x: torch.Tensor, weights_proj: torch.Tensor, index_head_dim: int) -> torch.Tensor:
    """bf16 weights_proj(x), then times index_head_dim^-0.5 * H^-0.5 rounded once to bf16 (M:555)."""
    multiplier = index_head_dim**-0.5 * weights_proj.shape[0] ** -0.5
    return round_bf16(linear_bf16(x, weights_proj).double() * multiplier)


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_h bf16(relu(bf16(q_h . k)) * w_h), each step in float64 rounded once to bf16; zeros +0.

    q [b, S, H, D], k [b, T, D], w [b, S, H] -> bf16 [b, S, T]."""
    dots = round_bf16(torch.einsum("bshd,btd->bsht", q.double(), k.double())).double().relu()
    terms = round_bf16(dots * w.double().unsqueeze(-1)).double()
    return round_bf16(terms.sum(dim=2) + 0.0)


def compress_lens(start: int, seqlen: int, ratio: int) -> torch.Tensor:
    """int64 [S]: compressed rows query t sees, (start + t + 1) // ratio."""
    return torch.arange(start + 1, start + seqlen + 1) // ratio


def hide_invisible(scores: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Rows >= lens[t] at -inf."""
    return scores.masked_fill(torch.arange(scores.shape[-1]) >= lens.unsqueeze(-1), NINF)


def select_ids(masked: torch.Tensor, lens: torch.Tensor, k_max: int, offset) -> torch.Tensor:
    """torch CPU top-k (sorted=False), ids ascending, where(id < lens, id + offset, -1), int32."""
    k = min(k_max, masked.shape[-1])
    picked = torch.topk(masked, k, dim=-1, largest=True, sorted=False).indices.sort(dim=-1).values
    return torch.where(picked < lens.unsqueeze(-1), picked + offset, -1).to(torch.int32)


def drop_non_candidates(ids: torch.Tensor, candidates: torch.Tensor, offset: int) -> torch.Tensor:
    """Policy `drop`: ids of rows outside the candidate set become -1; valid ids ascending, -1 tail."""
    valid = ids >= 0
    rows = torch.where(valid, ids.long() - offset, 0)
    kept = valid & candidates.gather(-1, rows)
    last = torch.iinfo(torch.int64).max
    ordered = torch.where(kept, ids.long(), last).sort(dim=-1).values
    return torch.where(ordered == last, -1, ordered).to(ids.dtype)


class IndexerOutput(NamedTuple):
    ids: torch.Tensor
    scores: torch.Tensor
    visible_scores: torch.Tensor
    masked_scores: torch.Tensor
    compress_lens: torch.Tensor
    query: torch.Tensor  # after RoPE, before its fp4 round trip


def indexer_forward(
    x: torch.Tensor,
    qr: torch.Tensor,
    keys: torch.Tensor,
    start: int,
    ratio: int,
    wq_b: torch.Tensor,
    weights_proj: torch.Tensor,
    freqs: torch.Tensor,
    rope_dim: int,
    index_topk: int,
    offset,
    candidates: torch.Tensor | None = None,
) -> IndexerOutput:
    """One indexer forward over x bf16 [b, S, dim]; freqs holds the (cos, sin) rows of positions
    start .. start+S-1; keys the published index keys, of which [:b, :T] are read."""
    b, S, _ = x.shape
    heads, head_dim = weights_proj.shape[0], keys.shape[-1]
    T = (start + S) // ratio
    query = rotate(linear_bf16(qr, wq_b).unflatten(-1, (heads, head_dim)), freqs, rope_dim)
    q = fp4_e8m0(query).y
    scores = index_scores(q, keys[:b, :T], head_weights(x, weights_proj, head_dim))
    lens = compress_lens(start, S, ratio)
    visible = hide_invisible(scores, lens)
    masked = visible if candidates is None else visible.masked_fill(~candidates, NINF)
    ids = select_ids(masked, lens, index_topk, offset) if T else torch.empty(b, S, 0, dtype=torch.int32)
    return IndexerOutput(ids, scores, visible, masked, lens, query)


def candidate_mask(logits: torch.Tensor, lens: torch.Tensor, topk_blocks: int, block: int) -> torch.Tensor:
    """bool [..., S, W]: the top blocks by block max, the newest reachable block pinned, -inf picks dropped."""
    width = logits.shape[-1]
    block_max = F.pad(logits, (0, -width % block), value=NINF).unflatten(-1, (-1, block)).amax(dim=-1)
    newest = torch.div(lens.reshape(-1, 1) - 1, block, rounding_mode="floor")
    ranked = block_max.masked_fill(torch.arange(block_max.shape[-1]) == newest, float("inf"))
    top = torch.topk(ranked, min(topk_blocks, ranked.shape[-1]), dim=-1)
    keep = torch.zeros_like(ranked, dtype=torch.bool).scatter_(-1, top.indices, top.values > NINF)
    return keep.repeat_interleave(block, dim=-1)[..., :width]


# ---------------------------------------------------------------------------------------------
# sparse_attn (K41:296-403) in float64
# ---------------------------------------------------------------------------------------------


def sparse_attn(
    q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor, ids: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """Tiles of 64 lanes in row order, running max from -1e30, bf16 P before P.V (as upstream);
    scores, exp, sums and the accumulator in float64; one rounding of acc / L to bf16."""
    b, m, h, d = q.shape
    q64 = q.double()
    run_max = torch.full((b, m, h), M_INIT, dtype=torch.float64)
    denom = torch.zeros((b, m, h), dtype=torch.float64)
    acc = torch.zeros((b, m, h, d), dtype=torch.float64)
    batch = torch.arange(b).view(-1, 1, 1)
    for t0 in range(0, ids.shape[-1], TILE):
        lanes = ids[:, :, t0 : t0 + TILE]
        present = lanes >= 0  # [b, m, t]
        rows = kv[batch, lanes.long().clamp(min=0)].double() * present.unsqueeze(-1)  # [b, m, t, d]
        s = torch.einsum("bmhd,bmtd->bmht", q64, rows) * softmax_scale
        s = s.masked_fill(~present.unsqueeze(2), NINF)
        new_max = torch.maximum(run_max, s.amax(dim=-1))
        alpha = torch.exp(run_max - new_max)
        p = torch.exp(s - new_max.unsqueeze(-1))
        denom = denom * alpha + p.sum(dim=-1)
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bmht,bmtd->bmhd", round_bf16(p).double(), rows)
        run_max = new_max
    denom = denom + torch.exp(attn_sink.double() - run_max)
    return round_bf16(acc / denom.unsqueeze(-1))


# ---------------------------------------------------------------------------------------------
# attention: the reference's bookkeeping with the float64 arithmetic above
# ---------------------------------------------------------------------------------------------


def _wo_a_einsum(equation: str, *operands: torch.Tensor) -> torch.Tensor:
    """wo_a einsum (its only use in attention): float64, rounded once to bf16, upstream's bf16 output.
    The reference casts this result to bf16, which is then a no-op."""
    return round_bf16(torch.einsum(equation, *(o.double() for o in operands)))


def _attention_compressor_step(x, start, ring, weights, ratio):
    return compressor_step(x, start, ring, weights.wkv, weights.wgate, weights.norm_w, weights.eps, ratio)


def _attention_indexer(x, qr, keys, start, ratio, weights, table, rope_dim, index_topk, offset, candidates=None):
    freqs = table[start : start + x.shape[1]]
    return indexer_forward(
        x, qr, keys, start, ratio, weights.wq_b, weights.weights_proj, freqs, rope_dim, index_topk, offset, candidates
    )


def _attention_candidates(logits, lens, topk_blocks, block):
    return SimpleNamespace(mask=candidate_mask(logits, lens, topk_blocks, block))


ATTENTION_ARITHMETIC = {
    "freqs_table": freqs_table,
    "project": linear_bf16,
    "rms_norm": rms_norm,
    "apply_rotary": rotate,
    "compressor_step": _attention_compressor_step,
    "kv_finish": kv_finish,
    "indexer_forward": _attention_indexer,
    "select_candidate_blocks": _attention_candidates,
    "sparse_attn": sparse_attn,
    "einsum_f32": _wo_a_einsum,
}


# ---------------------------------------------------------------------------------------------
# Components
# ---------------------------------------------------------------------------------------------


def _yarn_table(inputs, params):
    inv = yarn_inv_freq(
        int(params["dim"]),
        float(params["base"]),
        int(params.get("original_seq_len", 0)),
        float(params.get("factor", 16.0)),
        float(params.get("beta_fast", 32.0)),
        float(params.get("beta_slow", 1.0)),
    )
    return {"inv_freq": inv.float(), "table": table_rows(inv, inputs["positions"])}


def _rope_apply(inputs, params):
    return {"y": rotate(inputs["x"], inputs["table"], int(params["rope_dim"]), bool(params.get("inverse", False)))}


def _norm(inputs, params):
    return {"y": rms_norm(inputs["x"], inputs["weight"], float(params.get("eps", 1e-20)))}


def _linear_f32(inputs, params):
    return {"y": linear64(inputs["x"], inputs["w"]).float()}


def _e2m1(inputs, params):
    y = E2M1.round(inputs["v"].double())
    return {"codes": E2M1.bits(y), "y": y.float()}


def _quantiser(fn):
    def run(inputs, params):
        return fn(inputs["x"])._asdict()

    return run


def _compressor(inputs, params):
    step = compressor_step(
        inputs["x"],
        int(params["start"]),
        inputs["ring"],
        inputs["wkv"],
        inputs["wgate"],
        inputs["norm_w"],
        float(params.get("eps", 1e-20)),
        int(params.get("ratio", 2)),
    )
    return step._asdict()


def _kv_finish(inputs, params):
    ratio = int(params.get("ratio", 2))
    rows = kv_finish(
        inputs["latent"],
        inputs["groups"] * ratio,
        inputs["table"],
        int(params["rope_dim"]),
        inputs["wk"],
        inputs["k_norm_w"],
        float(params.get("eps", 1e-20)),
    )
    return {name: getattr(rows, name) for name in KV_FINISH_OUTPUTS}


def _indexer_weights(inputs, params):
    return {"weights": head_weights(inputs["x"], inputs["weights_proj"], int(params["index_head_dim"]))}


def _indexer_scores(inputs, params):
    return {"scores": index_scores(inputs["q"], inputs["k"], inputs["w"])}


def _leak_policy(ids, candidates, params):
    if params.get("candidate_leak", "upstream") == "drop":
        return drop_non_candidates(ids, candidates, int(params.get("offset", 0)))
    return ids


def _indexer_select(inputs, params):
    scores, candidates = inputs["scores"], inputs["candidates"]
    lens = compress_lens(int(params["start"]), scores.shape[1], int(params["ratio"]))
    masked = hide_invisible(scores, lens).masked_fill(~candidates, NINF)
    ids = select_ids(masked, lens, int(params["index_topk"]), int(params.get("offset", 0)))
    return {"ids": _leak_policy(ids, candidates, params)}


def _indexer(inputs, params):
    out = indexer_forward(
        inputs["x"],
        inputs["qr"],
        inputs["index_k_cache"],
        int(params["start"]),
        int(params["ratio"]),
        weight_input(inputs, "wq_b"),
        inputs["weights_proj"],
        inputs["freqs"],
        int(params["rope_dim"]),
        int(params["index_topk"]),
        int(params.get("offset", 0)),
        inputs["candidates"],
    )
    return {"ids": _leak_policy(out.ids, inputs["candidates"], params), "scores": out.scores, "index_q": out.query}


def _candidates_select(inputs, params):
    return {
        "mask": candidate_mask(
            inputs["logits"], inputs["compress_lens"], int(params["topk_blocks"]), int(params["block_size"])
        )
    }


def _topk(inputs, params):
    top = torch.topk(
        inputs["values"],
        int(params["k"]),
        dim=-1,
        largest=bool(params.get("largest", True)),
        sorted=bool(params.get("sorted", True)),
    )
    return {"values": top.values, "indices": top.indices}


def _sparse_attn(inputs, params):
    return {
        "o": sparse_attn(
            inputs["q"], inputs["kv"], inputs["attn_sink"], inputs["topk_idxs"], float(params["softmax_scale"])
        )
    }


def fp8_weight64(codes: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """float64 [N, K]: e4m3 codes times their 32 x 32 tile scales (exact)."""
    n, k = codes.shape
    tile = ((scale_bytes.long() - 127).double().exp2()).repeat_interleave(FP8_BLOCK, 0)[:n]
    return codes.view(torch.float8_e4m3fn).double() * tile.repeat_interleave(FP8_BLOCK, 1)


def _linear_fp8(inputs, params):
    """act_quant as the kernel decides it, then the whole GEMM in float64, one rounding to bf16."""
    q = fp8_ue8m0(inputs["x"])
    y = linear_bf16(inputs["x"], Fp8Weight(inputs["weight"], inputs["weight_scale"]))
    return {"y": y, "x_codes": q.codes, "x_scale_bytes": q.scale_bytes}


def _attention(inputs, params):
    """The reference's bookkeeping with every arithmetic helper swapped for its float64 version."""
    with mock.patch.multiple(ref_attention, **ATTENTION_ARITHMETIC):
        return ReferenceAdapter().run("attention", inputs, params)


HANDLERS = {
    "linear.fp8": _linear_fp8,
    "rope.yarn_table": _yarn_table,
    "rope.apply": _rope_apply,
    "norm.rms": _norm,
    "linear.f32": _linear_f32,
    "quant.e2m1": _e2m1,
    "quant.fp4_e4m3": _quantiser(fp4_e4m3),
    "quant.fp4_e8m0": _quantiser(fp4_e8m0),
    "quant.fp8_ue8m0": _quantiser(fp8_ue8m0),
    "compressor": _compressor,
    "kv.finish": _kv_finish,
    "indexer.weights": _indexer_weights,
    "indexer.scores": _indexer_scores,
    "indexer.select": _indexer_select,
    "indexer": _indexer,
    "candidates.select": _candidates_select,
    "topk.torch_cpu": _topk,
    "sparse_attn": _sparse_attn,
}


class Float64(Gate):
    """Every floating-point component in float64, rounded once at upstream's rounding points."""

    handlers = {**HANDLERS, "attention": _attention}


BareFloat64 = bare(Float64)
