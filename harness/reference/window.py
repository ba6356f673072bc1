"""Sliding-window ids: which window KV rows each query attends to (upstream
`get_window_topk_idxs`, M:409-426; `docs/v41-reference.md` §5.3, §10.3).

- `window_ids_prefill`: prefill (start_pos 0). The window part is the chunk's own S KV rows;
  row t lists positions max(0, t - win + 1) + j for j < min(S, win), entries > t -> -1.
- `window_ids_decode`: one decode query at start_pos. The window part is the whole ring of
  `win` slots (token p in slot p % win); the row lists slots o, o+1, .., win-1, 0, .., o-1 with
  o = start_pos % win + 1 (oldest first), slot ids > start_pos -> -1 while the ring fills.
- `window_ids_chunk`: the harness's generalisation to a chunk of S tokens at any start
  (multi-token decode, chunked prefill after the first chunk). Not upstream behaviour.

Chunk convention (ours, reduces to `window_ids_decode` for S = 1 and ring_size = win): every
position p < start + S has been written to ring slot p % ring_size, later positions
overwriting earlier ones, before attention reads the ring. Lane j of query t stands for
position p = start + t - win + 1 + j (oldest first, width win) and holds slot p % ring_size,
or -1 when p < 0 (before the sequence) or when a later token of the chunk has overwritten it
(p < start + S - ring_size). ring_size >= win + S - 1 loses nothing (the default); a smaller
ring shows the write-before-read hazard of seed A.2 as -1 lanes.

All functions return int32 rows without a batch dim; upstream materialises the same rows per
batch element (expand to [b, rows, width]).
"""

from __future__ import annotations

import torch


def window_ids_prefill(seqlen: int, win: int) -> torch.Tensor:
    """int32 [S, min(S, win)]: ids into the chunk's own KV rows (M:414-417).

    Example: window_ids_prefill(3, 2) -> [[0, -1], [0, 1], [1, 2]].
    """
    _check(seqlen >= 0 and win > 0, f"window_ids_prefill needs seqlen >= 0 and win > 0, got {seqlen}, {win}")
    end = torch.arange(seqlen).unsqueeze(1)  # [S, 1]: query position t
    ids = (end - win + 1).clamp(min=0) + torch.arange(min(seqlen, win))  # [S, width]
    return torch.where(ids > end, -1, ids).to(torch.int32)


def window_ids_decode(start_pos: int, win: int) -> torch.Tensor:
    """int32 [1, win]: ring slot ids for the single query at start_pos, oldest first (M:419-421).

    Upstream takes this branch for start_pos > 0 (at 0 the prefill rows apply).
    Example: window_ids_decode(2, 4) -> [[-1, 0, 1, 2]]; window_ids_decode(5, 4) -> [[2, 3, 0, 1]].
    """
    _check(start_pos >= 0 and win > 0, f"window_ids_decode needs start_pos >= 0 and win > 0, got {start_pos}, {win}")
    oldest = start_pos % win + 1
    ids = torch.cat([torch.arange(oldest, win), torch.arange(oldest)])  # [win]
    return torch.where(ids > start_pos, -1, ids).to(torch.int32).unsqueeze(0)


def window_ids_chunk(start: int, seqlen: int, win: int, ring_size: int | None = None) -> torch.Tensor:
    """int32 [S, win]: ring slot ids for a chunk of S tokens at `start` (module docstring).

    ring_size defaults to win + S - 1 (no lane lost); must be >= win.
    Example: window_ids_chunk(5, 2, 4) (ring 5) -> [[2, 3, 4, 0], [3, 4, 0, 1]].
    """
    ring = win + seqlen - 1 if ring_size is None else ring_size
    _check(
        start >= 0 and seqlen >= 1 and win > 0,
        f"window_ids_chunk needs start >= 0, seqlen >= 1, win > 0; got {start}, {seqlen}, {win}",
    )
    _check(ring >= win, f"ring_size {ring} must be >= win {win}: the ring has to hold a whole window")
    pos = start + torch.arange(seqlen).unsqueeze(1) - win + 1 + torch.arange(win)  # [S, win]
    held = (pos >= 0) & (pos >= start + seqlen - ring)
    return torch.where(held, pos % ring, -1).to(torch.int32)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
