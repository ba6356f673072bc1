"""The comparator's modes, each shown failing on wrong answers and passing on right ones."""

from __future__ import annotations

from dataclasses import replace

import torch

from v41_conformance.compare import compare_output, ulp_of
from v41_conformance.policy import Policy

BF16 = Policy("bf16", ulps=1, rel_l2=2**-9)


def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_exact_is_bitwise_and_reports_the_differing_elements():
    e = torch.tensor([0.0, 1.0, -2.0])
    assert compare_output("y", e, e.clone(), Policy("exact")).ok
    verdict = compare_output("y", e, torch.tensor([0.0, 1.0, -2.5]), Policy("exact"))
    assert not verdict.ok and "1 / 3" in verdict.message and "[2]" in verdict.message
    nan_payload = torch.tensor([0.0, 1.0, float("nan")])
    other = nan_payload.clone().view(torch.int32)
    other[2] += 1
    assert not compare_output("y", nan_payload, other.view(torch.float32), Policy("exact")).ok


def test_a_signed_zero_is_one_named_class_in_every_kind():
    """-0 for +0 (or back) is counted as a signed zero and accepted, by every comparator; it is
    never a mismatch nor a boundary flip; strict_signed_zeros (accept_signed_zeros false) fails it."""
    e = torch.tensor([-0.0, 1.0, -2.0])
    got = torch.tensor([0.0, 1.0, -2.0])
    strict = {"accept_signed_zeros": False}
    for policy in (Policy("exact"), BF16, Policy("f32", ulps=1)):
        expected, actual = (e.to(torch.bfloat16), got.to(torch.bfloat16)) if policy.kind == "bf16" else (e, got)
        verdict = compare_output("y", expected, actual, policy)
        assert verdict.ok and verdict.metrics["signed_zeros"] == 1, policy.kind
        assert "1 element(s) differ only in the sign of a zero" in verdict.message and "expected -0" in verdict.message
        refused = compare_output("y", expected, actual, replace(policy, **strict))
        assert not refused.ok and "sign of a zero" in refused.message, policy.kind
    codes = Policy("exact", zero_codes=(0x0, 0x8))  # e2m1 codes: 8 is -0
    verdict = compare_output(
        "codes", torch.tensor([8, 3], dtype=torch.uint8), torch.tensor([0, 3], dtype=torch.uint8), codes
    )
    assert verdict.ok and verdict.metrics["signed_zeros"] == 1
    wrong = compare_output(
        "codes", torch.tensor([8, 3], dtype=torch.uint8), torch.tensor([1, 3], dtype=torch.uint8), codes
    )
    assert not wrong.ok and "signed_zeros" not in wrong.metrics  # a real code difference next to zero


def test_attributes_come_first():
    e = torch.zeros(4, dtype=torch.bfloat16)
    assert "dtype float32 != expected bfloat16" in compare_output("y", e, torch.zeros(4), BF16).message
    assert "shape [5] != expected [4]" in compare_output("y", e, torch.zeros(5, dtype=torch.bfloat16), BF16).message
    assert "expected a torch.Tensor" in compare_output("y", e, [0.0] * 4, BF16).message


def test_ulp_of_bf16_and_f32():
    e = torch.tensor([1.0, 1.5, 2.0, 0.0, 3e-39])
    assert ulp_of(e, torch.bfloat16).tolist()[:3] == [2**-7, 2**-7, 2**-6]
    assert ulp_of(e, torch.float32)[0] == 2**-23
    assert ulp_of(e, torch.bfloat16)[3] == 2**-133  # bf16 subnormal spacing at zero


def test_bf16_accepts_another_summation_order_and_rejects_trivial_answers():
    x = torch.randn(64, 256, generator=_gen(), dtype=torch.float64)
    w = torch.randn(256, 128, generator=_gen(1), dtype=torch.float64)
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    expected = (xb.double() @ wb.double()).float().to(torch.bfloat16)  # ideal fp32 accumulator
    reordered = torch.zeros(64, 128)
    for k in reversed(range(0, 256, 32)):  # fp32 sums in blocks, back to front
        reordered += xb[:, k : k + 32].float() @ wb[k : k + 32].float()
    other_order = reordered.to(torch.bfloat16)
    assert not torch.equal(other_order, expected)
    verdict = compare_output("y", expected, other_order, BF16)
    assert verdict.ok and verdict.metrics["max_ulps"] <= 1
    for wrong in (
        torch.zeros_like(expected),
        (expected.double() * (1 + 2**-6)).to(torch.bfloat16),
        (expected.double() + ulp_of(expected, torch.bfloat16)).to(torch.bfloat16),
    ):
        assert not compare_output("y", expected, wrong, BF16).ok


