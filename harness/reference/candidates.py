"""Level one of the two-level top-k: candidate blocks (upstream `select_candidate_blocks`,
M:583-610), and the runtime's compact candidate offsets mapped back to logical rows.

Upstream anchors (`docs/v41-reference.md` §4.3, §4.4, §7; seed A.4.2):

- `select_candidate_blocks`: pad the scores with -inf to a multiple of the block size, score
  each block by its max, pin the block holding the query's newest reachable row with +inf,
  keep the top min(topk_blocks, nb) blocks (torch CPU top-k, largest, sorted=True) whose
  value is > -inf, and repeat each block flag over its rows (trimmed to the width).
- `restore_candidates`: a runtime that scores only inside the candidate set returns compact
  offsets into that set; this maps them back to logical compressed rows (+ a request offset).
- `kept_block_ids` / `compact_ids`: the conversions between the reference's bool mask and the
  runtime's forms, for building inputs and round trips.

Compact-offset convention (ours; upstream has no compact form): the candidate list of a query
is its kept rows in ascending logical order; compact id c is the c-th entry (0-based), -1 is an
empty lane. With kept block ids instead of a mask, the list is the blocks' rows in the given
block order, so c -> block_ids[c // B] * B + c % B. Both agree for ascending block ids, since
only the highest block (index nb-1) can be partial.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from v41_conformance.reference.topk import torch_cpu_topk


class CandidateSelection(NamedTuple):
    """mask bool [..., S, W]: kept rows. block_scores [..., S, nb]: block maxima (before the pin).
    ranked_scores [..., S, nb]: what top-k ranked (block_scores with the pinned block at +inf)."""

    mask: torch.Tensor
    block_scores: torch.Tensor
    ranked_scores: torch.Tensor


def select_candidate_blocks(
    logits: torch.Tensor, compress_lens: torch.Tensor | int, topk_blocks: int, block_size: int
) -> CandidateSelection:
    """Keep the best `topk_blocks` blocks of `block_size` rows per query (M:583-610).

    logits bf16 [..., S, W]: index scores with unreachable rows already -inf (a candidate
    source's visibility-masked scores). compress_lens int64 [S] (or one int for every query):
    rows each query can reach. The block (compress_lens - 1) // B (floor) is pinned with +inf;
    compress_lens == 0 gives -1 and pins nothing. Picks whose value is -inf (fewer reachable
    blocks than topk_blocks) are dropped.

    Example: logits [2, 6, 3, 0, -inf], compress_lens 4, topk_blocks 1, B 2: block maxima
    [6, 3, -inf]; block 1 holds row 3 and is pinned, so only rows 2, 3 are kept.
    """
    if logits.ndim < 2:
        raise ValueError(f"select_candidate_blocks wants logits [..., S, W], got {tuple(logits.shape)}")
    if topk_blocks <= 0 or block_size <= 0:
        raise ValueError(f"topk_blocks and block_size must be positive, got {topk_blocks}, {block_size}")
    S, W = logits.shape[-2], logits.shape[-1]
    if isinstance(compress_lens, int):
        last = torch.tensor((compress_lens - 1) // block_size)  # scalar
    else:
        lens = torch.as_tensor(compress_lens)
        if lens.dtype.is_floating_point or tuple(lens.shape) not in ((S,), (S, 1)):
            raise ValueError(
                f"compress_lens must be an int or integer [S] = [{S}], got {lens.dtype} {tuple(lens.shape)}"
            )
        last = torch.div(lens.to(torch.int64).reshape(S, 1) - 1, block_size, rounding_mode="floor")  # [S, 1]
    padded = F.pad(logits, (0, -W % block_size), value=float("-inf"))  # [..., S, nb * B]
    block_scores = padded.unflatten(-1, (-1, block_size)).amax(dim=-1)  # [..., S, nb]
    nb = block_scores.shape[-1]
    ranked = block_scores.masked_fill(torch.arange(nb) == last, float("inf"))
    values, picked = torch_cpu_topk(ranked, min(topk_blocks, nb), dim=-1, largest=True, sorted=True)
    keep = torch.zeros(ranked.shape, dtype=torch.bool).scatter_(-1, picked, values > float("-inf"))
    mask = keep.repeat_interleave(block_size, dim=-1)[..., :W]
    return CandidateSelection(mask, block_scores, ranked)


def kept_block_ids(mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """bool [..., W] candidate mask -> int64 [..., nb]: kept block ids ascending, then -1."""
    if mask.dtype != torch.bool or block_size <= 0:
        raise ValueError(f"kept_block_ids wants a bool mask and block_size > 0, got {mask.dtype}, {block_size}")
    W = mask.shape[-1]
    first = F.pad(mask, (0, -W % block_size)).unflatten(-1, (-1, block_size))[..., 0]  # [..., nb]
    nb = first.shape[-1]
    order = torch.argsort((~first).to(torch.uint8), dim=-1, stable=True)  # kept blocks first, ascending
    return torch.where(first.gather(-1, order), order, -1) if nb else order


def compact_ids(logical: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logical rows [..., K] (-1 = empty lane) -> compact offsets into the ascending kept rows.

    Raises ValueError for a row that is not kept. Inverse of `restore_candidates` (mask form).
    """
    valid = logical >= 0
    safe = torch.where(valid, logical, 0).long()
    if bool((safe >= mask.shape[-1]).any()) or bool((logical < -1).any()):
        raise ValueError(f"compact_ids: logical rows must be -1 or in [0, {mask.shape[-1]})")
    if bool((valid & ~mask.gather(-1, safe)).any()):
        raise ValueError("compact_ids: a logical row is not in the candidate set; only kept rows have compact offsets")
    rank = mask.long().cumsum(-1) - 1  # [..., W]: compact offset of each kept row
    return torch.where(valid, rank.gather(-1, safe), -1)


def restore_candidates(
    compact: torch.Tensor, kept: torch.Tensor, block_size: int, request_offset: int | torch.Tensor = 0
) -> torch.Tensor:
    """Compact candidate offsets [..., K] -> logical rows + request_offset, -1 kept (seed A.4.2).

    kept is either the bool mask [..., W] (compact c = the c-th kept row in ascending order) or
    int kept block ids [..., nk] in the runtime's order with -1 for unused slots
    (c -> kept[c // B] * B + c % B). Leading dims of compact and kept must match. An offset past
    the candidate list, into a -1 block slot, or below -1 raises ValueError: a lane declared
    valid must hold a real candidate.

    Example: mask [T, T, F, F, T, T], compact [0, 1, 3, -1] -> [0, 1, 5, -1]; with kept block
    ids [2, 0] and B 2, compact [0, 3] -> [4, 1].
    """
    if compact.dtype.is_floating_point or bool((compact < -1).any()):
        raise ValueError("restore_candidates: compact ids must be integers >= -1 (-1 = empty lane)")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if compact.shape[:-1] != kept.shape[:-1]:
        raise ValueError(f"leading dims differ: compact {tuple(compact.shape)} vs kept {tuple(kept.shape)}")
    valid = compact >= 0
    c = torch.where(valid, compact, 0).long()
    if kept.dtype == torch.bool:
        count = kept.sum(-1, keepdim=True)  # [..., 1]
        if bool((valid & (c >= count)).any()):
            raise ValueError("restore_candidates: a compact id points past the kept candidate rows")
        rows = torch.argsort((~kept).to(torch.uint8), dim=-1, stable=True)  # kept rows first, ascending
        logical = rows.gather(-1, c.clamp(max=max(kept.shape[-1] - 1, 0))) if kept.shape[-1] else c
    else:
        slot = torch.div(c, block_size, rounding_mode="floor")
        if bool((valid & (slot >= kept.shape[-1])).any()):
            raise ValueError(
                f"restore_candidates: a compact id points past {kept.shape[-1]} kept blocks of {block_size}"
            )
        block = kept.long().gather(-1, slot.clamp(max=max(kept.shape[-1] - 1, 0))) if kept.shape[-1] else slot
        if bool((valid & (block < 0)).any()):
            raise ValueError("restore_candidates: a compact id points into an empty (-1) block slot")
        logical = block * block_size + c % block_size
    return torch.where(valid, logical + request_offset, -1).to(compact.dtype)
