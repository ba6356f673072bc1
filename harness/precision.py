"""Judging an output for its precision: against its exact value (before any rounding), no farther from
it than the reference's own roundings take the reference (docs/verdicts.md, "GPU arithmetic": more
precision than the reference never fails). The comparator's context carries the exact value where
the judge computed it (`<name>.exact`, NaN where not known) and how far the reference's roundings may
take it (`<name>.exact_error`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

EXACT = ".exact"  # context suffix: `<output>.exact` holds the output's exact value before its roundings
EXACT_ERROR = ".exact_error"  # and `<output>.exact_error` how far the reference's own roundings may take it
ONE_ROUNDING_RMS = 12**-0.5  # the RMS of a round-to-nearest error, in ulps: uniform over [-1/2, 1/2]


def as_precise(
    name: str, e: torch.Tensor, a: torch.Tensor, ulp: torch.Tensor, context: Mapping[str, torch.Tensor]
) -> torch.Tensor | None:
    """Per element, its distance from the exact value (`<name>.exact`) over how far the reference's own
    roundings may take it (`<name>.exact_error`) plus the implementation's own final rounding: at most 1,
    an implementation that rounds less than the reference passes wherever it lands (NaN where the exact
    value is not known; None: no exact value given)."""
    exact, error = context.get(name + EXACT), context.get(name + EXACT_ERROR)
    if exact is None or error is None:
        return None
    x, err = exact.double().reshape(e.shape), error.double().reshape(e.shape)
    known = torch.isfinite(x) & torch.isfinite(err) & torch.isfinite(a)
    share = (a - x).abs() / (err + ulp / 2 + x.abs() * 2.0**-20)
    return torch.where(known, share, torch.full_like(share, float("nan")))


def precision_against_exact(
    name: str,
    e: torch.Tensor,
    a: torch.Tensor,
    finite: torch.Tensor | None,
    context: Mapping[str, torch.Tensor],
    ulp: torch.Tensor,
) -> dict | None:
    """For an output the context gives the exact (unrounded) value of (`<name>.exact`, NaN where it is
    not known): the L2 distances of the implementation's and the reference's values from it, over the
    elements finite everywhere. "More precision than the reference never fails" (docs/verdicts.md).

    The reference's distance stands for what its roundings do; over a few elements it can be luckily
    small (5 index scores, 0.1 ulp from the exact value: a form with one rounding fewer was "20x
    farther"). So it is taken at no less than the distance one rounding of each element to its format
    is expected to carry (`ulp`: its ulps; a rounding error is uniform over one ulp, RMS ulp / sqrt(12)),
    which the reference's bf16 output always carries: over a large output its own distance is above
    that, and the floor changes nothing there."""
    exact = context.get(name + EXACT)
    if exact is None:
        return None
    x = exact.double().reshape(e.shape)
    known = torch.isfinite(x) & torch.isfinite(e) & torch.isfinite(a)
    if finite is not None:
        known &= finite
    zero = torch.zeros((), dtype=torch.float64)
    mine = float(torch.where(known, a - x, zero).norm())
    reference = float(torch.where(known, e - x, zero).norm())
    floor = float(torch.where(known, ulp.double(), zero).norm()) * ONE_ROUNDING_RMS
    judged = max(reference, floor)
    ratio = mine / judged if judged > 0 else (1.0 if mine == 0 else float("inf"))
    return {"exact_l2": mine, "reference_l2": reference, "one_rounding_l2": floor, "exact_ratio": ratio}


def without_exact(context: Mapping[str, torch.Tensor], name: str) -> Mapping[str, torch.Tensor]:
    """`context` without `name`'s exact value and its reach: for an expected value that is not the
    reference's (a diagnosis variant's), which the reference's own distance from the exact value does not
    describe. An output is explained by a variant only by matching it, never by being more precise than it."""
    dropped = (name + EXACT, name + EXACT_ERROR)
    if not any(key in context for key in dropped):
        return context
    return {key: value for key, value in context.items() if key not in dropped}