def test_masks_of_non_finite_and_sentinel_values_must_match():
    e = torch.tensor([1.0, float("inf"), 0.0, 2.0]).to(torch.bfloat16)
    nan = e.clone()
    nan[0] = float("nan")
    assert "NaN positions differ" in compare_output("y", e, nan, BF16).message
    finite = e.clone()
    finite[1] = 3.0
    assert "+inf positions differ" in compare_output("y", e, finite, BF16).message


def test_absent_rows_come_from_the_ids_never_from_a_zero_in_the_golden():
    """A row whose lanes are all -1 must be exactly 0; an exact 0 of a row with present lanes is a value."""
    e = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 2.0], [0.5, 0.0]]]).to(torch.bfloat16)  # [b=2, m=2, d=2]
    ids = torch.tensor([[[3, -1], [-1, -1]], [[0, 1], [2, 4]]], dtype=torch.int32)  # row [0, 1] absent
    policy = Policy("bf16", ulps=1, rel_l2=1.0, atol=1e-2, absent_rows="in.ids")
    context = {"in.ids": ids}
    near = e.clone()
    near[1, 1, 1] = 1e-3  # a present row's real 0 (the golden's accident): within atol
    near[0, 0, 1] = -1e-3
    verdict = compare_output("o", e, near, policy, context)
    assert verdict.ok, verdict.message
    leaked = e.clone()
    leaked[0, 1, 0] = 1e-3  # the absent row leaks: within atol, but it must stay exactly 0
    verdict = compare_output("o", e, leaked, policy, context)
    assert (
        not verdict.ok
        and "absent rows (every lane of in.ids is -1) must be exactly 0: not at 1 element" in verdict.message
    )
    assert "[0, 1, 0]" in verdict.message
    nan = e.clone()
    nan[0, 1, 1] = float("nan")  # a NaN in an absent row (a running max from -inf)
    assert not compare_output("o", e, nan, policy, context).ok
    signed = e.clone()
    signed[0, 1, 1] = -0.0
    assert compare_output("o", e, signed, policy, context).ok  # -0 is exactly 0 (a signed zero, counted)
    assert compare_output("o", e, near, Policy("bf16", ulps=1, rel_l2=1.0, atol=1e-2)).ok


def test_diff_fraction_catches_a_moved_rounding_point():
    e = torch.randn(4096, generator=_gen(2)).to(torch.bfloat16)
    flipped = e.clone()
    flipped[::4] = (e[::4].double() + ulp_of(e[::4], torch.bfloat16)).to(torch.bfloat16)
    loose = Policy("bf16", ulps=2, rel_l2=0.01)
    assert compare_output("y", e, flipped, loose).ok
    strict = Policy("bf16", ulps=2, rel_l2=0.01, max_diff_fraction=0.02)
    verdict = compare_output("y", e, flipped, strict)
    assert not verdict.ok and "25% of elements differ" in verdict.message


def test_f32_atol_rel_absorbs_cancellation_but_not_scaling():
    x = torch.randn(16, 1024, generator=_gen(3))
    w = torch.randn(1024, 32, generator=_gen(4))
    expected = (x.double() @ w.double()).float()
    fp32 = x @ w
    policy = Policy("f32", ulps=8, atol_rel=2**-16, rel_l2=1e-5)
    assert compare_output("y", expected, fp32, policy).ok
    assert not compare_output("y", expected, (expected.double() * (1 + 2**-6)).float(), policy).ok


def test_index_outputs_exact_tie_and_miss():
    scores = torch.tensor([[5.0, 3.0, 3.0, 1.0], [4.0, 3.0, 2.0, 1.0]])
    expected = torch.tensor([[0, 1], [0, 1]])
    policy = Policy("index", scores="aux.s", order="sequence")
    aux = {"aux.s": scores}
    assert compare_output("ids", expected, expected.clone(), policy, aux).ok
    tie = compare_output("ids", expected, torch.tensor([[0, 2], [0, 1]]), policy, aux)
    assert not tie.ok and tie.metrics["rows_tie"] == 1 and tie.metrics["rows_miss"] == 0
    accepting = Policy("index", scores="aux.s", order="sequence", accept_ties=True)
    assert compare_output("ids", expected, torch.tensor([[0, 2], [0, 1]]), accepting, aux).ok
    miss = compare_output("ids", expected, torch.tensor([[0, 1], [0, 2]]), accepting, aux)
    assert not miss.ok and miss.metrics["rows_miss"] == 1


