"""The comparator: (expected, actual, policy) -> verdict. Pure; no I/O, no execution.

Attributes first (dtype, shape), then values. Exact outputs compare bits. Tolerance outputs
check the masks of non-finite positions and of the rows the inputs mark absent, then an element-wise bound in units in
the last place of the expected value, then a global relative L2 error. Quantised outputs compare
exactly and, when they differ, ask the boundary verdict whether each difference is a rounding
boundary flip (harness/boundary.py). Index outputs compare exactly and, when they differ, ask the
index verdict whether the difference is tie order, a near tie or a miss. Every verdict carries
its metrics, so a passing case also shows how close it came (headroom) and what it accepted.

`context` holds what the golden offers the comparator: inputs as `in.<name>`, the reference's
outputs as `out.<name>`, and the aux tensors under their own names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .accumulation import FLIP_MARGIN, accumulation_allowance, expected_spread
from .policy import PRECISION_MARGIN, ZERO_CODES, Policy
from .logit_scale import Z_LIMIT as LOGIT_Z_LIMIT
from .logit_scale import logit_scale_error
from .precision import as_precise, precision_against_exact
from .ulps import MANTISSA_BITS, rope_magnitude, ulp_of

TABLE_ROWS = 8
# Context suffix: `<pre>.own` is a bool mask of the elements whose value before quantisation is the
# implementation's own (an intermediate it returned): the quantiser is exact there, no flip is
# accepted (docs/verdicts.md, "The chain").
OWN_PRE = ".own"
# Differences a verdict may accept, each counted per output: metric key -> what it counts.
ACCEPTED_METRICS = {
    "rows_tie": "rows that differ only in tie order",
    "rows_near_tie": "rows that differ only among near-tied ids",
    "boundary_flips": "elements one step across a rounding boundary",
}


def argmax_index(t: torch.Tensor) -> tuple[int, ...]:
    """The index of the largest element, as a tuple (torch.unravel_index would import sympy: a second
    per process that judges a failure)."""
    flat, index = int(torch.argmax(t)), []
    for size in reversed(t.shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


@dataclass
class OutputVerdict:
    name: str
    ok: bool
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)


def compare_output(
    name: str,
    expected: torch.Tensor,
    actual: Any,
    policy: Policy,
    context: Mapping[str, torch.Tensor] | None = None,
    params: dict[str, Any] | None = None,
) -> OutputVerdict:
    """Judge one output tensor. Never raises on bad `actual`; reports it instead."""
    problem = _attribute_problem(expected, actual)
    if problem:
        return OutputVerdict(name, False, f"output '{name}': {problem}")
    if torch.equal(_bits(expected), _bits(actual)):  # bit-identical: skip the element-wise work
        return identical_verdict(name, expected, policy)
    if policy.kind == "exact":
        return _compare_exact(name, expected, actual, policy)
    if policy.kind == "quantised":
        return _compare_quantised(name, expected, actual, policy, context or {}, params or {})
    if policy.kind == "index":
        return _compare_index(name, expected, actual, policy, context or {}, params or {})
    return _compare_tolerant(name, expected, actual, policy, context or {}, params or {})


def identical_verdict(name: str, expected: torch.Tensor, policy: Policy) -> OutputVerdict:
    """The verdict of an output bit-identical to the expected one: every bound holds with zero error
    (the reference's ids passed their invariants when the golden was generated)."""
    if policy.kind == "exact":
        return OutputVerdict(name, True, metrics={"mismatched": 0, "numel": expected.numel()})
    if policy.kind == "quantised":
        return OutputVerdict(
            name, True, metrics={"mismatched": 0, "numel": expected.numel(), "boundary_flips": 0, "scale_flips": 0}
        )
    if policy.kind == "index":
        rows = math.prod(expected.shape[:-1]) if expected.dim() else 1  # [b, S, 0] ids: b*S empty rows
        return OutputVerdict(
            name, True, metrics={"rows": rows, "rows_exact": rows, "rows_tie": 0, "rows_near_tie": 0, "rows_miss": 0}
        )
    return OutputVerdict(
        name,
        True,
        metrics={
            "numel": expected.numel(),
            "mismatched": 0,
            "max_abs_err": 0.0,
            "max_ulps": 0.0,
            "rel_l2": 0.0,
            "diff_fraction": 0.0,
            "bound_used": 0.0,
            "ulps_headroom": 0.0 if policy.ulps else None,
            "rel_l2_headroom": 0.0 if policy.rel_l2 else None,
        },
    )


def _attribute_problem(expected: torch.Tensor, actual: Any) -> str:
    if not isinstance(actual, torch.Tensor):
        return f"expected a torch.Tensor, got {type(actual).__name__}"
    if actual.dtype != expected.dtype:
        return f"dtype {_dtype(actual.dtype)} != expected {_dtype(expected.dtype)}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {list(actual.shape)} != expected {list(expected.shape)}"
    if actual.device.type != "cpu":
        return f"tensor is on {actual.device}, the harness expects it moved back to the CPU"
    return ""


def _mask_failure(bad: torch.Tensor, what: str, expected: torch.Tensor, actual: torch.Tensor, lines: list[str]) -> int:
    """How many elements `bad` marks; where any, a line saying so with the first of them."""
    count = int(bad.sum())
    if count:
        first = tuple(bad.nonzero()[0].tolist())
        lines.append(
            f"  {what} {count} element(s); first at {list(first)}: actual {_fmt(actual[first])}, "
            f"expected {_fmt(expected[first])}"
        )
    return count


def absent_mask(expected: torch.Tensor, policy: Policy, context: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """bool, the output's shape: the elements under a row whose ids (`policy.absent_rows`, [..., K] over the
    output's leading dims) are all -1. None when the policy names no ids or no row is absent."""
    if not policy.absent_rows:
        return None
    ids = context.get(policy.absent_rows)
    if ids is None:
        raise KeyError(f"the judge lacks {policy.absent_rows!r} (the ids that mark absent rows)")
    rows = (ids == -1).all(dim=-1) if ids.shape[-1] else torch.ones(ids.shape[:-1], dtype=torch.bool)
    if not bool(rows.any()):
        return None
    lead = rows.dim()
    if tuple(rows.shape) != tuple(expected.shape[:lead]):
        raise ValueError(
            f"{policy.absent_rows} rows {list(rows.shape)} do not lead the output's shape {list(expected.shape)}"
        )
    return rows.reshape(*rows.shape, *(1,) * (expected.dim() - lead)).expand(expected.shape)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view that makes bitwise comparison exact for every dtype."""
    if t.dtype.is_floating_point:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.contiguous().view(width)
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t


def _compare_exact(
    name: str, expected: torch.Tensor, actual: torch.Tensor, policy: Policy | None = None
) -> OutputVerdict:
    differ = _bits(expected) != _bits(actual)
    signed = signed_zeros(expected, actual, _zero_codes(policy)) & differ
    n_signed = int(signed.sum())
    accept = policy is None or policy.accept_signed_zeros
    if n_signed and accept:
        differ &= ~signed
    count = int(differ.sum())
    metrics = {"mismatched": count, "numel": expected.numel()}
    if n_signed:
        metrics["signed_zeros"] = n_signed
    if count == 0:
        return OutputVerdict(name, True, signed_zero_note(name, expected, actual, signed), metrics)
    lines = [f"output '{name}': not bit-identical (exact comparison)", _mismatch_count(count, expected.numel())]
    if n_signed:
        lines.append(
            f"  {n_signed} element(s) differ only in the sign of a zero"
            + (" (accepted by policy; not counted above)" if accept else " (counted: strict_signed_zeros)")
        )
    lines += _value_table(expected, actual, differ, policy.labels if policy is not None else ())
    return OutputVerdict(name, False, "\n".join(lines), metrics)


def _zero_codes(policy: Policy | None) -> tuple[int, ...]:
    """The zero codes of an exact or quantised code output (none for values, packed codes, scales)."""
    if policy is None:
        return ()
    if policy.zero_codes:
        return policy.zero_codes
    if policy.kind == "quantised" and policy.encoding == "codes" and policy.quant:
        from .boundary import FORMATS

        return ZERO_CODES[FORMATS[policy.quant].element]
    return ()


def signed_zeros(expected: torch.Tensor, actual: torch.Tensor, zero_codes: tuple[int, ...] = ()) -> torch.Tensor:
    """bool mask: elements that are a zero on both sides with different signs (floats), or two
    different zero codes (`zero_codes`, for code outputs)."""
    if expected.dtype.is_floating_point:
        return (expected == 0) & (actual == 0) & (torch.signbit(expected) != torch.signbit(actual))
    if zero_codes and not expected.dtype.is_complex and expected.dtype != torch.bool:
        codes = torch.tensor(zero_codes, dtype=expected.dtype)
        return torch.isin(expected, codes) & torch.isin(actual, codes) & (expected != actual)
    return torch.zeros(expected.shape, dtype=torch.bool)


def signed_zero_note(name: str, expected: torch.Tensor, actual: torch.Tensor, signed: torch.Tensor) -> str:
    """What a passing output's signed zeros were: how many, and the first."""
    n = int(signed.sum())
    if not n:
        return ""
    first = tuple(int(i) for i in signed.nonzero()[0]) if signed.dim() else ()
    return (
        f"output '{name}': {n} element(s) differ only in the sign of a zero (accepted by policy; "
        f"strict_signed_zeros: true fails them); first at {list(first)}: actual {_fmt(actual[first])}, "
        f"expected {_fmt(expected[first])}"
    )


def _mismatch_count(count: int, numel: int) -> str:
    return f"  mismatched elements: {count} / {numel} ({100.0 * count / max(numel, 1):.3g}%)"


def _value_table(
    expected: torch.Tensor, actual: torch.Tensor, differ: torch.Tensor, labels: tuple[str, ...] = ()
) -> list[str]:
    where = differ.nonzero()
    rows = ["  index | actual | expected"]
    for idx in where[:TABLE_ROWS].tolist():
        i = tuple(idx)
        named = f" ({labels[i[-1]]})" if labels and i and i[-1] < len(labels) else ""
        rows.append(f"  {list(i)}{named} | {_fmt(actual[i])} | {_fmt(expected[i])}")
    if len(where) > TABLE_ROWS:
        rows.append(f"  ... {len(where) - TABLE_ROWS} more")
    return rows


def _fmt(value: torch.Tensor) -> str:
    item = value.item()
    if isinstance(item, float):
        return f"{item:.9g}"
    return str(item)


def _aux_ulps(
    expected: torch.Tensor,
    context: Mapping[str, torch.Tensor],
    name: str | None,
    ulps: float,
    fmt: torch.dtype,
    what: str,
) -> torch.Tensor | float:
    """`ulps` units in the last place (of `fmt`) of aux tensor `name`, broadcast over the
    output's trailing dims; 0 when the policy names no tensor or no ulps."""
    if not (name and ulps):
        return 0.0
    tensor = context.get(name)
    if tensor is None:
        raise KeyError(f"the golden lacks aux tensor {name!r} ({what}); regenerate it with `conformance generate`")
    allowance = ulps * ulp_of(tensor, fmt)
    while allowance.dim() < expected.dim():
        allowance = allowance.unsqueeze(-1)
    return allowance


def _argument_allowance(
    expected: torch.Tensor, policy: Policy, context: Mapping[str, torch.Tensor]
) -> torch.Tensor | float:
    """`argument_ulps` fp32 ulps of the argument of a transcendental output (|f'| <= 1 for cos and sin)."""
    return _aux_ulps(
        expected, context, policy.argument, policy.argument_ulps, torch.float32, "the argument of this output"
    )


def _term_allowance(
    expected: torch.Tensor, policy: Policy, context: Mapping[str, torch.Tensor]
) -> torch.Tensor | float:
    """`term_ulps` bf16 ulps of the largest bf16-rounded term summed into each element: a correct
    implementation that sums that term's own inputs in another order may round it the other way
    (docs/verdicts.md, "Intermediate roundings")."""
    return _aux_ulps(
        expected, context, policy.terms, policy.term_ulps, torch.bfloat16, "the largest term of each element"
    )


def _compare_tolerant(
    name: str,
    expected: torch.Tensor,
    actual: torch.Tensor,
    policy: Policy,
    context: Mapping[str, torch.Tensor],
    params: dict[str, Any] | None = None,
) -> OutputVerdict:
    fmt = torch.bfloat16 if policy.kind == "bf16" else expected.dtype
    if fmt not in MANTISSA_BITS:
        fmt = torch.float32
    e = expected.double()
    a = actual.double()
    lines: list[str] = []
    # 1. masks: NaN, +inf and -inf positions must agree exactly, and rows the inputs mark absent must be
    # exactly 0 on both sides (skipped, with the masks' other passes, when both sides are finite everywhere
    # and no row is absent).
    absent = absent_mask(expected, policy, context)
    plain = absent is None and bool(torch.isfinite(expected).all()) and bool(torch.isfinite(actual).all())
    mask_failures = 0
    if plain:
        finite = None
        diff = (a - e).abs()
    else:
        masks = {
            "NaN": (torch.isnan(e), torch.isnan(a)),
            "+inf": (e == float("inf"), a == float("inf")),
            "-inf": (e == float("-inf"), a == float("-inf")),
        }
        for label, (me, ma) in masks.items():
            bad = (me != ma) if absent is None else (me != ma) & ~absent
            mask_failures += _mask_failure(bad, f"{label} positions differ at", expected, actual, lines)
        finite = torch.isfinite(e) & torch.isfinite(a)
        if absent is not None:
            bad = absent & ((a != 0) | (e != 0))  # NaN != 0 too
            mask_failures += _mask_failure(
                bad,
                f"absent rows (every lane of {policy.absent_rows} is -1) must be exactly 0: not at",
                expected,
                actual,
                lines,
            )
            finite &= ~absent
        diff = torch.where(finite, (a - e).abs(), torch.zeros_like(e))
    tail = int(_param(params, policy.pre_tail)) if policy.pre_tail and params is not None else 0
    ulp = ulp_of(expected, fmt)
    if tail:  # the rotated channels: ulps of the RoPE pair's norm
        pairs = e[..., -tail:] if finite is None else torch.where(finite, e, torch.zeros_like(e))[..., -tail:]
        ulp[..., -tail:] = ulp_of(rope_magnitude(pairs, tail), fmt)
    ulps = diff / ulp if finite is None else torch.where(finite, diff / ulp, torch.zeros_like(e))
    if finite is None:
        scale = float(expected.abs().max()) if e.numel() else 0.0
    else:
        scale = float(torch.where(finite, e.abs(), torch.zeros_like(e)).max()) if e.numel() else 0.0
    argument_allowance = _argument_allowance(expected, policy, context)
    accumulation = accumulation_allowance(name, expected, policy.accumulator_bits, context)
    own = policy.ulps * ulp + policy.atol + policy.atol_rel * scale + argument_allowance + accumulation
    bound = own + _term_allowance(expected, policy, context)
    over = diff > bound if finite is None else finite & (diff > bound)
    precise = as_precise(name, e, a, ulp, context)  # per element: its distance from the exact value over the
    if precise is not None:  # reference's own (NaN where not known)
        over &= ~(precise <= 1)
    over_count = int(over.sum())
    # Elements inside the bound only thanks to the term allowance: one intermediate term rounded
    # the other way. Counted (and shown in every report) like the quantisers' boundary flips.
    term_flips = int(((diff > own) & (diff <= bound)).sum()) if policy.terms and policy.term_ulps else 0
    ref_norm = float((e if finite is None else torch.where(finite, e, torch.zeros_like(e))).norm())
    # rel L2 judges the error the argument's rounding does not explain: at large angles one fp32 ulp
    # of the argument is a large step of cos and sin for every correct implementation alike. The
    # hardware's accumulation is not subtracted element by element (its elementwise allowance of a
    # long GEMM would hide a small error on every element); the error it is expected to carry as a
    # whole is added to the allowed rel L2 below.
    explained = argument_allowance
    beyond = diff if isinstance(explained, float) and explained == 0.0 else (diff - explained).clamp_min(0.0)
    if finite is not None and not isinstance(explained, float):
        beyond = torch.where(finite, beyond, torch.zeros_like(beyond))
    err_norm = float(beyond.norm())
    rel_l2: float | None = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    precision = precision_against_exact(name, e, a, finite, context, ulp)
    logit = logit_scale_error(name, e, a, ulp, finite, context)
    max_ulps: float | None = float(ulps.max()) if ulps.numel() else 0.0
    counted = expected.numel() if finite is None else int(finite.sum())
    differing = int((diff > 0).sum()) + mask_failures
    diff_fraction = differing / max(counted + mask_failures, 1)
    max_abs: float | None = float(diff.max()) if diff.numel() else 0.0
    if isinstance(bound, torch.Tensor) and bool((bound > 0).all()):
        used = diff / bound
    else:
        used = torch.where(
            bound > 0, diff / torch.where(bound > 0, bound, 1.0), torch.where(diff > 0, float("inf"), 0.0)
        )
    if precise is not None:  # an element as precise as the reference uses the smaller share
        used = torch.where(torch.isnan(precise), used, torch.minimum(used, precise))
    bound_used: float | None = float(used.max()) if used.numel() else 0.0
    if mask_failures and not counted:  # nothing finite on both sides: no error to measure
        max_ulps, max_abs, rel_l2, bound_used = None, None, None, None
    metrics: dict[str, Any] = {
        "numel": expected.numel(),
        "mismatched": over_count + mask_failures,
        "nonfinite_mismatches": mask_failures,
        "max_abs_err": max_abs,
        "max_ulps": max_ulps,
        "rel_l2": rel_l2,
        "diff_fraction": diff_fraction,
        # no headroom to speak of when non-finite values are misplaced
        "bound_used": bound_used if not mask_failures else None,  # worst element's |diff| / its bound
        "ulps_headroom": (
            (max_ulps / policy.ulps) if policy.ulps and not mask_failures and max_ulps is not None else None
        ),
        "rel_l2_headroom": (
            (rel_l2 / policy.rel_l2) if policy.rel_l2 and not mask_failures and rel_l2 is not None else None
        ),
    }
    spread = expected_spread(name, expected, policy.accumulator_bits, context, ulp, finite)
    flips = spread.flips if spread else 0.0
    allowed_rel_l2 = policy.rel_l2
    if spread is not None:
        if not isinstance(accumulation, float):
            metrics["accumulation_used"] = float((accumulation / torch.as_tensor(bound).clamp_min(1e-300)).max())
        metrics["accumulation_flips"] = round(flips, 2)
        if ref_norm > 0:  # the error the model expects the accumulation to carry, on top of the policy's
            allowed_rel_l2 = math.sqrt(policy.rel_l2**2 + FLIP_MARGIN * spread.energy / ref_norm**2)
            metrics["rel_l2_allowed"] = allowed_rel_l2
            if not mask_failures and rel_l2 is not None:
                metrics["rel_l2_headroom"] = rel_l2 / allowed_rel_l2
    # the L2 distance from the exact value is a ratio of two L2 norms: over a few elements it can be anything
    # (one cancelling index score: a form with one rounding fewer 6.8x farther than the reference happened
    # to be), so its margin grows as sqrt(256 / n) too (128 scores: 1.59, where a bf16 head sum is 1.8)
    margin = PRECISION_MARGIN * small_output_factor(counted)
    # rel L2 is a statistic over the elements that differ: a handful of one-ulp differences in a large output
    # (4 of 160 index scores of a form with one rounding fewer) decide no more than a handful of elements
    small = small_output_rel_l2(allowed_rel_l2, min(counted, max(differing, 1)), fmt)
    if small > allowed_rel_l2:  # a statistic over a handful of elements decides little: the element bounds do
        allowed_rel_l2 = small
        metrics["rel_l2_allowed"] = allowed_rel_l2
        if not mask_failures and rel_l2 is not None and allowed_rel_l2:
            metrics["rel_l2_headroom"] = rel_l2 / allowed_rel_l2
    scaled = logit is not None and abs(logit[1]) > LOGIT_Z_LIMIT
    if logit is not None:
        metrics["logit_scale"], metrics["logit_scale_z"] = logit
    if precision is not None:  # or the reference's own distance from the exact value, the better of the two
        metrics.update(precision)
        if not mask_failures and rel_l2 is not None:
            metrics["rel_l2_headroom"] = min(
                rel_l2 / allowed_rel_l2 if allowed_rel_l2 else float("inf"), precision["exact_ratio"] / margin
            )
    signed = signed_zeros(expected, actual)
    n_signed = int(signed.sum())
    if n_signed:
        metrics["signed_zeros"] = n_signed
    if rel_l2 is None:  # nothing finite on both sides: the masks decide
        global_ok = False
    else:  # within the reference's rel L2, or (more precision) no farther from the exact value than it is
        global_ok = rel_l2 <= allowed_rel_l2 or (precision is not None and precision["exact_ratio"] <= margin)

    # the share counts what differs beyond the reference's own reach of the exact value: an output no farther
    # from it than the reference's, as a whole, leaves out its elements each as precise as the reference's.
    # "No farther" is a ratio of 1, not the margin (a compressor row with one rounding more than the
    # reference's is 0.99-1.5x over outputs of 256 elements or more, one with one fewer 0.61-0.84x), growing
    # as sqrt(256 / n) below 256 elements (the one fewer reached 0.93x on 48 elements)
    shared = differing
    if precise is not None and precision is not None and precision["exact_ratio"] <= small_output_factor(counted):
        shared = int(((diff > 0) & ~(precise <= 1)).sum()) + mask_failures
        if shared < differing:
            metrics["as_precise_differing"] = differing - shared
    ok = (
        mask_failures == 0
        and over_count == 0
        and global_ok
        and not scaled
        and differing_allowed(shared, counted + mask_failures, policy, flips)
        and (policy.accept_signed_zeros or not n_signed)
    )
    if term_flips and ok:  # an accepted difference only where the output passes
        metrics["boundary_flips"] = term_flips
    if ok:
        notes = (
            _term_flips_note(name, expected, actual, diff, own, term_flips, policy, context),
            signed_zero_note(name, expected, actual, signed),
        )
        return OutputVerdict(name, True, "\n".join(filter(None, notes)), metrics)
    metrics["ulps_histogram"] = ulps_histogram(ulps if finite is None else ulps[finite])
    header = [f"output '{name}': not close ({policy.describe()})"]
    if over_count:
        header.append(_mismatch_count(over_count, expected.numel()))
        ratio = torch.where(over, diff / torch.as_tensor(bound).clamp_min(1e-300), torch.zeros_like(e))
        worst = argmax_index(ratio)
        allowed = float(torch.as_tensor(bound).expand_as(e)[worst])
        header.append(
            f"  worst element {list(worst)}: actual {_fmt(actual[worst])}, expected {_fmt(expected[worst])}, "
            f"|diff| {float(diff[worst]):.3g} = {float(ulps[worst]):.3g} ulp (allowed |diff| {allowed:.3g} = "
            f"{allowed / float(ulp[worst]):.3g} ulp)"
        )
    if mask_failures:
        header.append(
            f"  {mask_failures} of {expected.numel()} element(s) are NaN or inf on one side only, or nonzero "
            "in an absent row"
        )
    if n_signed and not policy.accept_signed_zeros:
        header.append(f"  {n_signed} element(s) differ in the sign of a zero (strict_signed_zeros)")
    if scaled:
        assert logit is not None  # scaled: a logit scale was measured
        header.append(
            f"  the error is a scale of the logits: {name} moves as if every logit were times 1 "
            f"{'-' if logit[0] < 0 else '+'} {abs(logit[0]):.3g}, {abs(logit[1]):.3g} times the spread the "
            f"probabilities' roundings give that direction (allowed {LOGIT_Z_LIMIT:g}); check the softmax "
            "scale (held in bf16 it is 1 - 1.1e-4 at head_dim 128 and 512), a log2(e) folded into it, and "
            "the sink's logit (docs/verdicts.md, \"The logit scale\")"
        )
    header.append(
        _error_summary(
            e,
            ulps,
            ulp,
            max_ulps,
            max_abs,
            rel_l2,
            diff_fraction,
            counted,
            mask_failures,
            policy,
            policy.atol + policy.atol_rel * scale,
            precision,
            flips,
            allowed_rel_l2,
            margin,
            differing,
            shared,
        )
    )
    if not isinstance(accumulation, float):
        header.append(
            f"  the allowance includes 2^{1 - policy.accumulator_bits:g} x the magnitude of the fp8 GEMM terms "
            f"behind each element (a {policy.accumulator_bits:g}-bit tensor-core accumulator: "
            "accumulator_bits; docs/verdicts.md, \"GPU arithmetic\")"
        )
    if over_count:
        header += _value_table(expected, actual, over)
    return OutputVerdict(name, False, "\n".join(header + lines), metrics)


def _error_summary(
    e: torch.Tensor,
    ulps: torch.Tensor,
    ulp: torch.Tensor,
    max_ulps,
    max_abs,
    rel_l2,
    diff_fraction: float,
    counted: int,
    mask_failures: int,
    policy: Policy,
    floor: float,
    precision: dict | None = None,
    flips: float = 0.0,
    allowed_rel_l2: float | None = None,
    margin: float = PRECISION_MARGIN,
    differing: int = 0,
    shared: int | None = None,
) -> str:
    """The failing output's error line, each figure with its allowance in the unit it is compared in
    (`differing`: the elements that differ, as the verdict counted them; `shared`: those the share counts,
    the ones not each as precise as the reference's)."""
    if mask_failures and not counted:
        return "  no element is finite on both sides: no error to measure (see the positions above)"
    worst = f"max {max_ulps:.3g} ulp"
    if max_ulps and ulps.numel():
        at = argmax_index(ulps)
        value = float(e[at])
        if floor > 0 and abs(value) <= floor:  # ulps of a value near zero say little: its bound is the floor
            worst += (
                f" (at an expected {value:.3g}, inside the absolute allowance {floor:.3g}: "
                f"ulps of a value near zero are tiny)"
            )
        elif value == 0:  # one ulp of zero is the smallest subnormal: any difference is astronomically many
            worst += (
                f" (at an expected 0, where one ulp is {float(ulp[at]):.3g}; this output has no absolute allowance)"
            )
    allowed = policy.rel_l2 if allowed_rel_l2 is None else allowed_rel_l2
    why = []
    if flips:
        why.append("with the error the accumulator model expects")
    n_diff = min(counted, max(differing, 1))  # as the verdict's small-output rel L2 counts them
    if n_diff < STATISTIC_BASE and allowed != policy.rel_l2:
        why.append(
            f"{n_diff} element(s) differ, fewer than {STATISTIC_BASE}: x sqrt({STATISTIC_BASE}/n), at most 1 ulp"
        )
    rel = f"rel L2 {rel_l2:.3g} (allowed {allowed:.3g}" + (f": {'; '.join(why)})" if why else ")")
    if precision is not None:
        own = f"the reference's own {precision['reference_l2']:.3g}"
        if precision["one_rounding_l2"] > precision["reference_l2"]:  # the reference happened to land close
            own = f"what one rounding of each element is expected to carry, {precision['one_rounding_l2']:.3g} ({own})"
        rel += (
            f", nor as precise: L2 distance from the exact value {precision['exact_l2']:.3g}, "
            f"{precision['exact_ratio']:.3g}x {own} (allowed {margin:.3g}x)"
        )
    over = f" over the {counted} element(s) finite on both sides" if mask_failures else ""
    share = f"{100 * diff_fraction:.3g}% of elements differ"
    if shared is not None and shared < differing:
        share += (
            f" ({differing - shared} of them no farther from the exact value than the reference's: {shared} counted)"
        )
    if policy.max_diff_fraction < 1:
        share += (
            f" (allowed {100 * policy.max_diff_fraction:.3g}% plus {SHARE_SIGMAS:g} standard deviations of that "
            f"count, at least {100 * policy.max_diff_fraction:.3g}% of {STATISTIC_BASE}: "
            f"{allowed_differing(counted + mask_failures, policy):.3g} element(s)"
        )
        share += f", plus {flips:.3g} rounding flips the accumulator model expects)" if flips else ")"
    return f"  {worst}, max |diff| {max_abs:.3g}, {rel}{over}; {share}"


# A statistic over the whole output (the share of differing elements, rel L2, the L2 distance from the
# exact value) is taken over at least this many elements: in a small output (one decode step's row, an
# index score of 9 keys) a few roundings that land one way are a large share of a few, and a statistic
# tighter than one ulp flips a coin. Below it the share counts against 256 elements, and the two L2
# allowances grow as sqrt(256 / n) (the spread of an n-element mean), so there the element-wise bounds,
# derived per element, decide. The bug the share exists to catch (an RMSNorm that rounds before its weight:
# 11-44% of elements) still differs in more than 2% of 256; a scale of 1 + 2^-6 fails a 9-element output
# element-wise.
STATISTIC_BASE = 256


def small_output_factor(counted: int) -> float:
    """How much a global L2 allowance grows on an output of `counted` elements (1 from STATISTIC_BASE on)."""
    return math.sqrt(STATISTIC_BASE / counted) if 0 < counted < STATISTIC_BASE else 1.0


def small_output_rel_l2(allowed: float, counted: int, fmt: torch.dtype) -> float:
    """The rel L2 allowance on an output of `counted` elements: `allowed` times `small_output_factor`, but
    never past one ulp of the format on every element (2^-7 in bf16: what an answer within 1 ulp everywhere
    can reach, and half the 1 + 2^-6 scale every golden must reject), nor below `allowed`."""
    one_ulp = 2.0 ** -MANTISSA_BITS[fmt]
    return max(allowed, min(allowed * small_output_factor(counted), one_ulp))


def differing_allowed(differing: int, numel: int, policy: Policy, flips: float = 0.0) -> bool:
    """Whether `differing` elements of `numel` are within the policy's `max_diff_fraction`, plus the
    spread of such a count (a correct implementation's flips are a binomial count: SHARE_SIGMAS of its
    standard deviation), plus the rounding flips the accumulator model expects (`_expected_flips`)."""
    if policy.max_diff_fraction >= 1.0:
        return True
    return differing <= allowed_differing(numel, policy) + FLIP_MARGIN * flips


# A correct implementation's differing elements are a binomial count: at the rate `max_diff_fraction`
# allows, 6 of 192 elements (3.1%) came out on one fresh compressor case in 2,000 for upstream's own
# arithmetic. The count may exceed the rate by this many of its standard deviations (11.6 of 192); an
# RMSNorm that rounds before its weight (11-44% of elements) is still 7 or more of 64 against 5.8.
SHARE_SIGMAS = 4.0


def allowed_differing(numel: int, policy: Policy) -> float:
    """How many elements of `numel` may differ: the policy's share of them plus SHARE_SIGMAS standard
    deviations of that count, and never fewer than the share of STATISTIC_BASE elements."""
    mean = policy.max_diff_fraction * numel
    return max(mean + SHARE_SIGMAS * math.sqrt(mean), policy.max_diff_fraction * STATISTIC_BASE)


def _term_flips_note(
    name: str,
    expected: torch.Tensor,
    actual: torch.Tensor,
    diff: torch.Tensor,
    own: Any,
    flips: int,
    policy: Policy,
    context: Mapping[str, torch.Tensor],
) -> str:
    """What a passing output's term flips were: how many, and the largest one with its term."""
    if not flips:
        return ""
    beyond = diff - own
    worst = argmax_index(beyond)
    assert policy.terms is not None  # flips are counted only where the policy names its terms
    term = float(context[policy.terms].double()[worst].abs())
    return (
        f"output '{name}': {flips} element(s) differ by more than {policy.ulps:g} ulp only by one "
        f"bf16-rounded term rounding the other way (accepted by policy: {policy.term_ulps:g} bf16 ulp of "
        f"{policy.terms}); largest at {list(worst)}: actual {_fmt(actual[worst])}, expected "
        f"{_fmt(expected[worst])}, largest term {term:.6g}"
    )


# Upper edges of the error histogram of a failing output, in ulps: 0, 1/2, 1, 2, 4, ... 2^20, more.
HISTOGRAM_EDGES = (0.0, 0.5) + tuple(float(2**k) for k in range(21))


def ulps_histogram(ulps: torch.Tensor) -> dict[str, list]:
    """How many elements erred by how much: `counts[i]` elements in (edges[i-1], edges[i]] ulps,
    the last count above the last edge (`counts` has one more entry than `edges`)."""
    edges = torch.tensor(HISTOGRAM_EDGES, dtype=torch.float64)
    bins = torch.bucketize(ulps.double().reshape(-1), edges)  # right=False: edges[i-1] < x <= edges[i]
    counts = torch.bincount(bins, minlength=len(HISTOGRAM_EDGES) + 1)
    return {"edges": list(HISTOGRAM_EDGES), "counts": [int(c) for c in counts]}


def _canonical(rows: torch.Tensor) -> torch.Tensor:
    """Per row: valid ids strictly ascending, then only -1 lanes."""
    if rows.shape[-1] < 2:
        return torch.ones(rows.shape[:-1], dtype=torch.bool)
    a, b = rows[..., :-1], rows[..., 1:]
    step_ok = ((a >= 0) & (b >= 0) & (a < b)) | ((a >= 0) & (b == -1)) | ((a == -1) & (b == -1))
    return step_ok.all(dim=-1)


def _unordered_rows(expected: torch.Tensor, actual: torch.Tensor) -> int:
    """Rows the reference keeps canonical (ascending, -1 last) that the implementation does not."""
    if expected.dim() == 0 or expected.dtype.is_floating_point:
        return 0
    return int((_canonical(expected) & ~_canonical(actual)).sum())


def _compare_index(
    name: str,
    expected: torch.Tensor,
    actual: torch.Tensor,
    policy: Policy,
    context: Mapping[str, torch.Tensor],
    params: dict[str, Any],
) -> OutputVerdict:
    from .index_verdict import classify_index_rows

    if policy.scores is None or policy.scores not in context:
        verdict = _compare_exact(name, expected, actual, policy)
        verdict.metrics["rows_exact"] = None
        return verdict
    offset = int(params.get(policy.offset_param, 0)) if policy.offset_param else 0
    scores = context[policy.scores]
    if scores.dtype in (torch.bfloat16, torch.float16):
        scores = scores.float()  # exact widening, as torch's CPU top-k compares them
    order: Literal["sequence", "set", "unordered"] = policy.order
    if order == "sequence" and params.get("sorted") is False and not policy.strict_order:
        order = "unordered"  # an unsorted top-k's order is unspecified: ties are judged as sets
    result = classify_index_rows(
        expected,
        actual,
        scores,
        offset=offset,
        largest=bool(params.get("largest", policy.largest)),
        order=order,
        id_limit=context.get(policy.limit) if policy.limit else None,
        fill_is_worst=policy.fill_is_worst,
        near_ulps=policy.near_tie_ulps,
        leak=params.get("candidate_leak", "upstream") if policy.fill_is_worst else None,
    )
    metrics = {
        "rows": result.rows,
        "rows_exact": result.exact,
        "rows_tie": result.tie,
        "rows_near_tie": result.near,
        "rows_miss": result.miss,
    }
    unordered = _unordered_rows(expected, actual) if policy.order == "set" else 0
    if unordered:
        metrics["rows_unordered"] = unordered
        return OutputVerdict(
            name,
            False,
            f"output '{name}': {unordered} row(s) are not in ascending order with the "
            "-1 lanes last, as the reference orders them (ids sorted ascending, then -1 fill)\n  "
            + result.describe().replace("\n", "\n  "),
            metrics,
        )
    if result.all_exact:
        return OutputVerdict(name, True, metrics=metrics)
    near = f", {result.near} near tie" if policy.near_tie_ulps else ""
    lines = [
        f"output '{name}': ids differ in {result.rows - result.exact} of {result.rows} row(s): "
        f"{result.tie} tie order only{near}, {result.miss} miss"
    ]
    if result.leak_policy:  # a policy, not an order: named first, never accepted with the ties
        lines[0] += f" ({result.leak_policy}: the candidate_leak policy differs, not tie order; docs/index-verdicts.md)"
    lines += ["  " + line for line in result.describe().splitlines()]
    accepted = [
        label
        for count, flag, label in (
            (result.tie, policy.accept_ties or policy.accept_near_ties, "tie order"),
            (result.near, policy.accept_near_ties, "near ties"),
        )
        if count and flag
    ]
    refused = (result.tie and not (policy.accept_ties or policy.accept_near_ties)) or (
        result.near and not policy.accept_near_ties
    )
    ok = result.miss == 0 and not refused
    if ok:
        lines[0] += f" ({' and '.join(accepted)} accepted by policy)"
    elif result.miss == 0 and not result.leak_policy:
        lines.insert(
            1,
            "  the selected values are the reference's; only the choice among equal scores differs "
            "from torch's CPU order (an argpartition, a stable sort or a parallel top-k): set "
            "accept_ties: true for this implementation if it promises the set only "
            "(docs/index-verdicts.md)",
        )
    return OutputVerdict(name, ok, "\n".join(lines), metrics)


def _param(params: dict[str, Any], path: str) -> Any:
    """A params value by dotted path (`config.rope_head_dim`)."""
    value: Any = params
    for key in path.split("."):
        value = value[key]
    return value


def _compare_quantised(
    name: str,
    expected: torch.Tensor,
    actual: torch.Tensor,
    policy: Policy,
    context: Mapping[str, torch.Tensor],
    params: dict[str, Any],
) -> OutputVerdict:
    from .boundary import FORMATS, classify_quantised, pre_tolerance

    exact = _compare_exact(name, expected, actual, policy)
    if exact.ok:
        exact.metrics.update(boundary_flips=0, scale_flips=0)
        return exact
    assert policy.pre is not None and policy.quant is not None  # a quantised policy has both (Policy.__post_init__)
    pre = context.get(policy.pre)
    if pre is None:
        raise KeyError(
            f"the golden lacks {policy.pre!r} (the values before quantisation); regenerate it with "
            "`conformance generate`"
        )
    tail = int(_param(params, policy.pre_tail)) if policy.pre_tail else 0
    fmt = FORMATS[policy.quant]
    tol = pre_tolerance(pre, policy.boundary_ulps, tail, policy.boundary_atol_rel, fmt.block)
    own = context.get(policy.pre + OWN_PRE)
    if own is not None:
        tol = torch.where(own.expand_as(tol), torch.zeros_like(tol), tol)
    try:
        verdict = classify_quantised(expected, actual, pre, tol, fmt, policy.encoding)
    except ValueError:  # the expected output is no rounding of `pre` in this format: a diagnosis variant of
        return exact  # the quantiser itself (harness/diagnosis): no boundary to straddle, judged exactly
    metrics = {
        "numel": verdict.numel,
        "mismatched": verdict.mismatched,
        "boundary_flips": verdict.flips,
        "scale_flips": verdict.scale_flips,
    }
    if verdict.signed_zeros:
        metrics["signed_zeros"] = verdict.signed_zeros
    refused = verdict.flips and not policy.accept_boundary
    ok = verdict.mismatched == 0 and not refused and (policy.accept_signed_zeros or not verdict.signed_zeros)
    head = f"output '{name}': {verdict.differ} of {verdict.numel} element(s) differ"
    if verdict.mismatched:
        head += f"; {verdict.mismatched} not explained by a rounding boundary ({policy.describe()})"
        if own is not None and bool(own.any()):
            head += (
                "; where the value before quantisation is your own returned intermediate, the quantiser is "
                "exact: any difference there is the quantiser's"
            )
    elif refused:
        head += " only at rounding boundaries (not accepted: strict_boundaries)"
    elif verdict.differ:
        head += " only at rounding boundaries (accepted by policy)"
    else:
        head = f"output '{name}': {verdict.signed_zeros} element(s) differ only in the sign of a zero"
        head += " (accepted by policy)" if ok else " (not accepted: strict_signed_zeros)"
    lines = [head] + ["  " + line for line in verdict.describe().splitlines()]
    return OutputVerdict(name, ok, "\n".join(lines), metrics)
