"""Cache byte budgets of a compressed-attention layer (component `cache.bytes`), as exact ints.

Logical payload per row = quantised elements + one scale byte per scale block (seed 000 §A.5,
`docs/v41-reference.md` §3.4 "Deployment bytes per row"):

- FP8 main (e4m3 payload, one ue8m0 scale byte per 32 values, the window format of §5.3):
  `hd + hd/32`, 512 + 16 = 528 at hd 512.
- FP4 main (e2m1 nibbles, one e4m3 scale byte per 16 values, the compressed-KV format of
  M:760 / §6.2): `hd/2 + hd/16`, 256 + 32 = 288 at hd 512.
- FP4 index (e2m1 nibbles, one ue8m0 scale byte per 32 values, the index-key format of
  M:537-548 / §4.2): `index_hd/2 + index_hd/32`, 64 + 4 = 68 at index_hd 128.
- C2 state (the live score/latent ring of `compressor.py`, fp32): `S * 2 * hd * 4`,
  7 * 2 * 512 * 4 = 28,672 at S = 7 (r = 2, q_max = 6). Ratio 1 keeps no state: 0 bytes.

An allocator block covers B token positions; a ratio-r cache holds B / r completed rows of it
(B % r must be 0). A 128-position C2 block: 64 rows, 33,792 B (FP8 main), 18,432 B (FP4 main),
4,352 B (FP4 index). These are payload budgets only: a runtime's alignment padding, the layout
of data and scales inside a row, and sharing consumers (which allocate nothing) are out of scope.
"""

from __future__ import annotations

FP8_SCALE_BLOCK = 32  # act_quant block (M:23-30 fp8_block_size)
FP4_MAIN_SCALE_BLOCK = 16  # compressed KV fp4 block, hard-coded at M:760
FP4_INDEX_SCALE_BLOCK = 32  # indexer fp4 block (fp4_block_size)
STATE_BYTES_PER_VALUE = 4  # fp32 score and latent


def _check_dim(name: str, dim: int, block: int, need_even: bool = False) -> None:
    if dim <= 0 or dim % block or (need_even and dim % 2):
        raise ValueError(f"{name} = {dim} must be a positive multiple of the scale block {block}")


def fp8_main_row_bytes(head_dim: int, block: int = FP8_SCALE_BLOCK) -> int:
    """Bytes of one FP8 main row: hd e4m3 bytes + hd/block ue8m0 scale bytes (528 at hd 512)."""
    _check_dim("head_dim", head_dim, block)
    return head_dim + head_dim // block


def fp4_main_row_bytes(head_dim: int, block: int = FP4_MAIN_SCALE_BLOCK) -> int:
    """Bytes of one FP4 main row: hd/2 nibble bytes + hd/block e4m3 scale bytes (288 at hd 512)."""
    _check_dim("head_dim", head_dim, block, need_even=True)
    return head_dim // 2 + head_dim // block


def fp4_index_row_bytes(index_head_dim: int, block: int = FP4_INDEX_SCALE_BLOCK) -> int:
    """Bytes of one FP4 index-key row: d/2 + d/block ue8m0 scale bytes (68 at d 128)."""
    _check_dim("index_head_dim", index_head_dim, block, need_even=True)
    return index_head_dim // 2 + index_head_dim // block


def state_bytes(ratio: int, slots: int, head_dim: int) -> int:
    """Live compressor state of one request: S slots x (score, latent) x hd x fp32; 0 at ratio 1.

    Example: state_bytes(2, 7, 512) == 28672.
    """
    if ratio not in (1, 2):
        raise ValueError(f"compress ratio must be 1 or 2 (the released Compressor), got {ratio}")
    if ratio == 1:
        return 0
    if slots < 0 or head_dim <= 0:
        raise ValueError(f"need slots >= 0 and head_dim > 0, got slots {slots}, head_dim {head_dim}")
    return slots * 2 * head_dim * STATE_BYTES_PER_VALUE


def rows_per_block(block_positions: int, ratio: int) -> int:
    """Completed compressed rows in an allocator block of B token positions: B / r."""
    if ratio < 1:
        raise ValueError(f"compress ratio must be >= 1, got {ratio}")
    if block_positions <= 0 or block_positions % ratio:
        raise ValueError(
            f"allocator block of {block_positions} positions is not a positive multiple of the "
            f"compress ratio {ratio}: a group would straddle two blocks; pick B % r == 0"
        )
    return block_positions // ratio


def cache_bytes(
    head_dim: int, index_head_dim: int, ratio: int, block_positions: int, state_slots: int
) -> dict[str, int]:
    """Every byte budget of one owning layer, keyed by name (values are Python ints).

    Keys: fp8_main_row, fp4_main_row, fp4_index_row, rows_per_block, fp8_main_block,
    fp4_main_block, fp4_index_block, state.
    Example: cache_bytes(512, 128, 2, 128, 7)["fp4_main_block"] == 18432.
    """
    rows = rows_per_block(block_positions, ratio)
    table = {
        "fp8_main_row": fp8_main_row_bytes(head_dim),
        "fp4_main_row": fp4_main_row_bytes(head_dim),
        "fp4_index_row": fp4_index_row_bytes(index_head_dim),
        "rows_per_block": rows,
    }
    table["fp8_main_block"] = rows * table["fp8_main_row"]
    table["fp4_main_block"] = rows * table["fp4_main_row"]
    table["fp4_index_block"] = rows * table["fp4_index_row"]
    table["state"] = state_bytes(ratio, state_slots, head_dim)
    return table
