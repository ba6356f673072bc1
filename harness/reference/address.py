"""Address translation of selected compressed rows (seed appendix A.4.3; the reference itself
addresses one contiguous cache and needs none of this).

- `address_prefill`: prefill gathers a request's compressed keys into one concatenated buffer,
  so logical row j becomes j + base (the request's offset in it); -1 lanes stay -1.
- `address_decode`: decode reads paged storage. An allocator block covers B token positions,
  i.e. B / r compressed rows at ratio r; logical row j lives in physical slot
  block_table[j // (B/r)] * (B/r) + j % (B/r). -1 lanes stay -1.

Example (lab 27): B 8, r 2, block table [7, 2]: rows [1, 2, 4, -1] -> [29, 30, 8, -1].
"""

from __future__ import annotations

import torch


def address_prefill(ids: torch.Tensor, base: int | torch.Tensor) -> torch.Tensor:
    """ids int [..., K] (-1 = empty lane) -> ids + base where valid, -1 kept; same dtype.

    base is an int or an int tensor broadcastable to ids (e.g. [b, 1, 1] per request).
    Example: address_prefill(tensor([1, 2, -1]), 10) -> [11, 12, -1].
    """
    _check_ids(ids, "address_prefill")
    return torch.where(ids >= 0, ids + base, -1).to(ids.dtype)


def address_decode(ids: torch.Tensor, block_table: torch.Tensor, block_size: int, ratio: int) -> torch.Tensor:
    """Logical compressed rows [..., K] -> physical slots through the block table; -1 kept.

    block_table int [nblocks] (one request) or [b, nblocks] with ids [b, ...]. block_size B is
    in token positions; B % ratio must be 0. Raises ValueError for an id whose block is past
    the table or whose table entry is negative (unallocated).
    """
    _check_ids(ids, "address_decode")
    if ratio <= 0 or block_size <= 0 or block_size % ratio:
        raise ValueError(
            f"address_decode: block_size {block_size} must be a positive multiple of ratio {ratio} "
            "(a block holds block_size / ratio compressed rows)"
        )
    rows_per_block = block_size // ratio
    valid = ids >= 0
    j = torch.where(valid, ids, 0).long()
    blk = torch.div(j, rows_per_block, rounding_mode="floor")
    nblocks = block_table.shape[-1]
    if bool((valid & (blk >= nblocks)).any()):
        worst = int(ids[valid].max())
        raise ValueError(
            f"address_decode: row {worst} needs block {worst // rows_per_block} but the block table has "
            f"{nblocks} entries ({rows_per_block} rows each); extend the table or drop the row"
        )
    table = block_table.long()
    if nblocks == 0:  # nothing allocated yet: only -1 lanes can be addressed (checked above)
        table = torch.zeros((*table.shape[:-1], 1), dtype=torch.long)
    if table.ndim == 1:
        phys_block = table[blk]
    elif table.ndim == 2 and ids.ndim >= 1 and ids.shape[0] == table.shape[0]:
        flat = blk.reshape(blk.shape[0], -1)  # [b, n]
        phys_block = table.gather(1, flat).reshape(blk.shape)
    else:
        raise ValueError(
            f"address_decode: block_table must be [nblocks] or [b, nblocks] matching ids' batch dim; "
            f"got table {tuple(block_table.shape)}, ids {tuple(ids.shape)}"
        )
    if bool((valid & (phys_block < 0)).any()):
        raise ValueError("address_decode: a valid row maps to a negative (unallocated) block table entry")
    slots = phys_block * rows_per_block + j % rows_per_block
    return torch.where(valid, slots, -1).to(ids.dtype)


def _check_ids(ids: torch.Tensor, name: str) -> None:
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"{name}: ids must be an integer tensor, got {ids.dtype}")
    if bool((ids < -1).any()):
        raise ValueError(f"{name}: ids must be >= -1 (-1 = empty lane), got min {int(ids.min())}")
