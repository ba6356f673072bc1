"""Compressor reference: arithmetic, state ring, schedule invariance, metadata (compressor.py)."""

from __future__ import annotations

import math

import pytest
import torch

from v41_conformance.reference.compressor import (
    CompressorWeights,
    check_ring_capacity,
    completed_groups,
    compressor_metadata,
    compressor_oneshot,
    compressor_projections,
    compressor_run,
    compressor_step,
    exact_step_rows,
    live_slots,
    new_ring,
    pending_state,
    pool_group,
    ring_capacity,
)
from v41_conformance.reference.numerics import linear_bf16, rms_norm
from v41_conformance.schedules import (
    compositions,
    from_lengths,
    prefill_then_decode,
    ragged,
    schedule_name,
    speculative,
    with_rollback,
)

T7 = 7


def make_weights(dim: int, hd: int, ratio: int, seed: int = 0) -> CompressorWeights:
    g = torch.Generator().manual_seed(seed)
    wkv = (torch.randn(hd, dim, generator=g) / math.sqrt(dim)).bfloat16()
    wgate = (torch.randn(hd, dim, generator=g) / math.sqrt(dim)).bfloat16()
    norm_w = (1 + 0.1 * torch.randn(hd, generator=g)).bfloat16()
    if ratio == 1:
        return CompressorWeights(wkv=wkv, norm_w=norm_w)
    return CompressorWeights(wkv=wkv.float(), norm_w=norm_w, wgate=wgate.float())


def make_x(b: int, t: int, dim: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, t, dim, generator=torch.Generator().manual_seed(seed)).bfloat16()


W2 = make_weights(128, 128, 2)
W1 = make_weights(128, 128, 1)
X = make_x(2, 40, 128)
X7 = X[:, :T7]


_ONESHOT: dict[tuple[int, int, int, int], tuple] = {}  # values keep x and weights alive, so ids stay unique


def oneshot_prefix(x: torch.Tensor, weights: CompressorWeights, ratio: int, end: int):
    """Rows, positions and pending state of the one-shot run over x[:, :end] (memoised)."""
    key = (id(x), id(weights), ratio, end)
    if key not in _ONESHOT:
        res = compressor_oneshot(x[:, :end], weights, ratio)
        _ONESHOT[key] = (res.rows, res.row_positions, pending_state(res.ring, end, ratio), x, weights)
    return _ONESHOT[key][:3]


def assert_matches_oneshot(x, weights, ratio, schedule, ring_size=None, drafts=None):
    """The run's accepted rows, positions and live slots equal the one-shot run, after every step."""
    run = compressor_run(x, schedule, weights, ratio, ring_size=ring_size, drafts=drafts)
    end = schedule[-1][1]
    rows, pos, pending = oneshot_prefix(x, weights, ratio, end)
    assert torch.equal(run.row_positions, pos)
    assert torch.equal(run.rows, rows)
    assert torch.equal(pending_state(run.ring, end, ratio), pending)
    # per step: the rows that step completed and the ring's live slots, against one-shot prefixes
    for (start, stop), step in zip(schedule, run.steps):
        rows_p, pos_p, pending_p = oneshot_prefix(x, weights, ratio, stop)
        keep = pos_p // ratio >= start // ratio
        assert torch.equal(step.row_positions, pos_p[keep])
        if drafts is None:  # a draft's rejected tail legitimately differs
            assert torch.equal(step.rows, rows_p[:, keep])
            assert torch.equal(pending_state(step.ring, stop, ratio), pending_p)
    return run


# ------------------------------------------------------------------------------------------
# Schedule invariance
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", compositions(T7), ids=schedule_name)
def test_every_composition_of_7_matches_oneshot_ratio2(schedule):
    assert_matches_oneshot(X7, W2, 2, schedule, ring_size=ring_capacity(2, T7))


def test_compositions_of_7_ratio1():
    for schedule in compositions(T7):
        run = assert_matches_oneshot(X7, W1, 1, schedule)
        assert run.ring.shape == (2, 0, 2, 128)


def test_oneshot_of_7_has_three_rows_and_one_pending():
    res = compressor_oneshot(X[:, :T7], W2, 2)
    assert res.rows.shape == (2, 3, 128) and res.rows.dtype == torch.bfloat16
    assert res.row_positions.tolist() == [0, 2, 4]
    pending = pending_state(res.ring, T7, 2)  # position 6 (score, latent)
    assert torch.equal(pending[:, 0], compressor_projections(X[:, 6:7], W2)[:, 0])


