"""DeepSeek-V4.1 compressed-attention arithmetic as upstream evaluates it, in plain torch on CPU.

Every function uses the torch ops, dtypes and operation order of upstream `inference/model.py`
(M:) and the arithmetic of `inference/kernel.py` (K41:) as docs/v41-reference.md describes them:
fp32 or bf16 GEMMs through torch's own kernels, fp32 exp/rsqrt/cos/sin, bf16 rounding where
upstream rounds. Nothing here accumulates in float64 or calls `v41_conformance.reference`.

Quantiser outputs use the harness encodings: e2m1 code = bit 3 sign, bits 0-2 index into
E2M1_GRID; fp8 codes are float8_e4m3fn bit patterns; an e8m0 scale byte is the biased exponent;
an e4m3 scale byte is the float8_e4m3fn bit pattern.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

NINF = float("-inf")
FP8_BLOCK = 32  # fp8_block_size (M:23-30)
FP4_BLOCK = 32  # fp4_block_size (M:23-30), E8M0 scales
FP4_KV_BLOCK = 16  # compressed-KV fp4 block, E4M3 scales (M:760)
E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ATTN_TILE = 64  # index lanes per sparse_attn tile (K41:328)
ATTN_MAX_INIT = -1e30  # running-max start (K41:352-355)

_SIGNED_GRID = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=torch.float32)  # by code
_E2M1_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_GRID, E2M1_GRID[1:])], dtype=torch.float32)
_ODD_LOWER_CODE = torch.arange(len(E2M1_GRID) - 1) % 2 == 1  # midpoint i lies between codes i and i + 1


class Quantised(NamedTuple):
    """y bf16 [..., D] (dequantised), codes uint8 [..., D], scale_bytes uint8 [..., D / block]."""

    y: torch.Tensor
    codes: torch.Tensor
    scale_bytes: torch.Tensor


# --- norm and linear --------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm.forward (M:281-293): fp32 mean of squares, rsqrt, weight promoted, cast back."""
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (weight * (xf * torch.rsqrt(var + eps))).to(x.dtype)


def linear(x: torch.Tensor, w) -> torch.Tensor:
    """`linear()` (M:181-207): an fp8 weight, given as (e4m3 codes, e8m0 tile scale bytes), goes
    through act_quant + fp8_gemm; any other through F.linear in the operands' dtype."""
    if isinstance(w, tuple):
        return fp8_linear(x, *w)[0]
    return F.linear(x, w)


# --- RoPE -------------------------------------------------------------------------------------


def yarn_inv_freq(
    dim: int,
    base: float,
    original_seq_len: int,
    factor: float,
    beta_fast: float,
    beta_slow: float,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """fp32 [dim/2] inverse frequencies with the YaRN blend when original_seq_len > 0 (M:368-385), on
    `device` (upstream builds its tables on the default device, the GPU's)."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    if original_seq_len <= 0:
        return freqs
    low, high = _yarn_correction_range(dim, base, original_seq_len, beta_fast, beta_slow)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / max(high - low, 1e-3)).clamp(0, 1)
    smooth = 1 - ramp
    return freqs / factor * (1 - smooth) + freqs * smooth


def _yarn_correction_range(
    dim: int, base: float, original_seq_len: int, beta_fast: float, beta_slow: float
) -> tuple[int, int]:
    """(low, high) pair indices of the YaRN ramp, in Python double (M:376-381)."""

    def corr(rotations: float) -> float:
        return dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    return max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)


def precompute_freqs_cis(
    dim: int,
    seqlen: int,
    original_seq_len: int,
    base: float,
    factor: float,
    beta_fast: float,
    beta_slow: float,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """complex64 [seqlen, dim/2] = polar(1, outer(arange(seqlen), inv_freq)) (M:368-389), on `device`."""
    inv = yarn_inv_freq(dim, base, original_seq_len, factor, beta_fast, beta_slow, device)
    return freqs_cis_rows(torch.arange(seqlen, device=device), inv)


def freqs_cis_rows(positions: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """The rows of precompute_freqs_cis at int64 `positions` (each row depends on its position only)."""
    angles = torch.outer(positions, inv)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """apply_rotary_emb (M:392-406) on the last 2 * freqs_cis.shape[-1] channels, out of place.

    x [b, s, d] or [b, s, h, d]; freqs_cis complex64 [s, rope_dim/2] (heads share a row).
    """
    rope_dim = 2 * freqs_cis.shape[-1]
    tail = torch.view_as_complex(x[..., -rope_dim:].float().unflatten(-1, (-1, 2)))
    rows = freqs_cis.conj() if inverse else freqs_cis
    rows = rows.view(1, tail.size(1), *([1] * (tail.ndim - 3)), tail.size(-1))
    out = x.clone()
    out[..., -rope_dim:] = torch.view_as_real(tail * rows).flatten(-2)  # one cast back to x.dtype
    return out


# --- quantisers (kernel.py) ---------------------------------------------------------------------


def pow2_ceil(y: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(y)) of positive normal fp32 y on its IEEE bits (K41:22-38)."""
    bits = y.contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exponent << 23).view(torch.float32)


