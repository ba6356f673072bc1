"""A tolerance failure proven on a few rows (harness/row_sample.py): never where the whole output passes,
and where it is proven, the whole output fails.

The bound's relative term needs the whole expected tensor's max|e|; the proof caps it by what a passing
output allows given your answer's max|a|. These tests draw outputs that pass and fail by every margin
around the bound, with the largest element in the rows tried or not, and check the proof against the
comparator on the whole output.
"""

from __future__ import annotations

import pytest
import torch

from v41_conformance.compare import compare_output
from v41_conformance.policy import Policy
from v41_conformance.row_sample import expected_cap, fails_on_rows, largest_finite, widened

O_POLICY = Policy(kind="bf16", ulps=2, atol_rel=2**-6, rel_l2=2**-7)  # attention's `o`
# the element bounds alone (a rel L2 of 1): outputs near the bound then pass and fail by it
ELEMENTS = Policy(kind="bf16", ulps=2, atol_rel=2**-6, rel_l2=1.0)
TAILED = Policy(kind="bf16", ulps=2, atol_rel=2**-6, rel_l2=1.0, pre_tail="tail")


def _case(gen: torch.Generator, rows: int, width: int, margin: float, outlier: bool):
    """(expected, actual) bf16 [rows, width]: every element moved by `margin` times its own bound (the
    bound with the whole output's max|e|), one row holding the largest values when `outlier`."""
    e = torch.randn(rows, width, generator=gen)
    if outlier:
        e[int(torch.randint(rows, (1,), generator=gen))] *= 8
    e = e.bfloat16()
    scale = float(e.double().abs().max())
    ulp = e.double().abs().clamp_min(2**-126)
    ulp = torch.pow(2.0, torch.floor(torch.log2(ulp)) - 7)
    bound = 2 * ulp + 2**-6 * scale
    sign = torch.where(torch.rand(rows, width, generator=gen) < 0.5, -1.0, 1.0)
    a = (e.double() + sign * margin * bound * torch.rand(rows, width, generator=gen)).bfloat16()
    return e, a


@pytest.mark.parametrize("policy", [ELEMENTS, TAILED], ids=["o", "rope-tail"])
def test_a_failure_proven_on_rows_is_a_failure_of_the_whole_output(policy):
    """Over outputs that pass and fail by every margin around the bound: a proof on any rows implies the
    whole output fails, and an output that passes is never proven failing."""
    gen = torch.Generator().manual_seed(7)
    params = {"tail": 8}
    proven = passing = 0
    for trial in range(240):
        margin = (0.5, 0.9, 1.0, 1.05, 1.3, 3.0)[trial % 6]
        e, a = _case(gen, rows=24, width=32, margin=margin, outlier=trial % 4 == 0)
        whole = compare_output("o", e, a, policy, {}, params)
        passing += whole.ok
        tried = torch.randperm(24, generator=gen)[: int(torch.randint(1, 9, (1,), generator=gen))].sort().values
        if fails_on_rows("o", e[tried], a[tried], largest_finite(a), policy, {}, params):
            proven += 1
            assert not whole.ok, f"trial {trial}: proven failing on rows {tried.tolist()}, yet the whole passes"
    assert passing > 40 and proven > 40  # both sides drawn, and the proof decides often


def test_a_variant_far_from_your_answer_is_proven_failing_on_its_rows():
    """The sink left out, say: every row moved by far more than its bound. Two rows prove it."""
    gen = torch.Generator().manual_seed(3)
    e = torch.randn(64, 16, generator=gen).bfloat16()
    a = (e.double() * 1.1).bfloat16()
    assert not compare_output("o", e, a, O_POLICY).ok
    assert fails_on_rows("o", e[:2], a[:2], largest_finite(a), O_POLICY, {})


def test_rows_whose_expected_exceeds_the_cap_prove_failure_whatever_their_difference():
    """An expected element beyond S cannot belong to a passing output: your answer, everywhere, is smaller
    than a passing output's largest element allows."""
    a = torch.full((8, 4), 1.0).bfloat16()
    e = a.clone()
    e[3, 1] = 4.0
    cap = expected_cap(largest_finite(a), O_POLICY, torch.bfloat16)
    assert cap is not None and 1.0 < cap < 1.1
    assert fails_on_rows("o", e[3:4], a[3:4], largest_finite(a), O_POLICY, {})
    assert not compare_output("o", e, a, O_POLICY).ok


def test_a_nan_on_one_side_only_is_proven_on_its_row():
    e = torch.randn(16, 8).bfloat16()
    a = e.clone()
    e[5, 2] = float("nan")  # the variant's value
    assert fails_on_rows("o", e[5:6], a[5:6], largest_finite(a), O_POLICY, {})
    assert not compare_output("o", e, a, O_POLICY).ok


def test_rows_that_pass_prove_nothing_about_the_others():
    """A failure confined to rows not tried is not proven: the stage is then computed whole."""
    e = torch.randn(32, 8).bfloat16()
    a = e.clone()
    a[20] = (a[20].double() * 1.5).bfloat16()
    assert not compare_output("o", e, a, O_POLICY).ok
    assert not fails_on_rows("o", e[:8], a[:8], largest_finite(a), O_POLICY, {})


@pytest.mark.parametrize(
    "policy, context",
    [
        (O_POLICY, {"o.exact": torch.zeros(1)}),  # an element as precise as the reference's passes
        (Policy(kind="bf16", ulps=2, terms="terms", term_ulps=2), {"terms": torch.zeros(1)}),
        (Policy(kind="bf16", ulps=2), {"o.acc": torch.zeros(1)}),  # an fp8 GEMM's accumulation
        (Policy(kind="bf16", ulps=2, absent_rows="ids"), {"ids": torch.zeros(1)}),
        (Policy(kind="exact"), {}),
        (Policy(kind="bf16", ulps=2, atol_rel=0.99), {}),  # no cap: the relative terms reach 1
    ],
    ids=["exact-value", "terms", "accumulation", "absent-rows", "not-a-tolerance", "no-cap"],
)
def test_where_anything_else_widens_the_bound_rows_prove_nothing(policy, context):
    e = torch.randn(16, 8).bfloat16()
    a = (e.double() * 3).bfloat16()
    assert widened("o", policy, context) or expected_cap(largest_finite(a), policy, torch.bfloat16) is None
    assert not fails_on_rows("o", e[:2], a[:2], largest_finite(a), policy, context)


def test_rows_judged_by_their_own_largest_value_would_fail_an_output_that_passes():
    """The trap the cap avoids: row 5 is off by 2^-4, beyond 2 ulp + 2^-6 of its own largest value (1), within
    2 ulp + 2^-6 of the output's (row 0's, 8). The whole output passes; its row 5 judged alone would not."""
    e = torch.ones(8, 4).bfloat16()
    e[0] = 8.0
    a = e.clone()
    a[5] = 1.0625
    assert compare_output("o", e, a, ELEMENTS).ok
    assert not compare_output("o", e[5:6], a[5:6], ELEMENTS).ok  # row 5 judged alone
    assert not fails_on_rows("o", e[5:6], a[5:6], largest_finite(a), ELEMENTS, {})