@pytest.mark.parametrize("n", [20, 21, 33])
@pytest.mark.parametrize("sizes", [[3, 5], [4], [6, 1, 2], [2]])
def test_ragged_and_short_final_chunks(n, sizes):
    schedule = ragged(n, sizes)
    assert_matches_oneshot(X, W2, 2, schedule)
    assert_matches_oneshot(X, W1, 1, schedule)


@pytest.mark.parametrize("prefill", [1, 5, 6])
def test_prefill_then_single_token_decode(prefill):
    schedule = prefill_then_decode(prefill, 9)
    # a decode step of one token needs only r slots; the prefill needs r + prefill - 1
    assert_matches_oneshot(X, W2, 2, schedule, ring_size=max(2, ring_capacity(2, prefill)))
    assert_matches_oneshot(X, W1, 1, schedule)


@pytest.mark.parametrize("prefill", [5, 6])
def test_multi_token_decode_up_to_q_max_6_with_ring_7(prefill):
    schedule = speculative(prefill, [6, 1, 3, 6, 2, 5, 4], q_max=6)
    assert_matches_oneshot(X, W2, 2, schedule, ring_size=7)


def test_rollback_equals_never_writing_rejected_positions():
    schedule = with_rollback(5, [(4, 2), (6, 1), (3, 0), (5, 5), (6, 3)], final_step=2, q_max=6)
    garbage = make_x(2, 40, 128, seed=99)
    drafts = {}
    for i in range(1, len(schedule) - 1):
        start, end = schedule[i]
        accepted = schedule[i + 1][0] - start
        drafts[i] = torch.cat([X[:, start : start + accepted], garbage[:, start + accepted : end]], dim=1)
    run = assert_matches_oneshot(X, W2, 2, schedule, ring_size=7, drafts=drafts)
    # against a run that never saw the rejected positions
    clean = compressor_run(X, from_lengths([schedule[0][1]] + [schedule[-1][1] - schedule[0][1]]), W2, 2, ring_size=30)
    assert torch.equal(run.rows, clean.rows)
    end = schedule[-1][1]
    assert torch.equal(pending_state(run.ring, end, 2), pending_state(clean.ring, end, 2))
    # the rejected drafts did produce different rows for the groups they closed
    step = run.steps[1]  # wrote 5..8 with garbage at 7, 8; closed the groups (4,5) and (6,7)
    assert step.row_positions.tolist() == [4, 6]
    rows_ok, pos_ok, _ = oneshot_prefix(X, W2, 2, 9)
    assert torch.equal(step.rows[:, :1], rows_ok[:, pos_ok == 4])  # accepted group
    assert not torch.equal(step.rows[:, 1:], rows_ok[:, pos_ok == 6])  # dropped by the run


def test_rollback_through_the_step_api_overwrites_slots():
    ring = new_ring(2, 7, 128)
    s0 = compressor_step(X[:, :5], 0, ring, W2, 2)
    draft = make_x(2, 4, 128, seed=5)
    s1 = compressor_step(draft, 5, s0.ring, W2, 2)  # positions 5..8, all rejected
    s2 = compressor_step(X[:, 5:9], 5, s1.ring, W2, 2)  # restart at 5
    direct = compressor_step(X[:, 5:9], 5, s0.ring, W2, 2)
    assert torch.equal(s2.rows, direct.rows) and torch.equal(s2.ring, direct.ring)


@pytest.mark.parametrize("schedule", [from_lengths([1, 3, 3]), prefill_then_decode(1, 6)], ids=schedule_name)
def test_production_dims_match_oneshot(schedule):
    w = make_weights(5120, 512, 2, seed=3)
    x = make_x(1, T7, 5120, seed=4)
    assert_matches_oneshot(x, w, 2, schedule, ring_size=8)


# ------------------------------------------------------------------------------------------
# Arithmetic (plain comparisons: torch.testing imports sympy, about a second per process)
# ------------------------------------------------------------------------------------------


def test_ratio2_matches_upstream_prefill_formulation_bitwise():
    """Upstream prefill (M:466-475): unflatten groups, softmax over the group axis (dim 2), sum,
    one cast to bf16, RMSNorm; fed the same per-position projections."""
    t = 21
    proj = compressor_projections(X[:, :t], W2)  # [b, t, 2, hd]
    score, kv = proj[:, : t - t % 2, 0], proj[:, : t - t % 2, 1]
    kv, score = kv.unflatten(1, (-1, 2)), score.unflatten(1, (-1, 2))  # [b, G, 2, hd]
    expected = rms_norm((kv * score.softmax(dim=2)).sum(dim=2).to(torch.bfloat16), W2.norm_w)
    assert torch.equal(compressor_oneshot(X[:, :t], W2, 2).rows, expected)


