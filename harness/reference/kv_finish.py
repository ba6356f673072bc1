"""What happens to the Compressor's pre-RoPE latent rows before they are cached (component
`kv.finish`): the main compressed-KV row and the index-key row.

Upstream (`docs/v41-reference.md` §3.4, §4.2 step 1, §2.4; M:537-548 and M:746-761):
- main row (M:758-760): RoPE on the last rope_dim channels at the group's FIRST position j*r
  (prefill `freqs[0 : S - S%r : r]`, decode `freqs[start_pos + 1 - r]`), then `fp4_act_quant`
  in place with block 16 and e4m3 scales over the whole post-RoPE vector -> bf16 row of
  `compress_kv_cache`.
- index-key row (owns_k index sources, M:537-548), from the same pre-RoPE latent (upstream
  computes it before the main branch rotates the latent in place):
  `k = k_norm(wk(latent))` (bf16 F.linear, RMSNorm -> bf16), RoPE on its last rope_dim
  channels at the same positions, `fp4_act_quant` block 32 with e8m0 scales -> `k_cache` row.

The reference stores the dequantised bf16 rows; this module also returns the bytes a kernel
would store: packed e2m1 nibbles (element 2i in the low nibble) and the scale bytes (e4m3fn bit
patterns for the main row, e8m0 biased exponents for the index key). Seed 000 §A.5 gives the
byte budgets (`cache_layout.py`).

The wk GEMM is exactly rounded per row (`numerics._accumulate`), so a row's value does not depend on
how many rows one step finished (see compressor.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from v41_conformance.reference import numerics as nx  # quantisers looked up at call time: one override point
from v41_conformance.reference.numerics import linear_bf16, pack_nibbles, rms_norm
from v41_conformance.reference.rope import apply_rotary

MAIN_BLOCK = 16  # M:760, e4m3 scales
INDEX_BLOCK = 32  # fp4_block_size, e8m0 scales


class KvFinish(NamedTuple):
    """Finished rows for G groups (b = batch).

    main:              bf16 [b, G, hd] post-RoPE, fp4/e4m3-QDQ row (what compress_kv_cache holds)
    main_rope:         bf16 [b, G, hd] post-RoPE, before quantisation
    main_packed:       uint8 [b, G, hd/2] e2m1 codes, two per byte
    main_scale_bytes:  uint8 [b, G, hd/16] float8_e4m3fn bit patterns
    index_k:           bf16 [b, G, ihd] post-RoPE, fp4/e8m0-QDQ index key (None without wk)
    index_norm:        bf16 [b, G, ihd] k_norm(wk(latent)), before RoPE (None without wk)
    index_rope:        bf16 [b, G, ihd] post-RoPE index key, before quantisation (None without wk)
    index_packed:      uint8 [b, G, ihd/2] (None without wk)
    index_scale_bytes: uint8 [b, G, ihd/32] e8m0 biased exponents (None without wk)
    """

    main: torch.Tensor
    main_rope: torch.Tensor
    main_packed: torch.Tensor
    main_scale_bytes: torch.Tensor
    index_k: torch.Tensor | None
    index_norm: torch.Tensor | None
    index_packed: torch.Tensor | None
    index_scale_bytes: torch.Tensor | None
    index_rope: torch.Tensor | None = None


def rope_rows(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """fp32 [G, rope_dim/2, 2]: the table rows of the given positions (int64 [G])."""
    if positions.dtype != torch.int64 or positions.ndim != 1:
        raise ValueError(f"positions must be int64 [G], got {positions.dtype} {tuple(positions.shape)}")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= table.shape[0]):
        raise ValueError(
            f"row positions {positions.tolist()} fall outside the RoPE table of {table.shape[0]} "
            "positions; build freqs_table with seqlen > the largest position"
        )
    return table[positions]


def finish_main(
    latent: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, rope_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Main compressed-KV rows: (rope bf16, y bf16, packed uint8, scale bytes uint8).

    latent bf16 [b, G, hd] pre-RoPE; positions int64 [G] = each group's first position j*r.
    """
    _check_latent(latent, positions)
    rope = apply_rotary(latent, rope_rows(table, positions), rope_dim)  # [b, G, hd] bf16
    q = nx.fp4_qdq_e4m3(rope, MAIN_BLOCK)
    return rope, q.y, pack_nibbles(q.codes), q.scale_bytes


def finish_index(
    latent: torch.Tensor,
    positions: torch.Tensor,
    wk: torch.Tensor,
    k_norm_w: torch.Tensor,
    table: torch.Tensor,
    rope_dim: int,
    eps: float = 1e-20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index keys from the pre-RoPE latent: (norm bf16, rope bf16, y bf16, packed uint8, scale bytes uint8).

    wk bf16 [ihd, hd]; k_norm_w [ihd]. k = rms_norm(linear_bf16(latent, wk)) row by row, RoPE
    on its last rope_dim channels at `positions`, fp4 QDQ with e8m0 scales, block 32.
    """
    _check_latent(latent, positions)
    norm = rms_norm(linear_bf16(latent, wk), k_norm_w, eps)  # [b, G, ihd] bf16, each row exactly rounded
    rope = apply_rotary(norm, rope_rows(table, positions), rope_dim)
    q = nx.fp4_qdq_e8m0(rope, INDEX_BLOCK)
    return norm, rope, q.y, pack_nibbles(q.codes), q.scale_bytes


def kv_finish(
    latent: torch.Tensor,
    positions: torch.Tensor,
    table: torch.Tensor,
    rope_dim: int,
    wk: torch.Tensor | None = None,
    k_norm_w: torch.Tensor | None = None,
    eps: float = 1e-20,
) -> KvFinish:
    """Both cache rows of G completed groups; the index branch only when wk/k_norm_w are given
    (a kv source whose indexer owns its keys).

    latent: bf16 [b, G, hd] (compressor rows, pre-RoPE); positions: int64 [G], the compressor's
    row_positions (j*r); table: freqs_table(...) of the layer, fp32 [seqlen, rope_dim/2, 2].
    """
    rope, main, main_packed, main_scales = finish_main(latent, positions, table, rope_dim)
    if (wk is None) != (k_norm_w is None):
        raise ValueError("give both wk and k_norm_w (index branch) or neither")
    if wk is None:
        return KvFinish(main, rope, main_packed, main_scales, None, None, None, None)
    assert k_norm_w is not None  # given with wk (checked above)
    norm, index_rope, index_k, index_packed, index_scales = finish_index(
        latent, positions, wk, k_norm_w, table, rope_dim, eps
    )
    return KvFinish(main, rope, main_packed, main_scales, index_k, norm, index_packed, index_scales, index_rope)


def _check_latent(latent: torch.Tensor, positions: torch.Tensor) -> None:
    if latent.dtype != torch.bfloat16 or latent.ndim != 3:
        raise ValueError(f"latent must be bf16 [b, G, hd], got {latent.dtype} {tuple(latent.shape)}")
    if positions.shape != (latent.shape[1],):
        raise ValueError(
            f"need one position per latent row: latent has G = {latent.shape[1]}, positions {tuple(positions.shape)}"
        )