def e8m0_byte(scale: torch.Tensor) -> torch.Tensor:
    """Biased exponent byte of a power-of-two fp32 scale (e8m0 storage, M:23-30)."""
    return ((scale.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, RNE, saturating at +-448 like CUDA's satfinite cast (K41:81-89)."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e2m1_code(v: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes of fp32 v in [-6, 6]: nearest grid value, ties to the even code (T.Cast FP4)."""
    mag = v.abs().unsqueeze(-1)
    mids, odd = _E2M1_MIDPOINTS.to(v.device), _ODD_LOWER_CODE.to(v.device)  # the grid follows its input
    index = (mag > mids).sum(-1) + ((mag == mids) & odd).sum(-1)
    return index.to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3)


def e2m1_value(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of uint8 e2m1 codes (code 8 is -0.0)."""
    return _SIGNED_GRID.to(codes.device)[codes.long()]


def act_quant(x: torch.Tensor, block: int = FP8_BLOCK) -> Quantised:
    """act_quant(x, 32, "ue8m0") fake-quant (K41:41-113): fp8 e4m3, power-of-two scales."""
    xb = x.float().unflatten(-1, (-1, block))
    amax = xb.abs().amax(-1).clamp_min(1e-4)
    scale = pow2_ceil(amax * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32))
    q = e4m3(xb / scale.unsqueeze(-1))
    y = (q.float() * scale.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    return Quantised(y, q.view(torch.uint8).flatten(-2), e8m0_byte(scale))


def fp8_linear(
    x: torch.Tensor, w_codes: torch.Tensor, w_scale_bytes: torch.Tensor, promote: int = FP8_BLOCK
) -> tuple[torch.Tensor, Quantised]:
    """`linear()` with an fp8 weight (M:181-207): act_quant, then fp8_gemm (K41:202-293) in fp32
    torch ops: per K block of 32 an fp32 matmul of the e4m3 values (torch's order), times the
    activation and tile scales, added to an fp32 accumulator; bf16 out. Returns (y, the act_quant).

    promote: K columns summed in a local fp32 accumulator before it joins the output's (32, every
    block straight in as kernel.py does; 128, a tensor core's promotion interval)."""
    q = act_quant(x)
    n, k = w_codes.shape
    nb, per = k // FP8_BLOCK, max(1, promote // FP8_BLOCK)
    qa = q.codes.view(torch.float8_e4m3fn).float().reshape(-1, nb, FP8_BLOCK).transpose(0, 1).contiguous()
    qw = w_codes.view(torch.float8_e4m3fn).float().T.reshape(nb, FP8_BLOCK, n)  # [K/32, 32, N]
    sa = (q.scale_bytes.to(torch.int32) << 23).view(torch.float32).reshape(-1, nb)
    sw = (
        (w_scale_bytes.to(torch.int32) << 23).view(torch.float32).repeat_interleave(FP8_BLOCK, dim=0)[:n].T.contiguous()
    )
    m = qa.shape[1]
    acc, block = torch.zeros(m, n, device=qa.device), torch.empty(m, n, device=qa.device)
    local = torch.zeros(m, n, device=qa.device) if per > 1 else None
    for kb in range(nb):  # the buffers are reused: a fresh [M, N] tensor per block costs more than its matmul
        torch.mm(qa[kb], qw[kb], out=block)
        block.mul_(sa[:, kb : kb + 1]).mul_(sw[kb])
        if local is None:
            acc.add_(block)
            continue
        local.add_(block)
        if (kb + 1) % per == 0 or kb == nb - 1:
            acc.add_(local)
            local.zero_()
    return acc.reshape(*x.shape[:-1], n).to(torch.bfloat16), q


def fp4_act_quant_e8m0(x: torch.Tensor, block: int = FP4_BLOCK) -> Quantised:
    """fp4_act_quant with E8M0 scales (K41:163-170): s = pow2_ceil(amax * fp32(1/6))."""
    xb = x.float().unflatten(-1, (-1, block))
    amax = xb.abs().amax(-1).clamp_min(E2M1_MAX * 2.0**-126)
    scale = pow2_ceil(amax * torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32))
    y, codes = _fp4_round_trip(xb, scale)
    return Quantised(y, codes, e8m0_byte(scale))


def fp4_act_quant_e4m3(x: torch.Tensor, block: int = FP4_KV_BLOCK) -> Quantised:
    """fp4_act_quant with E4M3 scales (K41:158-161, 165-170): s = e4m3(amax / 6.0)."""
    xb = x.float().unflatten(-1, (-1, block))
    amax = xb.abs().amax(-1).clamp_min(E2M1_MAX * 2.0**-9)
    scale8 = e4m3(amax / E2M1_MAX)
    y, codes = _fp4_round_trip(xb, scale8.float())
    return Quantised(y, codes, scale8.view(torch.uint8))


def _fp4_round_trip(xb: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared fp4 tail (K41:165-170): codes of clamp(x / s, -6, 6), y = bf16(e2m1 * s)."""
    codes = e2m1_code((xb / scale.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX))
    y = (e2m1_value(codes) * scale.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    return y, codes.flatten(-2)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 4-bit codes [..., D] -> bytes [..., D/2], element 2i low (harness storage; upstream keeps bf16)."""
    pairs = codes.unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


# --- sparse attention (kernel.py) ---------------------------------------------------------------


def sparse_attn(
    q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor, topk_idxs: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """sparse_attn kernel arithmetic (K41:296-403): fp32 running max over 64-lane tiles, bf16 P.

    q bf16 [b, m, h, d]; kv bf16 [b, n, d] (K = V); attn_sink fp32 [h]; topk_idxs int32 [b, m, K].
    """
    b, m, h, d = q.shape
    scale = torch.tensor(softmax_scale, dtype=torch.float32)
    qf = q.float()
    run_max = torch.full((b, m, h), ATTN_MAX_INIT, dtype=torch.float32, device=q.device)
    denom = torch.zeros((b, m, h), dtype=torch.float32, device=q.device)
    acc = torch.zeros((b, m, h, d), dtype=torch.float32, device=q.device)
    for lo in range(0, topk_idxs.shape[-1], ATTN_TILE):
        rows, present = _gather_tile(kv, topk_idxs[..., lo : lo + ATTN_TILE])
        scores = torch.einsum("bmhd,bmtd->bmht", qf, rows) * scale
        scores = scores.masked_fill(~present.unsqueeze(2), NINF)
        new_max = torch.maximum(run_max, scores.amax(-1))
        alpha = torch.exp(run_max - new_max)
        p = torch.exp(scores - new_max.unsqueeze(-1))
        denom = denom * alpha + p.sum(-1)
        p_bf16 = p.to(torch.bfloat16).float()  # K41:377
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bmht,bmtd->bmhd", p_bf16, rows)
        run_max = new_max
    denom = denom + torch.exp(attn_sink.float() - run_max)  # sink: denominator only (K41:382-383)
    return (acc / denom.unsqueeze(-1)).to(torch.bfloat16)


def _gather_tile(kv: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 kv rows [b, m, T, d] for ids [b, m, T], zero where id = -1 (K41:365-368), and the present mask."""
    present = ids >= 0
    batch = torch.arange(kv.shape[0], device=kv.device).view(-1, 1, 1)
    rows = kv[batch, ids.clamp_min(0).long()].float()
    return torch.where(present.unsqueeze(-1), rows, 0.0), present


# --- indexer (M:527-580) and candidate blocks (M:583-610) ------------------------------------------


def index_head_weights(x: torch.Tensor, weights_proj: torch.Tensor, index_head_dim: int) -> torch.Tensor:
    """w = weights_proj(x) * (index_head_dim^-0.5 * index_n_heads^-0.5), bf16 (M:555)."""
    index_n_heads = weights_proj.shape[0]
    return linear(x, weights_proj) * (index_head_dim**-0.5 * index_n_heads**-0.5)


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """bf16 [b, S, T] = sum_h relu(einsum(q, k)) * w, every step in bf16 as upstream (M:556-557)."""
    scores = torch.einsum("bshd,btd->bsht", q, k)
    return (scores.relu_() * w.unsqueeze(-1)).sum(dim=2)


def query_compress_lens(start: int, seqlen: int, ratio: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [S]: (start + t + 1) // ratio, rows query t sees (M:563-567, harness generalisation)."""
    return (torch.arange(seqlen, device=device) + start + 1) // ratio


def mask_invisible(scores: torch.Tensor, compress_lens: torch.Tensor) -> torch.Tensor:
    """scores [b, S, T] with rows >= compress_lens[t] at -inf: what query t may see (M:563-567)."""
    return scores.masked_fill(torch.arange(scores.shape[-1], device=scores.device) >= compress_lens.view(-1, 1), NINF)


def select_topk(
    scores: torch.Tensor,
    compress_lens: torch.Tensor,
    index_topk: int,
    offset: int,
    candidates: torch.Tensor | None = None,
) -> torch.Tensor:
    """int32 [b, S, min(index_topk, T)] ids: visibility, candidate mask, top-k, sort, where (M:563-580)."""
    T = scores.shape[-1]
    lens = compress_lens.view(-1, 1)
    scores = mask_invisible(scores, compress_lens)
    if candidates is not None:
        scores = scores.masked_fill(~candidates, NINF)
    idx = scores.topk(min(index_topk, T), dim=-1, sorted=False).indices
    idx = idx.sort(dim=-1).values
    return torch.where(idx < lens, idx + offset, -1).int()


def drop_non_candidates(ids: torch.Tensor, candidates: torch.Tensor, offset: int) -> torch.Tensor:
    """Harness `drop` leak policy (§4.4): ids outside the candidate set become -1; valid ids stay first."""
    rows = (ids.long() - offset).clamp_min(0)
    keep = (ids >= 0) & candidates.gather(-1, rows)
    order = torch.argsort((~keep).to(torch.uint8), dim=-1, stable=True)
    return torch.where(keep.gather(-1, order), ids.gather(-1, order), -1)


def indexer_forward(
    x: torch.Tensor,
    qr: torch.Tensor,
    index_k: torch.Tensor,
    wq_b: torch.Tensor,
    weights_proj: torch.Tensor,
    freqs_cis: torch.Tensor,
    start: int,
    ratio: int,
    index_topk: int,
    offset: int,
    candidates: torch.Tensor | None,
    with_query: bool = False,
):
    """Indexer.forward query side (M:550-580) -> (ids int32 [b, S, k], scores bf16 [b, S, T]), and
    with `with_query` the query before its fp4 round trip (bf16 [b, S, H, D]) as well."""
    b, S, _ = x.shape
    n_heads, head_dim = weights_proj.shape[0], index_k.shape[-1]
    T = (start + S) // ratio
    query = apply_rotary_emb(linear(qr, wq_b).unflatten(-1, (n_heads, head_dim)), freqs_cis)
    q = fp4_act_quant_e8m0(query).y
    w = index_head_weights(x, weights_proj, head_dim)
    scores = index_scores(q, index_k[:b, :T], w)
    if T == 0:  # upstream does not call the indexer before a row exists (M:722-737)
        ids = torch.empty((b, S, 0), dtype=torch.int32, device=x.device)
    else:
        ids = select_topk(scores, query_compress_lens(start, S, ratio, x.device), index_topk, offset, candidates)
    return (ids, scores, query) if with_query else (ids, scores)


def select_candidate_blocks(
    logits: torch.Tensor, compress_lens: torch.Tensor, topk_blocks: int, block_size: int
) -> torch.Tensor:
    """bool [..., S, W] rows of the kept blocks (M:583-610): block max, newest block pinned, top-k."""
    W = logits.shape[-1]
    padded = F.pad(logits, (0, -W % block_size), value=NINF)
    block_scores = padded.unflatten(-1, (-1, block_size)).amax(dim=-1)
    nb = block_scores.shape[-1]
    newest = (compress_lens.view(-1, 1) - 1) // block_size  # -1 when nothing is reachable
    block_scores = block_scores.masked_fill(torch.arange(nb, device=newest.device) == newest, float("inf"))
    top = block_scores.topk(min(topk_blocks, nb), dim=-1)
    keep = torch.zeros_like(block_scores, dtype=torch.bool).scatter(-1, top.indices, top.values > NINF)
    return keep.repeat_interleave(block_size, dim=-1)[..., :W]


# --- compressor (M:429-485) ---------------------------------------------------------------------


def compress_ratio1(x: torch.Tensor, wkv: torch.Tensor, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """Ratio-1 Compressor (M:461-462): rms_norm(bf16 wkv(x)), bf16 [b, S, hd]."""
    return rms_norm(linear(x, wkv), norm_w, eps)


def compressor_projections(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor):
    """Ratio-2 fp32 projections of x.float() (M:466-468): (latent, score), each fp32 [b, S, hd]."""
    xf = x.float()
    return linear(xf, wkv.float()), linear(xf, wgate.float())


def pool_groups(latent: torch.Tensor, score: torch.Tensor, member_dim: int) -> torch.Tensor:
    """fp32 sum over a group's members of latent * softmax(score) (M:470-473, M:479-481)."""
    return (latent * score.softmax(dim=member_dim)).sum(dim=member_dim)


def finish_rows(pooled: torch.Tensor, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """Compressor output rows: rms_norm(pooled.to(bf16)) (M:474-475, M:482)."""
    return rms_norm(pooled.to(torch.bfloat16), norm_w, eps)


class CompressorStep(NamedTuple):
    """rows bf16 [b, G, hd]: pre-RoPE latents of the G groups the step closed; row_positions int64 [G]:
    each group's first position; ring fp32 [b, slots, 2, hd]: the harness ring after the step."""

    rows: torch.Tensor
    row_positions: torch.Tensor
    ring: torch.Tensor


def compressor_forward(
    x: torch.Tensor,
    start: int,
    ring: torch.Tensor,
    ratio: int,
    wkv: torch.Tensor,
    norm_w: torch.Tensor,
    eps: float,
    wgate: torch.Tensor | None = None,
) -> CompressorStep:
    """Compressor.forward(x, start) (M:429-485) for x bf16 [b, S, dim] at positions start .. start+S-1.

    Ratio 1 takes any chunk at any start and keeps no state. Ratio 2 takes upstream's two step
    kinds only: a prefill at 0 or one token at start > 0. Its kv_state/score_state live in the
    harness ring (docs/schedules.md): slot p % slots holds (score, latent) of position p.
    """
    S = x.shape[1]
    if ratio == 1:
        return CompressorStep(
            compress_ratio1(x, wkv, norm_w, eps), torch.arange(start, start + S, device=x.device), ring
        )
    if start > 0 and S != 1:
        raise ValueError(f"ratio-2 step [{start}, {start + S}): upstream decodes one token per call after the prefill")
    latent, score = compressor_projections(x, wkv, wgate)
    ring = ring.clone()
    step = _ratio2_prefill if start == 0 else _ratio2_decode
    return step(latent, score, ring, start, norm_w, eps)


def _ratio2_prefill(latent, score, ring, start, norm_w, eps) -> CompressorStep:
    """M:466-475: pool the chunk's whole groups at once; the odd last position goes to the ring."""
    b, S, hd = latent.shape
    closed = S - S % 2
    if closed < S:
        _write_slot(ring, closed, score[:, closed], latent[:, closed])
    pooled = pool_groups(latent[:, :closed].view(b, -1, 2, hd), score[:, :closed].view(b, -1, 2, hd), 2)
    return CompressorStep(finish_rows(pooled, norm_w, eps), torch.arange(0, closed, 2, device=ring.device), ring)


def _ratio2_decode(latent, score, ring, position, norm_w, eps) -> CompressorStep:
    """M:476-482: store the token in its slot; when it closes a group, pool the group's two slots."""
    _write_slot(ring, position, score[:, 0], latent[:, 0])
    if position % 2 == 0:
        return CompressorStep(
            torch.empty(ring.shape[0], 0, ring.shape[-1], dtype=torch.bfloat16, device=ring.device),
            torch.empty(0, dtype=torch.int64, device=ring.device),
            ring,
        )
    group = ring[:, [(position - 1) % ring.shape[1], position % ring.shape[1]]]  # [b, 2, 2, hd]
    pooled = pool_groups(group[:, :, 1], group[:, :, 0], 1)
    return CompressorStep(
        finish_rows(pooled.unsqueeze(1), norm_w, eps), torch.tensor([position - 1], device=ring.device), ring
    )


def _write_slot(ring: torch.Tensor, position: int, score: torch.Tensor, latent: torch.Tensor) -> None:
    """Harness ring layout: slot position % slots holds (score, latent) of that position."""
    slot = position % ring.shape[1]
    ring[:, slot, 0] = score
    ring[:, slot, 1] = latent