def test_set_ordered_ids_must_be_ascending_with_the_fill_last():
    scores = torch.tensor([[1.0, 2.0, 3.0, float("-inf")]])
    policy = Policy("index", scores="aux.s", order="set")
    expected = torch.tensor([[1, 2, -1]])
    verdict = compare_output("ids", expected, torch.tensor([[2, 1, -1]]), policy, {"aux.s": scores})
    assert not verdict.ok and "not in ascending order" in verdict.message


def test_empty_index_rows_compare_equal_and_count_their_rows():
    """A ratio-2 layer after a one-position prefill selects nothing: ids [b, S, 0]."""
    import torch

    from v41_conformance.compare import compare_output
    from v41_conformance.policy import Policy

    empty = torch.zeros(2, 3, 0, dtype=torch.int32)
    verdict = compare_output(
        "ids",
        empty,
        empty.clone(),
        Policy(kind="index", scores="aux.s", order="set"),
        {"aux.s": torch.zeros(2, 3, 5)},
        {},
    )
    assert verdict.ok and verdict.metrics["rows"] == 6
    wrong = compare_output("ids", empty, torch.zeros(2, 3, 1, dtype=torch.int32), Policy(kind="index"), {}, {})
    assert not wrong.ok and "shape" in wrong.message


def test_term_allowance_accepts_one_term_rounding_the_other_way_and_counts_it():
    # A score of 0.5 whose largest head term is 64: one bf16 flip of that term (0.5) moves it to 1.0.
    policy = Policy("bf16", ulps=1, rel_l2=1.0, terms="term_scale", term_ulps=2)
    expected = torch.tensor([0.5, 8.0, 8.0], dtype=torch.bfloat16)
    context = {"term_scale": torch.tensor([64.0, 1.0, 1.0])}
    flipped = torch.tensor([1.0, 8.0, 8.0], dtype=torch.bfloat16)
    verdict = compare_output("scores", expected, flipped, policy, context)
    assert verdict.ok and verdict.metrics["boundary_flips"] == 1
    assert "1 element(s)" in verdict.message and "largest term 64" in verdict.message
    # Two flips' worth of a small term, or a jump well past one flip of a large one, still fail.
    assert not compare_output(
        "scores", expected, torch.tensor([0.5, 8.125, 8.0], dtype=torch.bfloat16), policy, context
    ).ok
    assert not compare_output(
        "scores", expected, torch.tensor([2.0, 8.0, 8.0], dtype=torch.bfloat16), policy, context
    ).ok
    # Without the aux tensor the golden is stale: say so.
    try:
        compare_output("scores", expected, flipped, policy, {})
    except KeyError as exc:
        assert "conformance generate" in str(exc)
    else:
        raise AssertionError("a missing aux tensor must be an error")


def test_the_share_of_differing_elements_is_counted_over_at_least_256_with_the_counts_spread():
    """2% plus 4 standard deviations of that binomial count, at least 2% of 256 (8.9 of 128, 38.6 of
    1024): a correct answer's few flips on a small output pass, an RMSNorm that rounds before its weight
    (11-44% of elements) fails."""
    policy = Policy("bf16", ulps=1, rel_l2=1.0, max_diff_fraction=0.02)
    expected = torch.ones(128, dtype=torch.bfloat16)
    six = expected.clone()
    six[:6] = 1.0078125  # one ulp: 4.7% of 128 (6 of 192 came out on a fresh case for upstream's arithmetic)
    assert compare_output("rows", expected, six, policy).ok
    moved = expected.clone()
    moved[:22] = 1.0078125  # 17% of 128: a moved rounding point
    verdict = compare_output("rows", expected, moved, policy)
    assert (
        not verdict.ok
        and "plus 4 standard deviations of that count, at least 2% of 256: 8.96 element(s)" in verdict.message
    )
    large = torch.ones(1024, dtype=torch.bfloat16)
    many = large.clone()
    many[:39] = 1.0078125  # 3.8% of 1024: past 20.5 + 4 x 4.5 = 38.6
    assert not compare_output("rows", large, many, policy).ok
    many[38] = 1.0  # 38 of 1024: within 38.6
    assert compare_output("rows", large, many, policy).ok


