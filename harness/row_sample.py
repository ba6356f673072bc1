"""A tolerance failure proven on a few rows of an output, without computing the others.

A diagnosis screens a variant on one stage of a chain (harness/runner.py, `stage_judged`); at a
1,030-token prefill that stage is a minute of work under most variants, and most variants fail it.
A tolerance policy's bound on an element is

    ulps x ulp(e) + atol + atol_rel x max|e|

and every term but the last is the element's own. The last needs the whole expected tensor, so a
failure on some rows, judged with their own max|e|, proves nothing. A cap on max|e| does: were the
stage to pass under the variant, its largest element e_j (finite, as your a_j is) would lie within
its bound of a_j, with ulp(e_j) <= sqrt(2) 2^-p |e_j| + ulp_min (p mantissa bits; a RoPE pair's norm,
whose ulp a rotated channel takes, is at most sqrt(2) times its larger element), so

    max|e| <= S = (max|a| + ulps x ulp_min + atol) / (1 - atol_rel - ulps x sqrt(2) x 2^-p)

with max|a| over your finite elements. An expected element beyond S, an element of the rows tried
beyond its bound taken with max|e| = S, or a NaN or inf on one side only, contradicts the pass: the
stage fails, as computing it whole would find. The rows are judged by the comparator itself, with
one row of value S (equal on both sides) standing for the rows not computed.

Only where nothing else widens an element's bound: no exact value (an element as precise as the
reference passes), no term, argument or accumulation allowance, no absent rows. Elsewhere it proves
nothing (False), and the stage is computed whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from .accumulation import ACC, ACC_RMS
from .compare import compare_output
from .policy import Policy
from .precision import EXACT
from .ulps import MANTISSA_BITS, MIN_EXPONENT


def widened(name: str, policy: Policy, context: Mapping[str, torch.Tensor]) -> bool:
    """Whether anything but the policy's ulps, atol and atol_rel x max|e| bounds an element of `name`
    (or the policy is not a tolerance at all)."""
    if policy.kind in ("exact", "quantised", "index"):
        return True
    keys = (policy.absent_rows, policy.argument, policy.terms, name + ACC, name + ACC_RMS, name + EXACT)
    return any(key is not None and key in context for key in keys)


def largest_finite(actual: torch.Tensor) -> float:
    """max|a| over the finite elements of your whole output (0 where none is)."""
    a = actual.abs()
    a = a[torch.isfinite(a)]
    return float(a.max()) if a.numel() else 0.0


def expected_cap(largest: float, policy: Policy, fmt: torch.dtype) -> float | None:
    """S of the module docstring, given your output's `largest_finite`: the largest max|e| under which it
    can pass; None where the policy's relative terms leave no cap (their sum reaches 1)."""
    bits = MANTISSA_BITS[fmt]
    slack = 1.0 - policy.atol_rel - policy.ulps * math.sqrt(2.0) * 2.0**-bits
    if slack <= 0:
        return None
    ulp_min = 2.0 ** (MIN_EXPONENT[fmt] - bits)
    return (largest + policy.ulps * ulp_min + policy.atol) / slack


def fails_on_rows(
    name: str,
    expected_rows: torch.Tensor,
    actual_rows: torch.Tensor,
    largest: float,
    policy: Policy,
    context: Mapping[str, torch.Tensor],
    params: dict[str, Any] | None = None,
) -> bool:
    """Whether some rows of an output (`expected_rows`, `actual_rows`: [n, ...], the same flat rows of
    yours, whose `largest_finite` is `largest`) prove that the whole output fails `policy` (module
    docstring)."""
    if widened(name, policy, context) or not expected_rows.shape[0]:
        return False
    fmt = torch.bfloat16 if policy.kind == "bf16" else expected_rows.dtype
    if fmt not in MANTISSA_BITS or not expected_rows.dtype.is_floating_point:
        return False
    cap = expected_cap(largest, policy, fmt)
    if cap is None or not math.isfinite(cap):
        return False
    e = expected_rows.double()
    if bool((torch.isfinite(e) & (e.abs() > cap)).any()):
        return True  # larger than any expected value of a passing stage
    pad, value = None, cap
    for _ in range(4):  # S in the stage's format, rounded up (a larger S only widens the bounds)
        pad = torch.tensor(value, dtype=torch.float64).to(expected_rows.dtype)
        if float(pad) >= cap:
            break
        value *= 1.0 + 2.0**-6
    if pad is None or not (float(pad) >= cap and math.isfinite(float(pad))):
        return False
    stand_in = pad.expand(1, *expected_rows.shape[1:])
    verdict = compare_output(
        name,
        torch.cat([expected_rows, stand_in]),
        torch.cat([actual_rows, stand_in.to(actual_rows.dtype)]),
        policy,
        {},
        params,
    )
    return bool(verdict.metrics.get("mismatched"))
