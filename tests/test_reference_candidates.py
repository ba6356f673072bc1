"""Candidate blocks (M:583-610, docs/v41-reference.md §4.3-4.4), the consumer leak, and the
compact-offset restoration of seed A.4.2."""

from __future__ import annotations

import pytest
import torch

from v41_conformance.reference.candidates import (
    compact_ids,
    kept_block_ids,
    restore_candidates,
    select_candidate_blocks,
)
from v41_conformance.reference.indexer import query_compress_lens, select_topk

BF = torch.bfloat16
INF = float("inf")


def _t(rows, dtype=BF) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).to(dtype)


LAB_SCORES = [[[2, 6, 3, 0, 300]]]  # lab 27, valid prefix 4


def _lab_visible() -> torch.Tensor:
    s = _t(LAB_SCORES)
    return s.masked_fill(torch.arange(5) >= 4, -INF)


# ------------------------------------------------------------------ lab 27 figures


def test_lab27_unpinned_block_choice_changes_token_topk():
    # The lab ranks blocks without the newest-block pin; compress_lens 0 pins nothing.
    vis = _lab_visible()
    sel = select_candidate_blocks(vis, 0, topk_blocks=1, block_size=2)
    assert sel.block_scores.flatten().tolist() == [6, 3, -INF]
    assert sel.mask.flatten().tolist() == [True, True, False, False, False]  # block 0 retained
    consumer = vis.masked_fill(~sel.mask, -INF)
    assert select_topk(consumer, torch.tensor([4]), 2).ids.tolist() == [[[0, 1]]]
    assert select_topk(vis, torch.tensor([4]), 2).ids.tolist() == [[[1, 2]]]


def test_lab27_with_upstream_pin_keeps_the_newest_block():
    # Upstream pins block (4 - 1) // 2 = 1, so with one block kept the lab's answer changes.
    vis = _lab_visible()
    sel = select_candidate_blocks(vis, torch.tensor([4]), topk_blocks=1, block_size=2)
    assert sel.ranked_scores.flatten().tolist() == [6, INF, -INF]
    assert sel.mask.flatten().tolist() == [False, False, True, True, False]
    consumer = vis.masked_fill(~sel.mask, -INF)
    assert select_topk(consumer, torch.tensor([4]), 2).ids.tolist() == [[[2, 3]]]


# ------------------------------------------------------------------ select_candidate_blocks