def test_rel_l2_of_an_argument_allowance_judges_only_the_unexplained_error():
    # cos at angles near 2^20, where one fp32 ulp of the angle is 0.0625 rad.
    angle = torch.full((64,), 2.0**20) + torch.arange(64) * 0.0625
    expected = torch.cos(angle.double()).float()
    shifted = torch.cos(angle.double() + 0.0625).float()  # the angle one ulp over: correct arithmetic
    policy = Policy("f32", ulps=2, rel_l2=2**-7, argument="angle", argument_ulps=4)
    context = {"angle": angle}
    assert compare_output("table", expected, shifted, policy, context).ok
    scaled = expected * (1 + 2**-6)  # inside the allowance element-wise wherever cos is small ...
    wrong = torch.cos(angle.double() + 1.0).float()  # ... but a radian off is not
    assert not compare_output("table", expected, wrong, policy, context).ok
    assert compare_output("table", expected, scaled, policy, context).ok  # 2^-6 < 4 * 0.0625: unexplainable apart


def test_a_quantised_signed_zero_is_not_a_boundary_flip_nor_a_mismatch():
    """kv.finish-like: a value that rounds to -0 far from any boundary comes back +0 (a port whose
    dequantisation table has +0 at the code of -0): one signed zero, as in every other kind."""
    from v41_conformance.reference.numerics import fp4_qdq_e8m0

    x = torch.linspace(-6, 6, 32).to(torch.bfloat16)
    x[5] = -0.1  # rounds to -0 under scale 1, 0.15 from the boundary 0.25
    q = fp4_qdq_e8m0(x[None], 32)
    assert torch.signbit(q.y[0, 5]) and q.y[0, 5] == 0
    pol = Policy("quantised", quant="fp4_e8m0", encoding="values", pre="pre", boundary_ulps=2)
    for encoding, expected in (("values", q.y), ("codes", q.codes)):
        actual = expected.clone()
        actual[0, 5] = 0.0 if encoding == "values" else 0
        verdict = compare_output("y", expected, actual, replace(pol, encoding=encoding), {"pre": x[None]}, {})
        assert verdict.ok and verdict.metrics["signed_zeros"] == 1, (encoding, verdict.message)
        assert not verdict.metrics.get("boundary_flips") and "boundary 0" not in verdict.message
        strict = compare_output(
            "y", expected, actual, replace(pol, encoding=encoding, accept_signed_zeros=False), {"pre": x[None]}, {}
        )
        assert not strict.ok and "sign of a zero" in strict.message


def test_failure_messages_give_each_allowance_in_its_unit_and_say_what_is_not_finite():
    e = torch.tensor([1.0, 2.0, 1e-30, 4.0])
    a = torch.tensor([1.0, 2.5, 1e-30, 4.0])
    verdict = compare_output("y", e, a, Policy("f32", ulps=1, atol=1e-6, rel_l2=0.5))
    worst = next(line for line in verdict.message.splitlines() if "worst element" in line)
    assert "ulp (allowed |diff| " in worst and worst.endswith(" ulp)")  # the bound in both units
    assert "inside the absolute allowance" not in verdict.message  # the worst ulps are at 2.0
    near_zero = compare_output(
        "y", e, torch.tensor([1.0, 2.0, 5e-7, 4.0]), Policy("f32", ulps=1, rel_l2=0.0, atol=1e-7)
    )
    assert "at an expected 1e-30, inside the absolute allowance 1e-07" in near_zero.message
    nan = compare_output("y", e, torch.full((4,), float("nan")), Policy("f32", ulps=1, rel_l2=0.5))
    assert not nan.ok and nan.metrics["max_ulps"] is None and nan.metrics["rel_l2"] is None
    assert "NaN positions differ at 4 element(s)" in nan.message and "no element is finite on both sides" in nan.message
    whole = compare_output("y", e, e + 1, Policy("f32", ulps=1, rel_l2=0.5))
    assert "100% of elements differ" in whole.message and "allowed 100%" not in whole.message


def test_an_exact_failure_names_the_position_it_differs_at_where_the_output_labels_it():
    from v41_conformance.known import components, get

    components()
    spec = get("attention").output_spec("s00.published")
    assert spec.labels == ("compress_kv", "index_k", "topk_idxs", "candidates")
    e = torch.tensor([[True, True, False, False], [False, True, False, False]])
    a = e.clone()
    a[1, 1] = False  # layer 1 did not publish its index keys
    verdict = compare_output("s00.published", e, a, spec.base_policy())
    assert "[1, 1] (index_k) | False | True" in verdict.message
    assert "labels" not in spec.base_policy().to_json()  # a message aid, not part of the policy