def test_ratio2_matches_independent_float64_formula():
    t = 12
    x64 = X[:, :t].double()
    kv = x64 @ W2.wkv.double().T  # [b, t, hd]
    sc = x64 @ W2.wgate.double().T
    s0, s1, v0, v1 = sc[:, 0::2], sc[:, 1::2], kv[:, 0::2], kv[:, 1::2]
    w0 = 1.0 / (1.0 + torch.exp(s1 - s0))  # softmax of the two scores, per channel
    pooled = w0 * v0 + (1.0 - w0) * v1  # [b, G, hd] float64
    # pooled fp32 (before the bf16 cast) agrees to fp32 rounding
    groups = compressor_projections(X[:, :t], W2).unflatten(1, (-1, 2))  # [b, G, 2, 2, hd]
    pooled32 = torch.stack([pool_group(groups[:, j]) for j in range(t // 2)], dim=1)
    assert ((pooled32.double() - pooled).abs() <= 1e-5 * pooled.abs() + 1e-6).all()
    # rows: RMSNorm in float64 of the bf16-rounded pooled value, within one bf16 rounding
    p = pooled32.to(torch.bfloat16).double()
    ref = W2.norm_w.double() * p / p.square().mean(-1, keepdim=True).sqrt()
    rows = compressor_oneshot(X[:, :t], W2, 2).rows.double()
    assert ((rows - ref).abs() <= ref.abs() * 2**-8 + 1e-30).all()


def test_ratio1_is_rms_norm_of_bf16_projection_per_position():
    t = 9
    rows = compressor_oneshot(X[:, :t], W1, 1).rows
    for p in range(t):
        expected = rms_norm(linear_bf16(X[:, p : p + 1], W1.wkv), W1.norm_w)
        assert torch.equal(rows[:, p : p + 1], expected)
    # the whole-chunk GEMM of upstream agrees to within one bf16 rounding step
    whole = rms_norm(linear_bf16(X[:, :t], W1.wkv), W1.norm_w).float()
    assert ((rows.float() - whole).abs() <= whole.abs() * 2**-7 + 1e-6).all()
    assert compressor_oneshot(X[:, :t], W1, 1).row_positions.tolist() == list(range(t))


def test_bf16_checkpoint_weights_are_promoted_exactly_at_ratio2():
    w_bf16 = CompressorWeights(wkv=W2.wkv.bfloat16(), norm_w=W2.norm_w, wgate=W2.wgate.bfloat16())
    assert torch.equal(compressor_oneshot(X[:, :8], w_bf16, 2).rows, compressor_oneshot(X[:, :8], W2, 2).rows)


def test_step_does_not_modify_its_input_ring():
    ring = new_ring(2, 7, 128)
    before = ring.clone()
    compressor_step(X[:, :3], 0, ring, W2, 2)
    assert torch.equal(ring, before)


def test_new_ring_layout():
    ring = new_ring(2, 7, 4)
    assert ring.shape == (2, 7, 2, 4) and ring.dtype == torch.float32
    assert torch.isneginf(ring[:, :, 0]).all() and (ring[:, :, 1] == 0).all()


# ------------------------------------------------------------------------------------------
# Ring capacity and the undersized-ring hazard (seed 000 §A.2)
# ------------------------------------------------------------------------------------------


def test_ring_capacity_and_check():
    assert ring_capacity(2, 6) == 7 and ring_capacity(2, 1) == 2 and ring_capacity(1, 6) == 0
    check_ring_capacity(7, 2, 6)
    with pytest.raises(ValueError, match=r"S >= r \+ q_max - 1 = 7"):
        check_ring_capacity(6, 2, 6)
    with pytest.raises(ValueError, match="too small"):
        compressor_step(X[:, :6], 1, new_ring(2, 6, 128), W2, 2)


def test_live_slots():
    assert live_slots(7, 2, 7).tolist() == [6]
    assert live_slots(9, 2, 7).tolist() == [1]
    assert live_slots(8, 2, 7).tolist() == []
    assert live_slots(5, 1, 0).tolist() == []


# The seed's lab: values v and positive weights w per position and channel (hd = 2); the step
# sees them through identity projections, x = [v0, v1, log w0, log w1] (dim 4).
LAB = [  # (v, w) per position 0..6
    ((0, 10), (1, 3)),
    ((8, 2), (3, 1)),  # pair (0,1) -> (6, 8)
    ((4, 0), (1, 1)),
    ((12, 6), (1, 1)),  # pair (2,3) -> (8, 3)
    ((2, 5), (1, 1)),
    ((4, 5), (1, 1)),  # pair (4,5) -> (3, 5)
    ((9, 14), (2, 1)),  # pending; in slot 0 of a 6-slot ring it turns pair (0,1) into (42/5, 8)
]
LAB_W = CompressorWeights(
    wkv=torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0]]),
    wgate=torch.tensor([[0.0, 0, 1, 0], [0, 0, 0, 1]]),
    norm_w=torch.ones(2, dtype=torch.bfloat16),
)
LAB_X = torch.tensor([[[*v, math.log(w[0]), math.log(w[1])] for v, w in LAB]]).bfloat16()  # [1, 7, 4]


