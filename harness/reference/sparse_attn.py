"""Sparse attention over gathered KV rows with an attention sink (kernel.py K41:296-403).

`sparse_attn` is the reference kernel's arithmetic (docs/v41-reference.md §6.3), run on
CPU: for every query row and head, a running-max softmax over the row's index entries
in tiles of 64 (K41:328), in order, all in fp32 except that the probabilities are
rounded to bf16 before the P·V product (K41:377):

    M = -1e30 (finite, K41:352-355), L = 0, acc = 0
    per tile:  s_j  = fp32(q · kv_j) * softmax_scale        (-inf for an absent id -1)
               M'   = max(M, max_j s_j);  alpha = exp(M - M');  p_j = exp(s_j - M')
               L    = L * alpha + sum_j p_j                  (fp32 p)
               acc  = acc * alpha + sum_j bf16(p_j) * kv_j   (fp32 accumulate)
               M    = M'
    sink:      L   += exp(attn_sink[h] - M)   (raw logit: not scaled, not in the max,
                                               denominator only, no value row; K41:382-383)
    o = bf16(acc / L)

A row whose ids are all absent gives exactly 0 (L = exp(sink + 1e30) = inf). Because p is
rounded relative to the running max, the id order inside a row and the tile width change
results at the bf16-ulp level; keep both when comparing bit-for-bit.

`sparse_attn_plain` is one fp32 softmax over all lanes plus the sink, without bf16
rounding of p: the mathematical value, used to calibrate tolerances.

The kernel does no bounds check on ids; here an id >= n is an error.
"""

from __future__ import annotations

import torch

from v41_conformance.reference.numerics import einsum_f32, exp_f32, sum_f32

TILE = 64  # index entries per tile (K41:328)
M_INIT = -1e30  # running-max start (K41:352-355); -inf would make all-absent rows NaN


def _check(q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor, topk_idxs: torch.Tensor) -> None:
    if q.dim() != 4 or kv.dim() != 3 or topk_idxs.dim() != 3:
        raise ValueError(
            f"sparse_attn wants q [b,m,h,d], kv [b,n,d], topk_idxs [b,m,K]; got "
            f"{tuple(q.shape)}, {tuple(kv.shape)}, {tuple(topk_idxs.shape)}"
        )
    b, m, h, d = q.shape
    if kv.shape[0] != b or kv.shape[2] != d or tuple(topk_idxs.shape[:2]) != (b, m):
        raise ValueError(
            f"sparse_attn shape mismatch: q {tuple(q.shape)}, kv {tuple(kv.shape)}, "
            f"topk_idxs {tuple(topk_idxs.shape)} (b, m and d must agree)"
        )
    if tuple(attn_sink.shape) != (h,):
        raise ValueError(f"attn_sink must be [{h}] (one logit per head); got {tuple(attn_sink.shape)}")
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise ValueError(f"q and kv must be bfloat16; got {q.dtype}, {kv.dtype}")
    if topk_idxs.numel():
        lo, hi = int(topk_idxs.min()), int(topk_idxs.max())
        if lo < -1 or hi >= kv.shape[1]:
            raise ValueError(f"topk_idxs must lie in [-1, {kv.shape[1]}) (n = kv rows); got min {lo}, max {hi}")


def _gather(
    kv: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv rows for ids [b,m,T] -> (rows [b,m,T,d] in `dtype` with zero rows where absent, present).
    `kv` may already be in `dtype` (converted once per call rather than once per gathered row)."""
    present = ids >= 0  # [b,m,T]
    bidx = torch.arange(kv.shape[0]).view(-1, 1, 1)
    rows = kv[bidx, ids.long().clamp(min=0)].to(dtype)  # [b,m,T,d]
    return rows * present.unsqueeze(-1), present


def sparse_attn(
    q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor, topk_idxs: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """Tiled sparse attention with sink, the reference kernel's arithmetic.

    q bf16 [b,m,h,d]; kv bf16 [b,n,d] (K = V); attn_sink fp32 [h];
    topk_idxs int32 [b,m,K] (-1 absent); returns bf16 [b,m,h,d].
    """
    _check(q, kv, attn_sink, topk_idxs)
    b, m, h, d = q.shape
    scale = torch.tensor(softmax_scale, dtype=torch.float32)  # the kernel's fp32 constant
    # Products of bf16 values are exact in float64 and their sums too (einsum_f32's ideal fp32
    # accumulator): q and kv are widened once here rather than once per tile.
    q64 = q.double()  # [b,m,h,d]
    flat_kv = kv.double().reshape(-1, d)  # [b*n, d]
    base = (torch.arange(b) * kv.shape[1]).view(b, 1, 1)
    run_max = torch.full((b, m, h), M_INIT, dtype=torch.float32)  # M
    denom = torch.zeros((b, m, h), dtype=torch.float32)  # L
    acc = torch.zeros((b, m, h, d), dtype=torch.float32)
    buffer = torch.empty(b * m * min(TILE, topk_idxs.shape[-1]) * d, dtype=torch.float64)  # reused: fresh
    for t0 in range(0, topk_idxs.shape[-1], TILE):  # 100 MB tensors cost their page faults
        ids = topk_idxs[:, :, t0 : t0 + TILE]
        present = ids >= 0  # [b,m,T]
        rows = buffer[: ids.numel() * d].view(*ids.shape, d)  # [b,m,T,d]: kv rows, zero where absent
        torch.index_select(flat_kv, 0, (ids.long().clamp(min=0) + base).reshape(-1), out=rows.view(-1, d))
        rows.mul_(present.unsqueeze(-1))
        s = torch.einsum("bmhd,bmtd->bmht", q64, rows).float() * scale  # [b,m,h,T] fp32
        s = s.masked_fill(~present.unsqueeze(2), float("-inf"))
        new_max = torch.maximum(run_max, s.amax(dim=-1))  # [b,m,h]
        alpha = exp_f32(run_max - new_max)
        p = exp_f32(s - new_max.unsqueeze(-1))  # [b,m,h,T] fp32
        denom = denom * alpha + sum_f32(p, -1)
        p16 = p.to(torch.bfloat16).double()  # bf16 P before P·V
        acc.mul_(alpha.unsqueeze(-1)).add_(torch.einsum("bmht,bmtd->bmhd", p16, rows).float())
        run_max = new_max
    denom = denom + exp_f32(attn_sink.float().view(1, 1, h) - run_max)
    return (acc / denom.unsqueeze(-1)).to(torch.bfloat16)


def sparse_attn_plain(
    q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor, topk_idxs: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """One fp32 softmax over all lanes plus the sink (no tiling, no bf16 p), cast to bf16.

    o = sum_j e^{s_j} v_j / (sum_j e^{s_j} + e^{sink}); same shapes as `sparse_attn`.
    """
    _check(q, kv, attn_sink, topk_idxs)
    b, m, h, d = q.shape
    rows, present = _gather(kv, topk_idxs)  # [b,m,K,d], [b,m,K]
    s = einsum_f32("bmhd,bmkd->bmhk", q.float(), rows) * float(softmax_scale)
    s = s.masked_fill(~present.unsqueeze(2), float("-inf"))  # [b,m,h,K]
    sink = attn_sink.float().view(1, 1, h).expand(b, m, h)
    mx = torch.maximum(s.amax(dim=-1) if s.shape[-1] else sink, sink)  # [b,m,h], finite
    p = exp_f32(s - mx.unsqueeze(-1))
    denom = sum_f32(p, -1) + exp_f32(sink - mx)
    return (einsum_f32("bmhk,bmkd->bmhd", p, rows) / denom.unsqueeze(-1)).to(torch.bfloat16)