def test_a_zero_expected_value_is_never_said_to_be_inside_an_allowance_of_zero():
    """indexer/consumer-r1-prefill-s21-blocks2-top3: 4.4e-4 against a recomputed 0, no absolute
    floor: the message says the ulp of zero is tiny and that there is no allowance, not that the
    value sits inside an allowance of 0."""
    e = torch.tensor([0.0, 1.0, 2.0, 4.0])
    a = torch.tensor([4.4e-4, 1.0, 2.0, 4.0])
    verdict = compare_output("scores", e, a, Policy("f32", ulps=1, rel_l2=0.5))
    assert not verdict.ok and "inside the absolute allowance" not in verdict.message
    assert "at an expected 0, where one ulp is 1.4e-45; this output has no absolute allowance" in verdict.message
    floored = compare_output("scores", e, a, Policy("f32", ulps=1, rel_l2=0.0, atol=1e-4))
    assert "at an expected 0, inside the absolute allowance 0.0001" in floored.message


def test_a_statistic_over_a_handful_of_elements_decides_nothing_the_element_bounds_do():
    """rel L2 <= 2^-9 is tighter than one ulp on a 9-element output: a correct answer 1 ulp off at a third
    of its elements would fail by chance. Below 256 elements the L2 allowance grows as sqrt(256 / n), and
    the element-wise bounds catch the real bugs near it (a 1 + 2^-6 scale, a lost ReLU)."""
    e = (1 + torch.rand(9, generator=_gen(3))).to(torch.bfloat16)
    one_ulp = e.clone()
    one_ulp[::3] = (e[::3].double() + ulp_of(e[::3], torch.bfloat16)).to(torch.bfloat16)
    verdict = compare_output("s", e, one_ulp, BF16)
    assert verdict.metrics["rel_l2"] > 2**-9  # the coin the old rule flipped
    assert verdict.ok, verdict.message
    scaled = (e.double() * (1 + 2**-6)).to(torch.bfloat16)
    verdict = compare_output("s", e, scaled, BF16)
    assert not verdict.ok and verdict.metrics["mismatched"] >= 5, verdict.message
    assert "fewer than 256" in verdict.message  # the message says why the L2 allowance is wider
    relu = torch.tensor([0.0, 0.0, 1.5, 0.25, 0.0, 3.0], dtype=torch.bfloat16)
    lost = torch.tensor([-0.125, 0.0, 1.5, 0.25, -2.0, 3.0], dtype=torch.bfloat16)  # ReLU dropped
    assert not compare_output("s", relu, lost, BF16).ok
    big = (1 + torch.rand(4096, generator=_gen(5))).to(torch.bfloat16)
    shifted = (big.double() + ulp_of(big, torch.bfloat16)).to(torch.bfloat16)  # 1 ulp everywhere: a bias
    assert not compare_output("s", big, shifted, BF16).ok  # from 256 elements on, rel L2 decides as before


def test_the_precision_margin_of_a_small_output_follows_its_count():
    """One index score that cancels over its heads (fuzz seed 35, index 497): a form with one rounding fewer
    lands 6.8x farther from the exact value than the reference happened to, within what the reference's
    own roundings may do there. A ratio of two one-element L2 norms is a coin: its 1.125 margin grows as
    sqrt(256 / n) (18 here); 150x farther still fails."""
    policy = Policy("bf16", ulps=1, rel_l2=2**-9, precision=True)
    expected = torch.tensor([0.02490234375], dtype=torch.bfloat16)
    context = {
        "s.exact": torch.tensor([0.024808883666992188], dtype=torch.float64),
        "s.exact_error": torch.tensor([0.009450927376747131], dtype=torch.float64),
    }
    one_fewer = torch.tensor([0.024169921875], dtype=torch.bfloat16)
    verdict = compare_output("s", expected, one_fewer, policy, context)
    assert verdict.ok and verdict.metrics["exact_ratio"] > 6, verdict.message
    far = torch.tensor([0.0390625], dtype=torch.bfloat16)  # 0.014 from the exact value: beyond 0.0095
    assert not compare_output("s", expected, far, policy, context).ok


