"""Rotary position embedding of DeepSeek-V4.1: the YaRN frequency table and the interleaved
rotation of the last `rope_dim` channels.

Upstream anchors (`docs/v41-reference.md` §2; `M:` = `inference/model.py` @ dba1be0a):
- `yarn_inv_freq`, `freqs_table`: `precompute_freqs_cis` (M:368-389, doc §2.1).
- `apply_rotary`: `apply_rotary_emb` (M:392-406, doc §2.3), out of place here.

Every torch expression below is the one upstream evaluates, in the same order and dtypes, so the
CPU table is bit-identical to upstream's table when computed on the CPU. Upstream builds it on
CUDA, where `tensor / python_scalar` multiplies by the fp32 reciprocal and pow/sin/cos are other
implementations; a CUDA table can differ from this one by fp32 ulps (doc §13 item 6).

Table layout: fp32 [seqlen, dim/2, 2] holding (cos, sin) = `view_as_real` of upstream's
complex64 `freqs_cis` [seqlen, dim/2]; row p is position p, pair i uses frequency i.
"""

from __future__ import annotations

import math

import torch


def yarn_correction_range(
    dim: int, base: float, original_seq_len: int, beta_fast: float, beta_slow: float
) -> tuple[int, int]:
    """YaRN ramp bounds (low, high) in pair indices, Python double as upstream (M:376-381).

    corr(r) = dim * ln(original_seq_len / (r * 2 pi)) / (2 ln base): the pair whose wavelength
    fits r rotations into the original context. low = max(floor(corr(beta_fast)), 0),
    high = min(ceil(corr(beta_slow)), dim - 1). Production (64, 160000, 65536, 32, 1): (15, 25).
    """

    def corr(rotations: float) -> float:
        return dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), dim - 1)
    return low, high


def yarn_inv_freq(
    dim: int,
    base: float,
    original_seq_len: int = 0,
    factor: float = 16.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """fp32 [dim/2] inverse frequencies, with the YaRN blend when original_seq_len > 0.

    inv[i] = 1 / base^(2i/dim) (fp32 pow of a Python float by an fp32 tensor, then 1.0 / it).
    YaRN: ramp[i] = clamp((i - low) / max(high - low, 1e-3), 0, 1), smooth = 1 - ramp,
    inv = inv / factor * (1 - smooth) + inv * smooth: pairs up to `low` keep their frequency,
    pairs from `high` on are divided by `factor`. No mscale/temperature anywhere.
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"rope dim must be a positive even number, got {dim}")
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # [dim/2]
    if original_seq_len > 0:
        low, high = yarn_correction_range(dim, base, original_seq_len, beta_fast, beta_slow)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


def freqs_table(
    dim: int,
    seqlen: int,
    base: float,
    original_seq_len: int = 0,
    factor: float = 16.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """fp32 [seqlen, dim/2, 2]: (cos, sin) of angle[p, i] = fp32(p) * inv[i].

    The angle is torch.outer(arange(seqlen) int64, inv fp32), which promotes to fp32 with one
    rounding of the product; the table is torch.polar(1, angle) viewed as real.
    `original_seq_len = 0` gives the plain table (ratio-0 layers, `rope_theta`).

    Example: freqs_table(64, 4096, 160000.0, 65536, 16, 32, 1) is the production table of
    every compressed layer; freqs_table(64, 4096, 10000.0) that of the window-only layers.
    """
    if seqlen < 0:
        raise ValueError(f"seqlen must be >= 0, got {seqlen}")
    inv = yarn_inv_freq(dim, base, original_seq_len, factor, beta_fast, beta_slow)
    return table_rows(inv, torch.arange(seqlen))


def table_rows(inv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """fp32 [P, dim/2, 2]: (cos, sin) of angle = fp32(p) * inv for the given int64 positions.

    The angle is rounded to fp32 once, as upstream's torch.outer. Its cos and sin are evaluated in
    float64 and rounded once: torch's vectorised fp32 polar/sin/cos differ in the last bit
    between CPU instruction sets, and goldens must not.
    """
    angle = torch.outer(positions, inv)  # [P, dim/2] fp32
    a64 = angle.double()
    return torch.stack([torch.cos(a64), torch.sin(a64)], dim=-1).float().contiguous()


def apply_rotary(x: torch.Tensor, table: torch.Tensor, rope_dim: int, inverse: bool = False) -> torch.Tensor:
    """Rotate the LAST `rope_dim` channels of `x` by the table rows; returns a new tensor.

    x: [S, D], [B, S, D] or [B, S, H, D] (as upstream, the token axis is 1 for 3-D and 4-D
    input; heads share a row). table: fp32 [S, rope_dim/2, 2], the rows of the S tokens'
    positions, e.g. freqs_table(...)[start_pos : start_pos + S].

    Channels (2i, 2i+1) of the tail are the complex number i. As upstream: upcast the tail to
    fp32, view as complex64, multiply by the complex64 rows (their conjugate when `inverse`),
    and cast back to x.dtype once (RNE). Channels before the tail are copied bit for bit; `x`
    itself is not modified (upstream rotates in place).
    """
    if x.ndim not in (2, 3, 4):
        raise ValueError(
            f"apply_rotary takes [S, D], [B, S, D] or [B, S, H, D]; got shape {tuple(x.shape)} "
            "(reshape so the token axis is 0 for 2-D, 1 otherwise)"
        )
    if rope_dim <= 0 or rope_dim % 2 or rope_dim > x.shape[-1]:
        raise ValueError(f"rope_dim must be even and in (0, {x.shape[-1]}], got {rope_dim}")
    seq = x.shape[0] if x.ndim == 2 else x.shape[1]
    if table.dtype != torch.float32 or tuple(table.shape) != (seq, rope_dim // 2, 2):
        raise ValueError(
            f"apply_rotary: table must be fp32 [{seq}, {rope_dim // 2}, 2] (one row per token of x "
            f"{tuple(x.shape)}); got {table.dtype} {tuple(table.shape)}. Slice the rows of the "
            "tokens' positions from freqs_table(...)"
        )
    rows = torch.view_as_complex(table.contiguous())  # [S, rope_dim/2] complex64
    if inverse:
        rows = rows.conj()
    if x.ndim == 3:
        rows = rows.view(1, seq, rope_dim // 2)
    elif x.ndim == 4:
        rows = rows.view(1, seq, 1, rope_dim // 2)
    tail = torch.view_as_complex(x[..., -rope_dim:].float().unflatten(-1, (-1, 2)))  # [..., rope_dim/2]
    rotated = torch.view_as_real(tail * rows).flatten(-2)  # [..., rope_dim] fp32
    out = x.clone()
    out[..., -rope_dim:] = rotated  # one RNE cast to x.dtype
    return out