def _lab_pair(w_a, v_a, w_b, v_b):
    return [(w_a[d] * v_a[d] + w_b[d] * v_b[d]) / (w_a[d] + w_b[d]) for d in range(2)]


def test_undersized_ring_corrupts_the_first_pair():
    (v0, w0), (v1, w1), (v6, w6) = LAB[0], LAB[1], LAB[6]
    assert _lab_pair(w0, v0, w1, v1) == [6, 8]
    assert _lab_pair(w6, v6, w1, v1) == [42 / 5, 8]
    results = {}
    for slots in (7, 6):
        s0 = compressor_step(LAB_X[:, :1], 0, new_ring(1, slots, 2), LAB_W, 2)
        s1 = compressor_step(LAB_X[:, 1:7], 1, s0.ring, LAB_W, 2, check_capacity=False)
        assert s1.row_positions.tolist() == [0, 2, 4]
        results[slots] = s1
        # pooled value of pair (0, 1) as read back from the ring (bf16 log-weights: ~1e-2 off)
        pooled = pool_group(s1.ring[:, [0 % slots, 1 % slots]])[0]
        expected = [6, 8] if slots == 7 else [42 / 5, 8]
        assert (pooled - torch.tensor(expected)).abs().max() < 0.05, (slots, pooled)
    # the correct ring gives rms_norm((6, 8)); the undersized ring a visibly different row
    good = rms_norm(torch.tensor([[[6.0, 8.0]]]).bfloat16(), LAB_W.norm_w)
    assert (results[7].rows[:, :1].float() - good.float()).abs().max() < 0.02
    assert (results[6].rows[0, 0].float() - results[7].rows[0, 0].float()).abs().max() > 0.1
    # the other two pairs are untouched
    assert torch.equal(results[6].rows[:, 1:], results[7].rows[:, 1:])
    # and with the check on, the 6-slot step is refused
    with pytest.raises(ValueError, match="needs S >= r \\+ q_max - 1 = 7"):
        compressor_step(LAB_X[:, 1:7], 1, new_ring(1, 6, 2), LAB_W, 2)


# ------------------------------------------------------------------------------------------
# Metadata (seed 000 §A.1.1)
# ------------------------------------------------------------------------------------------


def test_prefill_metadata_seed_figures():
    got = []
    for start, end in [(0, 1), (1, 4), (4, 7)]:
        meta = compressor_metadata("prefill", start, end - start, 2)
        got.append((int(meta.valid.sum()), len(meta.valid)))
    assert got == [(0, 1), (2, 2), (1, 1)]
    placeholder = compressor_metadata("prefill", 0, 1, 2)
    assert placeholder.row_positions.tolist() == [0] and placeholder.store_slots.tolist() == [-1]
    meta = compressor_metadata("prefill", 1, 3, 2)
    assert meta.row_positions.tolist() == [0, 2] and meta.store_slots.tolist() == [0, 1]
    assert meta.row_positions.dtype == torch.int64 and meta.valid.dtype == torch.bool


def test_decode_metadata_one_row_per_query():
    meta = compressor_metadata("decode", 5, 4, 2)  # positions 5, 6, 7, 8: 5 and 7 close groups
    assert meta.valid.tolist() == [True, False, True, False]
    assert meta.store_slots.tolist() == [2, -1, 3, -1]
    assert meta.row_positions.tolist() == [4, 0, 6, 0]
    r1 = compressor_metadata("decode", 5, 2, 1)
    assert r1.valid.tolist() == [True, True] and r1.store_slots.tolist() == [5, 6]