def test_a_reference_that_lands_close_by_luck_does_not_set_the_precision_bar():
    """A decode step's 5 index scores (attention fuzz seed 36, index 1942; three are ReLU zeros): the
    reference happened to land 0.1 ulp from the exact value, and a form with per-head dot products kept in
    fp32 (ExactHeadDots) lands 2 ulps away, within what the reference's own roundings may do there (the
    head terms reach 2.04 and cancel). Its distance is judged against the larger of the reference's and what
    one rounding of each element is expected to carry (RMS ulp / sqrt(12)); the reference x (1 + 2^-6) and
    an answer beyond the element's reach still fail."""
    policy = Policy("bf16", ulps=1, rel_l2=2**-9, precision=True)
    expected = torch.tensor([0.0, 0.0, 0.0, -0.9453125, -0.26171875], dtype=torch.bfloat16)
    context = {
        "s.exact": torch.tensor([0.0, 0.0, 0.0, -0.9453353881835938, -0.2621002197265625], dtype=torch.float64),
        "s.exact_error": torch.tensor([4.6e-41, 4.6e-41, 4.6e-41, 0.022309303283691406, 0.003172636032104492]),
    }
    precise = torch.tensor([0.0, 0.0, 0.0, -0.9375, -0.26171875], dtype=torch.bfloat16)
    verdict = compare_output("s", expected, precise, policy, context)
    assert verdict.ok, verdict.message
    metrics = verdict.metrics
    assert metrics["exact_l2"] / metrics["reference_l2"] > 20  # the ratio the reference's luck gave
    assert metrics["one_rounding_l2"] > metrics["reference_l2"] and metrics["exact_ratio"] < 8
    scaled = (expected.double() * (1 + 2**-6)).to(torch.bfloat16)
    verdict = compare_output("s", expected, scaled, policy, context)
    assert not verdict.ok and "what one rounding of each element is expected to carry" in verdict.message
    far = torch.tensor([0.0, 0.0, 0.0, -0.9140625, -0.26171875], dtype=torch.bfloat16)  # 0.031: beyond 0.022
    assert not compare_output("s", expected, far, policy, context).ok


def test_rel_l2_over_a_few_differing_elements_of_a_large_output_decides_no_more_than_they_do():
    """4 of 160 index scores one ulp off (a form with one rounding fewer, fuzz seed 35, index 54): rel L2 is a
    statistic over those 4, so its allowance is that of 4 elements; a bias over every element still fails."""
    e = torch.full((160,), 0.01, dtype=torch.bfloat16)
    e[:4] = 1.5  # the large scores carry the norm
    few = e.clone()
    few[:4] = (e[:4].double() + ulp_of(e[:4], torch.bfloat16)).to(torch.bfloat16)
    verdict = compare_output("s", e, few, BF16)
    assert verdict.metrics["rel_l2"] > 2**-9 and verdict.ok, verdict.message
    biased = (e.double() + ulp_of(e, torch.bfloat16)).to(torch.bfloat16)  # every element one ulp up
    big = torch.cat([e] * 2)
    assert not compare_output("s", big, torch.cat([biased] * 2), BF16).ok


def test_the_share_leaves_out_elements_as_precise_as_the_reference_only_where_the_whole_output_is():
    """An output judged for its precision (`<name>.exact`, `.exact_error`): the reference rounds twice
    (a perturbation within its reach, then bf16), a form with one rounding fewer rounds the exact value
    once. It differs from the golden in far more than 2% of elements and passes; an answer rounded from
    twice the reference's perturbation differs as often, lies farther from the exact value, and fails."""
    gen = torch.Generator().manual_seed(3)
    exact = torch.randn(1024, generator=gen, dtype=torch.float64)
    reach = ulp_of(exact.to(torch.bfloat16), torch.bfloat16).double() / 2
    wobble = (torch.rand(1024, generator=gen, dtype=torch.float64) * 2 - 1) * reach
    expected = (exact + wobble).to(torch.bfloat16)  # the reference: within its reach, then rounded
    context = {"rows.exact": exact, "rows.exact_error": reach}
    policy = Policy("bf16", ulps=3, max_diff_fraction=0.02, precision=True)
    once = exact.to(torch.bfloat16)
    verdict = compare_output("rows", expected, once, policy, context)
    assert verdict.ok and verdict.metrics["diff_fraction"] > 0.1 and verdict.metrics["exact_ratio"] < 1
    assert verdict.metrics["as_precise_differing"] == int((once != expected).sum())
    farther = (exact + 2 * wobble).to(torch.bfloat16)
    verdict = compare_output("rows", expected, farther, policy, context)
    assert not verdict.ok and verdict.metrics["exact_ratio"] > 1, verdict.metrics
    assert "of elements differ (allowed 2%" in verdict.message
    assert compare_output("rows", expected, once, policy).ok is False  # without the exact value: the share decides
