"""classify_index_rows: exact / tie-order / miss, invariant violations, and the row examples."""

from __future__ import annotations

import math

import pytest
import torch

from v41_conformance.index_verdict import VIOLATION_KINDS, classify_index_rows
from v41_conformance.reference.topk import torch_cpu_topk

NAN, INF = math.nan, math.inf


def _lowest_index_topk(scores: torch.Tensor, k: int, largest: bool = True) -> torch.Tensor:
    """Plain independent tie policy: best value first, lowest index first among equals."""
    order = torch.sort(scores, dim=-1, descending=largest, stable=True).indices
    return order[..., :k]


def _tie_dense(rows: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 6, (rows, n), generator=g).to(torch.bfloat16) * 0.5  # [rows, n]


@pytest.mark.parametrize("order", ["set", "sequence"])
@pytest.mark.parametrize("largest", [True, False])
def test_lowest_index_tie_breaking_is_tie_exactly_where_sets_differ(order: str, largest: bool) -> None:
    n, k = 40, 7
    tied = _tie_dense(24, n, seed=1)
    distinct = torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(i)) for i in range(8)])
    scores = torch.cat([tied, distinct.to(torch.bfloat16)]).reshape(4, 8, n)  # [4, 8, n]
    expected = torch_cpu_topk(scores, k, largest=largest)[1]  # torch's libstdc++ order
    actual = _lowest_index_topk(scores, k, largest)
    v = classify_index_rows(expected, actual, scores, largest=largest, order=order)
    flat_e, flat_a = expected.reshape(-1, k), actual.reshape(-1, k)
    same_set = [sorted(a) == sorted(b) for a, b in zip(flat_e.tolist(), flat_a.tolist())]
    if order == "set":
        assert v.tie_rows == tuple(r for r, s in enumerate(same_set) if not s)
    else:
        differ = [r for r in range(32) if not torch.equal(flat_e[r], flat_a[r])]
        assert v.tie_rows == tuple(differ)
    assert v.miss == 0 and v.exact + v.tie == 32 and v.tie > 5
    assert all(r < 24 for r in v.tie_rows), "rows of distinct values must be exact"
    # a set can only differ where the k-th value also occurs outside the selection
    for r in v.tie_rows:
        row = scores.reshape(-1, n)[r].float()
        kth = row[flat_e[r]].min() if largest else row[flat_e[r]].max()
        if order == "set":
            assert int((row == kth).sum()) > int((row[flat_e[r]] == kth).sum())
    ex = v.first_tie
    assert ex is not None and ex.row == (v.tie_rows[0] // 8, v.tie_rows[0] % 8)
    if order == "set":
        assert ex.only_expected and all(s == ex.kth_score for _, s in ex.only_expected + ex.only_actual)
        assert ex.tied_total > ex.tied_selected == ex.tied_selected_actual


def test_dropping_a_strictly_better_score_is_a_miss() -> None:
    scores = torch.tensor([[5.0, 1.0, 1.0, 4.0, 1.0, 0.0]])
    expected = torch.tensor([[0, 3, 1]])  # kth = 1.0, tied at 1, 2, 4
    for order in ("set", "sequence"):  # a tied id swapped in at the same slot
        assert classify_index_rows(expected, torch.tensor([[0, 3, 2]]), scores, order=order).tie == 1
    v = classify_index_rows(expected, torch.tensor([[0, 4, 1]]), scores, order="set")  # 4.0 dropped
    assert (v.exact, v.tie, v.miss) == (0, 0, 1) and v.miss_rows == (0,)
    ex = v.first_miss
    assert ex is not None and ex.only_expected == [(3, 4.0)] and ex.only_actual == [(4, 1.0)]
    assert ex.kth_score == 1.0 and (ex.tied_total, ex.tied_selected, ex.tied_selected_actual) == (3, 1, 2)
    assert "only in expected (id, score): [(3, 4.0)]" in v.describe()
    v = classify_index_rows(expected, torch.tensor([[0, 3, 5]]), scores, order="set")  # 0.0 < kth
    assert v.miss == 1 and v.first_miss.only_actual == [(5, 0.0)]


def test_sequence_order_permutations() -> None:
    scores = torch.tensor([[3.0, 3.0, 2.0, 1.0]])
    expected = torch.tensor([[0, 1, 2]])
    v = classify_index_rows(expected, torch.tensor([[1, 0, 2]]), scores)  # equal scores swapped
    assert v.tie == 1
    v = classify_index_rows(expected, torch.tensor([[0, 2, 1]]), scores)  # 3.0 and 2.0 swapped
    assert v.miss == 1 and not any(v.violations.values())
    v = classify_index_rows(expected, torch.tensor([[0, 2, 1]]), scores, order="set")
    assert v.all_exact and v.exact == 1 and v.non_exact_rows == ()


def test_nan_scores_tie_with_each_other_and_signed_zeros_are_equal() -> None:
    scores = torch.tensor([[NAN, 1.0, NAN, NAN, 0.0, -0.0]])
    v = classify_index_rows(torch.tensor([[0, 2]]), torch.tensor([[3, 0]]), scores, order="set")
    assert v.tie == 1 and math.isnan(v.first_tie.kth_score) and v.first_tie.tied_total == 3
    v = classify_index_rows(
        torch.tensor([[4, 5, 1, 0]]), torch.tensor([[4, 5, 1, 2]]), scores, largest=False
    )  # smallest: NaN is worst, so it is the k-th here
    assert v.tie == 1 and math.isnan(v.first_tie.kth_score)
    # equal multisets are not enough: the differing ids must tie with the k-th score (1.0 here)
    v = classify_index_rows(torch.tensor([[1, 4]]), torch.tensor([[1, 5]]), scores, largest=False)
    assert v.miss == 1
    v = classify_index_rows(torch.tensor([[4, 5]]), torch.tensor([[5, 4]]), scores, largest=False)
    assert v.tie == 1  # -0.0 == 0.0 position by position


def test_offset_sentinels_and_indexer_style_rows() -> None:
    # indexer layout: ids = position + offset ascending, then a -1 tail (M:580)
    scores = torch.tensor([[2.0, 2.0, 2.0, -INF, -INF], [9.0, 1.0, 1.0, 1.0, -INF]])
    expected = torch.tensor([[100, 101, -1], [100, 101, 102]])
    actual = torch.tensor([[101, 102, -1], [100, 102, 103]])
    v = classify_index_rows(expected, actual, scores, offset=100, order="set", id_limit=105)
    assert (v.exact, v.tie, v.miss) == (0, 2, 0)
    assert v.first_tie.only_expected == [(100, 2.0)] and v.first_tie.only_actual == [(102, 2.0)]


@pytest.mark.parametrize("order", ["set", "sequence"])
@pytest.mark.parametrize(
    "actual_row,kind",
    [
        ([0, 7, -1], "out_of_range"),  # position 7 >= N = 6
        ([0, -3, -1], "out_of_range"),  # negative id other than the -1 sentinel
        ([0, 5, -1], "out_of_range"),  # >= id_limit = 5 although inside the scores
        ([1, 1, -1], "duplicate"),
        ([0, -1, -1], "missing_id"),
        ([0, 1, 2], "unexpected_id"),
    ],
)
def test_each_invariant_violation_is_named(order: str, actual_row: list[int], kind: str) -> None:
    scores = torch.tensor([[[1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]])  # [1, 1, 6]
    expected = torch.tensor([[[0, 1, -1]]])
    v = classify_index_rows(expected, torch.tensor([[actual_row]]), scores, order=order, id_limit=5)
    assert v.miss == 1 and v.violations[kind] == 1
    assert sum(v.violations.values()) == 1, v.violations
    assert v.violation_messages == (f"row (0, 0): {VIOLATION_KINDS[kind]} ({kind})",)
    assert f"{VIOLATION_KINDS[kind]} ({kind})" in v.first_miss.violations
    assert kind in v.describe()


def test_out_of_range_ids_have_no_score_in_the_example() -> None:
    scores = torch.tensor([[1.0, 0.5, 0.0]])
    v = classify_index_rows(torch.tensor([[0, 1]]), torch.tensor([[0, 9]]), scores)
    assert v.first_miss.only_actual == [(9, None)] and v.first_miss.only_expected == [(1, 0.5)]


def test_many_rows_and_counts() -> None:
    scores = _tie_dense(200, 64, seed=3)
    scores[7, 11] = 10.0  # a unique best in row 7
    expected = torch_cpu_topk(scores, 8)[1]
    actual = expected.clone()
    actual[5, 0] = actual[5, 1]  # duplicate
    actual[7, actual[7] == 11] = int((scores[7] < 1).nonzero()[0])  # the best swapped for a low one
    v = classify_index_rows(expected, actual, scores, order="set")
    assert v.rows == 200 and v.exact == 198 and v.miss_rows == (5, 7) and v.violations["duplicate"] == 1


def test_empty_and_one_dim_inputs() -> None:
    none = torch.zeros(0, dtype=torch.long)
    v = classify_index_rows(none, none, torch.zeros(0))
    assert (v.rows, v.exact, v.lead_shape) == (1, 1, ())
    v = classify_index_rows(torch.full((2,), -1), torch.tensor([-1, 0]), torch.zeros(0))
    assert v.miss == 1
    assert v.violations == {
        "out_of_range": 1,
        "duplicate": 0,
        "missing_id": 0,
        "unexpected_id": 1,
        "leaked": 0,
        "dropped": 0,
    }
    assert v.first_miss.row == () and v.first_miss.kth_score is None
    v = classify_index_rows(
        torch.zeros(3, 0, 2, dtype=torch.long), torch.zeros(3, 0, 2, dtype=torch.long), torch.zeros(3, 0, 5)
    )
    assert v.rows == v.exact == 0


def test_bad_inputs_raise() -> None:
    s = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="shape"):
        classify_index_rows(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), s)
    with pytest.raises(ValueError, match="leading dims"):
        classify_index_rows(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long), s)
    with pytest.raises(ValueError, match="reference ids are invalid"):
        classify_index_rows(torch.tensor([[0, 4], [0, 1]]), torch.tensor([[0, 1], [0, 1]]), s)
    with pytest.raises(ValueError, match="duplicate"):
        classify_index_rows(torch.tensor([[1, 1], [0, 1]]), torch.tensor([[0, 1], [0, 1]]), s)
    with pytest.raises(TypeError, match="integer"):
        classify_index_rows(torch.zeros(2, 2), torch.zeros(2, 2), s)
    with pytest.raises(ValueError, match="order"):
        classify_index_rows(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long), s, order="bag")  # type: ignore[arg-type]


