"""Window ids (M:409-426, docs/v41-reference.md §5.3, §10.3) and address translation (seed A.4.3)."""

from __future__ import annotations

import pytest
import torch

from v41_conformance.reference.address import address_decode, address_prefill
from v41_conformance.reference.window import window_ids_chunk, window_ids_decode, window_ids_prefill

# ------------------------------------------------------------------ window ids


def _prefill_loop(S: int, win: int) -> list[list[int]]:
    rows = []
    for t in range(S):
        lo = max(0, t - win + 1)
        rows.append([lo + j if lo + j <= t else -1 for j in range(min(S, win))])
    return rows


def _decode_loop(p: int, win: int) -> list[int]:
    o = p % win + 1
    slots = list(range(o, win)) + list(range(o))
    return [s if s <= p else -1 for s in slots]


@pytest.mark.parametrize("S,win", [(1, 8), (5, 8), (8, 8), (21, 8), (30, 4), (3, 1)])
def test_prefill_rows(S, win):
    got = window_ids_prefill(S, win)
    assert got.dtype == torch.int32 and got.shape == (S, min(S, win))
    assert got.tolist() == _prefill_loop(S, win)


def test_prefill_hand_example_and_self_always_present():
    assert window_ids_prefill(3, 2).tolist() == [[0, -1], [0, 1], [1, 2]]
    ids = window_ids_prefill(21, 8)
    assert all(t in ids[t].tolist() for t in range(21))


def test_decode_rows_against_loop():
    for win in (1, 4, 8):
        for p in range(0, 3 * win + 2):
            got = window_ids_decode(p, win)
            assert got.dtype == torch.int32 and got.shape == (1, win)
            assert got[0].tolist() == _decode_loop(p, win)
    assert window_ids_decode(2, 4).tolist() == [[-1, 0, 1, 2]]
    assert window_ids_decode(5, 4).tolist() == [[2, 3, 0, 1]]


def test_tiny_config_a_widths():
    # §12 quick checks: window width 8 at prefill (S = 21) and decode (positions 21..31).
    assert window_ids_prefill(21, 8).shape == (21, 8)
    for p in range(21, 32):
        ids = window_ids_decode(p, 8)
        assert ids.shape == (1, 8) and sorted(ids[0].tolist()) == list(range(8))  # full ring


def test_chunk_of_one_reduces_to_upstream_decode():
    for win in (1, 3, 8):
        for p in range(0, 3 * win + 2):
            assert torch.equal(window_ids_chunk(p, 1, win), window_ids_decode(p, win))
            assert torch.equal(window_ids_chunk(p, 1, win, ring_size=win), window_ids_decode(p, win))


def test_chunk_default_ring_loses_nothing():
    win, start, S = 8, 13, 5
    ring = win + S - 1
    ids = window_ids_chunk(start, S, win)
    assert ids.shape == (S, win)
    for t in range(S):
        P = start + t
        positions = range(P - win + 1, P + 1)
        assert ids[t].tolist() == [p % ring for p in positions]
    early = window_ids_chunk(1, 3, 4)  # positions before 0 are -1 (sequence start)
    assert early.tolist() == [[-1, -1, 0, 1], [-1, 0, 1, 2], [0, 1, 2, 3]]


def test_chunk_with_window_sized_ring_shows_overwrites():
    # Ring of win slots, 3 tokens written before reading: the early queries lose the oldest
    # positions, which the later tokens of the chunk overwrote (write-before-read hazard).
    ids = window_ids_chunk(10, 3, 4, ring_size=4)
    assert ids.tolist() == [[-1, -1, 1, 2], [-1, 1, 2, 3], [1, 2, 3, 0]]
    with pytest.raises(ValueError, match="ring_size"):
        window_ids_chunk(10, 3, 4, ring_size=3)


# ------------------------------------------------------------------ address translation


def test_lab27_prefill_base():
    got = address_prefill(torch.tensor([1, 2], dtype=torch.int32), 10)
    assert got.tolist() == [11, 12] and got.dtype == torch.int32
    assert address_prefill(torch.tensor([[1, -1]]), torch.tensor([[5]])).tolist() == [[6, -1]]


def test_lab27_decode_slots():
    got = address_decode(torch.tensor([1, 2, 4, -1], dtype=torch.int32), torch.tensor([7, 2]), 8, 2)
    assert got.tolist() == [29, 30, 8, -1] and got.dtype == torch.int32


def test_decode_batched_table_and_ratio1():
    ids = torch.tensor([[[0, 9, -1]], [[3, 8, 15]]])  # [2, 1, 3]
    table = torch.tensor([[4, 0], [1, 3]])
    # ratio 1, B 8: rows per block 8
    assert address_decode(ids, table, 8, 1).tolist() == [[[32, 1, -1]], [[11, 24, 31]]]


def test_decode_matches_loop():
    g = torch.Generator().manual_seed(2)
    table = torch.randperm(20, generator=g)[:6]
    ids = torch.randint(-1, 6 * 4, (3, 7), generator=g)
    got = address_decode(ids, table, 8, 2)
    for a, b in zip(ids.flatten().tolist(), got.flatten().tolist()):
        assert b == (-1 if a < 0 else int(table[a // 4]) * 4 + a % 4)


def test_decode_refusals():
    ids = torch.tensor([1, 8])
    with pytest.raises(ValueError, match="multiple of ratio"):
        address_decode(ids, torch.tensor([0, 1]), 7, 2)
    with pytest.raises(ValueError, match="block table has 2"):
        address_decode(ids, torch.tensor([0, 1]), 8, 2)
    with pytest.raises(ValueError, match="unallocated"):
        address_decode(torch.tensor([5]), torch.tensor([0, -1]), 8, 2)
    with pytest.raises(ValueError, match=">= -1"):
        address_decode(torch.tensor([-3]), torch.tensor([0]), 8, 2)
    with pytest.raises(ValueError, match="integer"):
        address_prefill(torch.tensor([1.0]), 3)


def test_decode_with_no_block_allocated_keeps_every_lane_empty():
    """Every lane -1 (nothing selected yet) and an empty table: all -1, no gather into nothing."""
    empty = torch.full((2, 3, 4), -1, dtype=torch.int32)
    assert torch.equal(address_decode(empty, torch.zeros(2, 0, dtype=torch.int32), 8, 2), empty)
    assert torch.equal(address_decode(empty[0], torch.zeros(0, dtype=torch.int32), 8, 2), empty[0])
    with pytest.raises(ValueError, match="needs block 0"):
        address_decode(torch.tensor([[0, -1]], dtype=torch.int32), torch.zeros(1, 0, dtype=torch.int32), 8, 2)