def test_metadata_agrees_with_the_step():
    for start, end in [(0, 1), (1, 4), (4, 7), (7, 8), (8, 13)]:
        step_pos = [2 * j for j in completed_groups(start, end, 2)]
        meta = compressor_metadata("prefill", start, end - start, 2)
        assert meta.row_positions[meta.valid].tolist() == step_pos


# ------------------------------------------------------------------------------------------
# Refusals
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0, 3, 4])
def test_unsupported_ratios_are_refused(ratio):
    with pytest.raises(ValueError, match="ratios 1 and 2"):
        compressor_step(X[:, :4], 0, new_ring(2, 8, 128), W2, ratio)
    with pytest.raises(ValueError, match="ratios 1 and 2"):
        compressor_metadata("prefill", 0, 4, ratio)
    with pytest.raises(ValueError, match="ratios 1 and 2"):
        ring_capacity(ratio, 6)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="needs a ring"):
        compressor_step(X[:, :4], 0, None, W2, 2)
    with pytest.raises(ValueError, match="bf16"):
        compressor_step(X[:, :4].float(), 0, new_ring(2, 8, 128), W2, 2)
    with pytest.raises(ValueError, match="ratio 1 wkv"):
        compressor_step(X[:, :4], 0, None, CompressorWeights(wkv=W2.wkv, norm_w=W2.norm_w), 1)
    with pytest.raises(ValueError, match="wgate"):
        compressor_step(X[:, :4], 0, new_ring(2, 8, 128), W1, 2)
    with pytest.raises(ValueError, match="prefill' or 'decode"):
        compressor_metadata("chunk", 0, 4, 2)


def test_the_ratio1_rows_admit_a_gpus_accumulation_and_not_a_bf16_accumulator():
    """exact_step_rows' accumulation allowance (harness/accumulation.py, BF16_GEMM_ALLOWANCE) at K = 5120:
    the most cancelling element moved by what an H200's cuBLAS bf16 GEMM did (8.6 fp32 units of its sum of
    |terms|, the worst of 2,097,152) passes, and needs the allowance; moved by a running sum kept in bf16
    (tests/impls/gpu_arith.py, the Bf16GemmBf16Accumulator mutant's arithmetic) it fails."""
    from gpu_arith import bf16_accumulator_matmul
    from v41_conformance.accumulation import BF16_GEMM_ALLOWANCE
    from v41_conformance.precision import as_precise
    from v41_conformance.ulps import ulp_of

    g = torch.Generator().manual_seed(5)
    k, hd = 5120, 64
    x = torch.randn(1, 16, k, generator=g).to(torch.bfloat16)
    w = CompressorWeights(
        (torch.randn(hd, k, generator=g) / k**0.5).to(torch.bfloat16), torch.ones(hd, dtype=torch.bfloat16)
    )
    exact_p = x[0].double() @ w.wkv.double().T
    terms = x[0].double().abs() @ w.wkv.double().abs().T
    i = int((terms / exact_p.abs()).argmax())  # the most cancelling element
    row, ch = divmod(i, hd)

    def rows(p: torch.Tensor) -> torch.Tensor:  # the reference's rows from a GEMM result p (fp32)
        return rms_norm(p.to(torch.bfloat16)[None], w.norm_w, w.eps)

    def share(actual: torch.Tensor, allowance: float) -> float:
        exact, error = exact_step_rows(x, 0, None, w, 1, allowance)
        expected = rows(exact_p.float())
        context = {"rows.exact": exact, "rows.exact_error": error}
        shares = as_precise("rows", expected, actual, ulp_of(expected, torch.bfloat16), context)
        return float(shares[0, row, ch])

    gpu = exact_p.clone()
    gpu[row, ch] += 8.6 * 2.0**-24 * terms[row, ch] * torch.sign(exact_p[row, ch])
    assert share(rows(gpu.float()), BF16_GEMM_ALLOWANCE) <= 1
    assert share(rows(gpu.float()), 0.0) > 1  # the flat allowances alone would fail it
    bf16_sum = bf16_accumulator_matmul(x[0], w.wkv).double()
    assert share(rows(bf16_sum.float()), BF16_GEMM_ALLOWANCE) > 1