def test_leak_policy_rows_are_misses_and_an_order_among_masked_rows_stays_tie_order() -> None:
    ninf = float("-inf")
    scores = torch.tensor([[[5.0, ninf, ninf], [4.0, 3.0, ninf]]])  # [b=1, S=2, N=3]
    limit = torch.tensor([[3, 3]])
    expected = torch.tensor([[[0, 1], [0, 1]]])  # row 0 leaks masked row 1

    def judge(actual, leak):
        return classify_index_rows(expected, actual, scores, order="set", id_limit=limit, fill_is_worst=True, leak=leak)

    dropped = judge(torch.tensor([[[0, -1], [0, 1]]]), "upstream")  # -1 for the leak, and no leak anywhere
    assert (dropped.tie, dropped.miss, dropped.violations["dropped"]) == (0, 1, 1)
    assert dropped.leak_policy == "1 row(s) drop where the case leaks"
    assert judge(torch.tensor([[[0, -1], [0, 1]]]), None).tie == 1  # without the policy: a -1 lane ties at -inf
    other = judge(torch.tensor([[[0, 2], [0, 1]]]), "upstream")  # another masked row: tie order
    assert (other.tie, other.miss) == (1, 0)
    leaked = classify_index_rows(
        torch.tensor([[[0, -1], [0, 1]]]),
        torch.tensor([[[0, 1], [0, 1]]]),
        scores,
        order="set",
        id_limit=limit,
        fill_is_worst=True,
        leak="drop",
    )
    assert (leaked.miss, leaked.violations["leaked"], leaked.leak_policy) == (
        1,
        1,
        "1 row(s) leak where the case drops",
    )
