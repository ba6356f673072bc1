"""Indexer: head weights, index scores (rounding points, shape independence), top-k selection
with visibility, and the whole forward on tiny config A (docs/v41-reference.md §4.2, §12)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from v41_conformance.reference.indexer import (
    IndexerWeights,
    head_weight_multiplier,
    head_weights,
    index_scores,
    indexer_forward,
    query_compress_lens,
    select_topk,
)
from v41_conformance.reference.numerics import fp4_qdq_e8m0, linear_bf16
from v41_conformance.reference.rope import freqs_table

BF = torch.bfloat16
NINF = float("-inf")


def _t(rows, dtype=BF) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).to(dtype)


# ------------------------------------------------------------------ independent scalar formulation


def _bf16(v: float) -> float:
    """float -> fp32 (numpy RNE) -> bf16 (RNE on the fp32 bits), as a Python float."""
    bits = struct.unpack("<I", struct.pack("<f", float(np.float32(v))))[0]
    if (bits & 0x7F800000) == 0x7F800000:
        return float(np.float32(v))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _scores_scalar(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> list:
    """Per element with math.fsum (exact sums) and the three rounding points of M:556-557."""
    qd, kd, wd = q.double().tolist(), k.double().tolist(), w.double().tolist()
    b, S, H, D = q.shape
    T = k.shape[1]
    out = []
    for bi in range(b):
        for s in range(S):
            row = []
            for t in range(T):
                terms = []
                for h in range(H):
                    dot = _bf16(math.fsum(a * c for a, c in zip(qd[bi][s][h], kd[bi][t])))
                    terms.append(_bf16(max(dot, 0.0) * wd[bi][s][h]))
                row.append(_bf16(math.fsum(terms)) + 0.0)
            out.append(row)
    return out


def _random_inputs(seed: int, b=2, S=5, H=4, D=64, T=7, qdq=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, S, H, D, generator=g).to(BF)
    k = torch.randn(b, T, D, generator=g).to(BF)
    if qdq:
        q, k = fp4_qdq_e8m0(q).y, fp4_qdq_e8m0(k).y
    w = (torch.rand(b, S, H, generator=g) * 0.5 + 0.01).to(BF)
    return q, k, w


# ------------------------------------------------------------------ head weights


def test_head_weight_multiplier_production_and_tiny():
    prod = head_weight_multiplier(128, 32)
    assert prod == 0.015625000000000003
    assert torch.tensor(prod, dtype=torch.float32).item() == 2.0**-6
    assert head_weight_multiplier(64, 4) == 2.0**-4


def test_head_weights_rejects_head_count_mismatch():
    x = torch.ones(1, 1, 4, dtype=BF)
    wp = _t([[1, 1, 1, 1], [0.5, 0, 0, 0], [-3, 0, 0, 0]])
    with pytest.raises(ValueError, match="index_n_heads"):
        head_weights(x, wp, 64, 4)  # 3 rows != 4 heads


def test_head_weights_values():
    x = torch.ones(1, 1, 4, dtype=BF)
    wp = _t([[1, 1, 1, 1], [0.5, 0, 0, 0], [-3, 0, 0, 0], [0, 0, 0, 0]])
    w = head_weights(x, wp, index_head_dim=64, index_n_heads=4)
    assert w.dtype == BF
    assert w.flatten().tolist() == [0.25, 0.03125, -0.1875, 0.0]
    assert torch.equal(w, linear_bf16(x, wp) * 0.0625)


# ------------------------------------------------------------------ index scores


def test_lab27_scores_from_two_heads():
    q = _t([[[[1, 0], [0, 1]]]])  # [1, 1, 2, 2]: heads (1, 0), (0, 1)
    w = _t([[[1, 2]]])
    keys = _t([[[2, 0], [0, 3], [1, 1], [-1, -1], [0, 150]]])
    s = index_scores(q, keys, w)
    assert s.dtype == BF and s.shape == (1, 1, 5)
    assert s.flatten().tolist() == [2, 6, 3, 0, 300]
    sel = select_topk(s, torch.tensor([4]), 2)
    assert sel.ids.tolist() == [[[1, 2]]]
    assert sel.masked_scores.flatten().tolist() == [2, 6, 3, 0, NINF]


def test_einsum_output_is_rounded_to_bf16_before_the_weight():
    # dot = 257 (bf16 -> 256, tie to even); 256 * 1.5 = 384. Unrounded: 385.5 -> 386.
    q = _t([[[[256, 1]]]])
    k = _t([[[1, 1]]])
    w = _t([[[1.5]]])
    assert index_scores(q, k, w).item() == 384.0


def test_weighted_product_is_rounded_before_the_head_sum():
    # head 0: 3 * (1 + 2^-7) = 3.0234375 -> bf16 3.03125 (tie to even); head 1: 1 * 2^-6.
    # Rounded terms: 3.03125 + 0.015625 = 3.046875 (exact in bf16).
    # Unrounded: 3.0390625 -> bf16 3.03125 (tie to even), so the rounding point is visible.
    q = _t([[[[3, 0], [1, 0]]]])
    k = _t([[[1, 0]]])
    w = _t([[[1 + 2**-7, 2**-6]]])
    assert index_scores(q, k, w).item() == 3.046875


def test_head_sum_accumulates_in_fp32():
    # terms 256, 1, 1: fp32 sum 258 (bf16-exact). A bf16 running sum would give 256.
    q = _t([[[[256], [1], [1]]]])
    k = _t([[[1]]])
    w = _t([[[1, 1, 1]]])
    assert index_scores(q, k, w).item() == 258.0


def test_relu_and_negative_weights_and_positive_zero():
    q = _t([[[[1, 0], [0, 1]]]])
    w = _t([[[-2, 1]]])
    k = _t([[[-5, 3], [4, -1], [-1, -1]]])
    s = index_scores(q, k, w)
    assert s.flatten().tolist() == [3, -8, 0]
    assert math.copysign(1.0, s.flatten()[2].item()) == 1.0  # -0 products sum to +0


@pytest.mark.parametrize("qdq", [True, False])
def test_index_scores_match_scalar_formulation_bitwise(qdq):
    q, k, w = _random_inputs(1 + qdq, b=1, S=3, H=4, D=32, T=5, qdq=qdq)
    got = index_scores(q, k, w)
    assert got.flatten(0, 1).float().tolist() == _scores_scalar(q, k, w)


def test_index_scores_close_to_unrounded_float64():
    q, k, w = _random_inputs(7, b=2, S=6, H=4, D=64, T=9)
    got = index_scores(q, k, w).double()
    exact = (torch.einsum("bshd,btd->bsht", q.double(), k.double()).relu() * w.double()[..., None]).sum(2)
    # Three roundings of 2^-9 relative each on non-negative terms: at most 1.5 bf16 ulp.
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0**-100))) - 7)
    err = (got - exact).abs() / ulp
    assert err.max().item() <= 1.5
    assert (err <= 1.0).float().mean().item() > 0.95


def test_index_scores_equal_upstream_torch_expression_on_qdq_inputs():
    # M:556-557 evaluated literally in bf16 torch ops; for fp4-QDQ'd q/k (the real inputs) the
    # fp32 accumulation is exact, so it agrees bit for bit (signed head weights included).
    g = torch.Generator().manual_seed(8)
    q = fp4_qdq_e8m0(torch.randn(1, 6, 32, 128, generator=g).to(BF)).y
    k = fp4_qdq_e8m0(torch.randn(1, 150, 128, generator=g).to(BF)).y
    w = (torch.randn(1, 6, 32, generator=g) * 0.1).to(BF)
    upstream = (torch.einsum("bshd,btd->bsht", q, k).relu_() * w.unsqueeze(-1)).sum(dim=2)
    assert torch.equal(index_scores(q, k, w), upstream + 0.0)


def test_index_scores_independent_of_chunk_and_key_count():
    q, k, w = _random_inputs(3, b=2, S=9, H=4, D=64, T=11, qdq=False)
    full = index_scores(q, k, w)
    for s in range(9):
        row = index_scores(q[:, s : s + 1], k[:, : s + 2], w[:, s : s + 1])
        assert torch.equal(row, full[:, s : s + 1, : s + 2])


def test_index_scores_rejects_bad_inputs():
    q, k, w = _random_inputs(0, b=1, S=2, H=2, D=32, T=3)
    with pytest.raises(ValueError, match="bf16"):
        index_scores(q.float(), k, w)
    with pytest.raises(ValueError, match="shape mismatch"):
        index_scores(q, k[..., :16], w)


# ------------------------------------------------------------------ selection


def test_lab27_one_valid_row_three_slots():
    s = _t([[[5, 9, 7]]])
    assert select_topk(s, torch.tensor([1]), 3).ids.tolist() == [[[0, -1, -1]]]


def test_future_row_never_selected_however_large():
    s = _t([[[1, 2, 3, 1e30, 2e30, 3e30]] * 3])  # [1, 3, 6]
    lens = torch.tensor([1, 2, 3])
    sel = select_topk(s, lens, 4)
    assert sel.ids.tolist() == [[[0, -1, -1, -1], [0, 1, -1, -1], [0, 1, 2, -1]]]
    assert torch.isinf(sel.masked_scores[0, 0, 1:]).all()


def test_ratio2_valid_prefix_and_offset():
    S = 7
    lens = query_compress_lens(0, S, 2)
    assert lens.tolist() == [0, 1, 1, 2, 2, 3, 3]
    g = torch.Generator().manual_seed(5)
    s = torch.randn(1, S, S // 2, generator=g).to(BF)
    ids = select_topk(s, lens, 2, offset=7).ids
    assert ids.dtype == torch.int32 and ids.shape == (1, S, 2)
    for t in range(S):
        row = ids[0, t].tolist()
        valid = [i - 7 for i in row if i >= 0]
        assert valid == sorted(valid) and all(0 <= v < lens[t] for v in valid)
        assert len(valid) == min(2, int(lens[t]))
        assert row[len(valid) :] == [-1] * (2 - len(valid))


def test_decode_compress_lens_and_tensor_offset():
    assert query_compress_lens(21, 1, 2).tolist() == [11]
    assert query_compress_lens(5, 3, 1).tolist() == [6, 7, 8]
    s = _t([[[4, 1, 3]], [[0, 5, 2]]])  # [2, 1, 3]
    ids = select_topk(s, 3, 2, offset=torch.tensor([[[8]], [[100]]])).ids
    assert ids.tolist() == [[[8, 10]], [[101, 102]]]


def test_selection_matches_brute_force_on_distinct_scores():
    g = torch.Generator().manual_seed(11)
    b, S, T, k = 2, 6, 40, 5
    s = (torch.randperm(b * S * T, generator=g).float().reshape(b, S, T) / 8).to(BF)  # distinct in bf16
    lens = torch.tensor([0, 3, 5, 17, 39, 40])
    ids = select_topk(s, lens, k, offset=3).ids
    for bi in range(b):
        for t in range(S):
            n = int(lens[t])
            want = sorted(sorted(range(n), key=lambda j: -s[bi, t, j].item())[: min(k, n)])
            got = [i - 3 for i in ids[bi, t].tolist() if i >= 0]
            assert got == want


def test_k_sel_is_min_of_k_and_width():
    s = torch.zeros(1, 2, 3, dtype=BF)
    assert select_topk(s, torch.tensor([3, 3]), 8).ids.shape == (1, 2, 3)
    with pytest.raises(ValueError, match="compress_lens"):
        select_topk(s, torch.tensor([3, 3, 3]), 2)


# ------------------------------------------------------------------ whole forward, tiny config A


def _tiny(seed: int, S: int = 22):
    g = torch.Generator().manual_seed(seed)
    b, dim, ql, H, D = 2, 128, 64, 4, 64
    x = torch.randn(b, S, dim, generator=g).to(BF)
    qr = torch.randn(b, S, ql, generator=g).to(BF)
    weights = IndexerWeights(
        (torch.randn(H * D, ql, generator=g) * ql**-0.5).to(BF), (torch.randn(H, dim, generator=g) * dim**-0.5).to(BF)
    )
    keys = fp4_qdq_e8m0(torch.randn(b, 32, D, generator=g).to(BF)).y  # published keys, 32 rows
    table = freqs_table(32, 64, 160000.0, 65536, 16.0, 32, 1)
    return x, qr, weights, keys, table


@pytest.mark.parametrize("ratio", [1, 2])
def test_tiny_prefill_widths_offsets_visibility(ratio):
    x, qr, weights, keys, table = _tiny(0, S=21)
    res = indexer_forward(x, qr, keys, 0, ratio, weights, table, 32, 4, offset=21)
    T = 21 // ratio
    assert res.scores.shape == (2, 21, T) and res.ids.shape == (2, 21, min(4, T))
    assert torch.equal(res.compress_lens, torch.arange(1, 22) // ratio)
    assert torch.equal(res.masked_scores, res.visible_scores)
    for t in range(21):
        n = (t + 1) // ratio
        assert torch.isinf(res.visible_scores[:, t, n:]).all()
        assert torch.isfinite(res.visible_scores[:, t, :n]).all()
        for bi in range(2):
            row = res.ids[bi, t].tolist()
            valid = [i - 21 for i in row if i >= 0]
            assert len(valid) == min(4, n) and all(0 <= v < n for v in valid)
            assert valid == sorted(valid) and row[len(valid) :] == [-1] * (4 - len(valid))
    want = select_topk(res.visible_scores, res.compress_lens, 4, 21).ids
    assert torch.equal(res.ids, want)


@pytest.mark.parametrize("ratio", [1, 2])
def test_tiny_decode_matches_prefill_row(ratio):
    x, qr, weights, keys, table = _tiny(1, S=22)
    full = indexer_forward(x, qr, keys, 0, ratio, weights, table, 32, 4, offset=22)
    dec = indexer_forward(x[:, 21:], qr[:, 21:], keys, 21, ratio, weights, table, 32, 4, offset=8)
    T = 22 // ratio
    assert dec.ids.shape == (2, 1, min(4, T)) and dec.compress_lens.tolist() == [T]
    assert torch.equal(dec.scores, full.scores[:, 21:])
    assert torch.equal(dec.ids - 8, full.ids[:, 21:] - 22)


def test_future_key_rows_do_not_influence_earlier_queries():
    x, qr, weights, keys, table = _tiny(2, S=6)
    res = indexer_forward(x, qr, keys, 0, 1, weights, table, 32, 2, offset=0)
    loud = keys.clone()
    loud[:, 5] = fp4_qdq_e8m0((keys[:, 5].float() * 1e4).to(BF)).y  # a very different row 5
    res2 = indexer_forward(x, qr, loud, 0, 1, weights, table, 32, 2, offset=0)
    assert not torch.equal(res.scores[:, :, 5], res2.scores[:, :, 5])
    assert torch.equal(res.ids[:, :5], res2.ids[:, :5])
    assert 5 not in res2.ids[:, :5].flatten().tolist()


def test_consumer_candidates_mask_scores_and_empty_chunk():
    x, qr, weights, keys, table = _tiny(3, S=8)
    cand = torch.zeros(2, 8, 8, dtype=torch.bool)
    cand[..., 0:2] = True
    res = indexer_forward(x, qr, keys, 0, 1, weights, table, 32, 2, offset=8, candidates=cand)
    assert torch.isinf(res.masked_scores[..., 2:]).all()
    assert torch.equal(res.masked_scores[..., :2], res.visible_scores[..., :2])
    assert torch.isfinite(res.scores).all()
    empty = indexer_forward(x[:, :1], qr[:, :1], keys, 0, 2, weights, table, 32, 4, offset=1)
    assert empty.ids.shape == (2, 1, 0) and empty.ids.dtype == torch.int32
    with pytest.raises(ValueError, match="candidates"):
        indexer_forward(x, qr, keys, 0, 1, weights, table, 32, 2, offset=8, candidates=cand[:, :, :4])


@pytest.mark.parametrize("ratio", [1, 2])
def test_tiny_decode_steps_width_and_offset(ratio):
    # §12: decode positions 21..31, compressed width min(4, T), ids offset by the window (8).
    x, qr, weights, keys, table = _tiny(4, S=32)
    for p in range(21, 32):
        res = indexer_forward(x[:, p : p + 1], qr[:, p : p + 1], keys, p, ratio, weights, table, 32, 4, offset=8)
        T = (p + 1) // ratio
        assert res.ids.shape == (2, 1, min(4, T)) and res.compress_lens.tolist() == [T]
        assert ((res.ids >= 8) & (res.ids < 8 + T)).all()  # no -1: T >= 4 rows reachable


def test_source_then_consumer_leak_variant_c():
    # Variant C (§12): candidate_topk_blocks 1, block 2, index_topk 4. The source builds the mask
    # from its own visible scores; the consumer's pool (<= 2 rows) is below index_topk, so once
    # 4+ rows are reachable the top-k returns reachable-but-masked rows as valid ids (§4.4).
    from v41_conformance.reference.candidates import select_candidate_blocks

    x, qr, weights, keys, table = _tiny(5, S=8)
    src = indexer_forward(x, qr, keys, 0, 1, weights, table, 32, 4, offset=8)
    cand = select_candidate_blocks(src.visible_scores, src.compress_lens, 1, 2).mask
    con = indexer_forward(x, qr, keys, 0, 1, weights, table, 32, 4, offset=8, candidates=cand)
    for t in range(8):
        ids = [i - 8 for i in con.ids[0, t].tolist() if i >= 0]
        kept = [i for i in cand[0, t].nonzero().flatten().tolist() if i <= t]  # kept and reachable
        assert set(kept) <= set(ids) and all(i <= t for i in ids)  # leaks stay reachable
    last = [i - 8 for i in con.ids[0, 7].tolist()]  # all 8 rows reachable: every pick is valid
    assert len([i for i in last if i >= 0]) == 4
    assert len([i for i in last if i >= 0 and not cand[0, 7, i]]) == 2
    # the source itself is not restricted: its ids only depend on its visible scores
    assert torch.equal(src.ids, select_topk(src.visible_scores, src.compress_lens, 4, 8).ids)