def _reference_loop(logits: torch.Tensor, lens: list[int], topk_blocks: int, B: int) -> torch.Tensor:
    """Plain per-row formulation; ties are avoided by the inputs."""
    b, S, W = logits.shape
    nb = -(-W // B)
    out = torch.zeros(b, S, W, dtype=torch.bool)
    for bi in range(b):
        for s in range(S):
            row = logits[bi, s].float().tolist() + [-INF] * (nb * B - W)
            scores = [max(row[j * B : (j + 1) * B]) for j in range(nb)]
            last = (lens[s] - 1) // B
            if lens[s] > 0:
                scores[last] = INF
            order = sorted(range(nb), key=lambda j: -scores[j])[: min(topk_blocks, nb)]
            for j in order:
                if scores[j] > -INF:
                    out[bi, s, j * B : min((j + 1) * B, W)] = True
    return out


@pytest.mark.parametrize("ratio,B,topk_blocks", [(1, 2, 3), (2, 2, 3), (1, 3, 2), (1, 4, 1)])
def test_prefill_rows_match_loop(ratio, B, topk_blocks):
    g = torch.Generator().manual_seed(ratio * 10 + B)
    S = 23
    W = S // ratio
    logits = (torch.randperm(2 * S * W, generator=g).float().reshape(2, S, W) / 4).to(BF)  # distinct
    lens = query_compress_lens(0, S, ratio)
    vis = logits.masked_fill(torch.arange(W) >= lens[:, None], -INF)
    sel = select_candidate_blocks(vis, lens, topk_blocks, B)
    assert sel.mask.shape == (2, S, W) and sel.mask.dtype == torch.bool
    assert torch.equal(sel.mask, _reference_loop(vis, lens.tolist(), topk_blocks, B))
    for t in range(S):  # the newest reachable row is always kept
        if lens[t] > 0:
            assert sel.mask[:, t, lens[t] - 1].all()


def test_minus_inf_picks_are_dropped():
    # Only blocks 0 and 1 reachable; topk_blocks 3 must not keep the unreachable block 2.
    vis = _t([[[1, 2, 3, -INF, -INF, -INF]]])
    sel = select_candidate_blocks(vis, torch.tensor([3]), topk_blocks=3, block_size=2)
    assert sel.mask.flatten().tolist() == [True, True, True, True, False, False]


def test_nothing_pinned_when_no_row_is_reachable():
    vis = torch.full((1, 1, 4), -INF, dtype=BF)
    sel = select_candidate_blocks(vis, torch.tensor([0]), topk_blocks=2, block_size=2)
    assert not sel.mask.any()
    assert torch.equal(sel.ranked_scores, sel.block_scores)


def test_padding_to_a_multiple_of_the_block_size():
    vis = _t([[[0, 0, 0, 0, 9]]])  # last block is partial: [9, pad]
    sel = select_candidate_blocks(vis, 5, topk_blocks=1, block_size=2)
    assert sel.block_scores.flatten().tolist() == [0, 0, 9]
    assert sel.mask.flatten().tolist() == [False, False, False, False, True]


def test_block_ties_follow_torch_cpu_topk():
    # Five equal blocks, keep 2 + the pinned one: which tied blocks win is torch's CPU choice.
    vis = torch.ones(1, 1, 12, dtype=BF)
    sel = select_candidate_blocks(vis, 12, topk_blocks=3, block_size=2)
    ranked = sel.ranked_scores
    want = torch.zeros(1, 1, 6, dtype=torch.bool).scatter_(-1, torch.topk(ranked, 3).indices, True)
    assert torch.equal(sel.mask, want.repeat_interleave(2, -1))
    assert sel.mask[0, 0, 10:].all()  # the pinned newest block


# ------------------------------------------------------------------ §4.4 leak


def test_consumer_leak_returns_reachable_masked_ids():
    # Variant C: 1 block of 2 rows kept, index_topk 4, all 8 rows reachable.
    g = torch.Generator().manual_seed(4)
    vis = torch.randn(1, 1, 8, generator=g).to(BF)
    sel = select_candidate_blocks(vis, torch.tensor([8]), topk_blocks=1, block_size=2)
    assert sel.mask.flatten().tolist() == [False] * 6 + [True, True]
    consumer = vis.masked_fill(~sel.mask, -INF)
    ids = select_topk(consumer, torch.tensor([8]), 4).ids[0, 0].tolist()
    assert -1 not in ids and {6, 7} <= set(ids)
    leaked = [i for i in ids if i < 6]
    assert len(leaked) == 2  # reachable but masked: chosen among -inf ties, returned as valid
    assert sorted(torch.topk(consumer, 4, sorted=False).indices.flatten().tolist()) == ids


def test_no_leak_when_pool_covers_index_topk():
    # (topk_blocks - 1) * B + 1 = 5 >= 4: every -inf pick is unreachable and becomes -1.
    vis = _t([[[5, 1, 4, 2, 3, -INF, -INF, -INF]]])
    sel = select_candidate_blocks(vis, torch.tensor([5]), topk_blocks=3, block_size=2)
    consumer = vis.masked_fill(~sel.mask, -INF)
    ids = select_topk(consumer, torch.tensor([5]), 4).ids[0, 0].tolist()
    assert all(i == -1 or sel.mask[0, 0, i] for i in ids)


# ------------------------------------------------------------------ restore / compact


def test_restore_from_mask_and_offset():
    mask = torch.tensor([[True, True, False, False, True, True]])
    got = restore_candidates(torch.tensor([[0, 1, 3, -1]], dtype=torch.int32), mask, 2, request_offset=10)
    assert got.tolist() == [[10, 11, 15, -1]] and got.dtype == torch.int32


def test_restore_from_block_ids_in_runtime_order():
    blocks = torch.tensor([[2, 0, -1]])
    got = restore_candidates(torch.tensor([[0, 3, 1, -1]]), blocks, 2)
    assert got.tolist() == [[4, 1, 5, -1]]


def test_restore_round_trip_and_block_ids():
    g = torch.Generator().manual_seed(9)
    vis = torch.randn(2, 5, 11, generator=g).to(BF)
    sel = select_candidate_blocks(vis, torch.tensor([11] * 5), topk_blocks=2, block_size=3)
    consumer = vis.masked_fill(~sel.mask, -INF)
    ids = select_topk(consumer, torch.tensor([11] * 5), 4).ids.long()
    ids = torch.where(sel.mask.gather(-1, ids.clamp(min=0)) & (ids >= 0), ids, -1)
    compact = compact_ids(ids, sel.mask)
    assert torch.equal(restore_candidates(compact, sel.mask, 3), ids)
    blocks = kept_block_ids(sel.mask, 3)
    assert blocks.shape == (2, 5, 4)
    assert torch.equal(restore_candidates(compact, blocks, 3), ids)
    assert (blocks >= 0).sum(-1).tolist() == [[2] * 5] * 2


def test_restore_refuses_invalid_lanes():
    mask = torch.tensor([True, True, False, False])
    with pytest.raises(ValueError, match="past the kept"):
        restore_candidates(torch.tensor([2]), mask, 2)
    with pytest.raises(ValueError, match="empty"):
        restore_candidates(torch.tensor([2]), torch.tensor([0, -1]), 2)
    with pytest.raises(ValueError, match=">= -1"):
        restore_candidates(torch.tensor([-2]), mask, 2)
    with pytest.raises(ValueError, match="not in the candidate set"):
        compact_ids(torch.tensor([2]), mask)
