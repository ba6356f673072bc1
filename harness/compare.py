"""The comparator: (expected, actual, policy) -> verdict. Pure; no I/O, no execution.

Attributes first (dtype, shape), then values. Exact outputs compare bits. Tolerance outputs
check the masks of non-finite and sentinel positions, then an element-wise bound in units in
the last place of the expected value, then a global relative L2 error. Index outputs compare
exactly and, when they differ, ask the index verdict whether the difference is tie order only.
Every verdict carries its metrics, so a passing case also shows how close it came (headroom).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .policy import Policy

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}
MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126, torch.float64: -1022}
TABLE_ROWS = 8


@dataclass
class OutputVerdict:
    name: str
    ok: bool
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    tie_only: bool = False  # differs only in tie order (index outputs)


def compare_output(
    name: str,
    expected: torch.Tensor,
    actual: Any,
    policy: Policy,
    aux: dict[str, torch.Tensor] | None = None,
    params: dict[str, Any] | None = None,
) -> OutputVerdict:
    """Judge one output tensor. Never raises on bad `actual`; reports it instead."""
    problem = _attribute_problem(expected, actual)
    if problem:
        return OutputVerdict(name, False, f"output '{name}': {problem}")
    if policy.kind == "exact":
        return _compare_exact(name, expected, actual)
    if policy.tolerant and torch.equal(_bits(expected), _bits(actual)):
        # bit-identical: every bound holds with zero error; skip the element-wise work
        zero = {"numel": expected.numel(), "mismatched": 0, "max_abs_err": 0.0, "max_ulps": 0.0, "rel_l2": 0.0,
                "diff_fraction": 0.0,
                "ulps_headroom": 0.0 if policy.ulps else None, "rel_l2_headroom": 0.0 if policy.rel_l2 else None}
        return OutputVerdict(name, True, metrics=zero)
    if policy.kind == "index":
        return _compare_index(name, expected, actual, policy, aux or {}, params or {})
    return _compare_tolerant(name, expected, actual, policy)


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


def _compare_exact(name: str, expected: torch.Tensor, actual: torch.Tensor) -> OutputVerdict:
    differ = _bits(expected) != _bits(actual)
    count = int(differ.sum())
    metrics = {"mismatched": count, "numel": expected.numel()}
    if count == 0:
        return OutputVerdict(name, True, metrics=metrics)
    lines = [f"output '{name}': not bit-identical (exact comparison)", _mismatch_count(count, expected.numel())]
    lines += _value_table(expected, actual, differ)
    return OutputVerdict(name, False, "\n".join(lines), metrics)


def _mismatch_count(count: int, numel: int) -> str:
    return f"  mismatched elements: {count} / {numel} ({100.0 * count / max(numel, 1):.3g}%)"


def _value_table(expected: torch.Tensor, actual: torch.Tensor, differ: torch.Tensor) -> list[str]:
    where = differ.nonzero()
    rows = ["  index | actual | expected"]
    for idx in where[:TABLE_ROWS].tolist():
        i = tuple(idx)
        rows.append(f"  {list(i)} | {_fmt(actual[i])} | {_fmt(expected[i])}")
    if len(where) > TABLE_ROWS:
        rows.append(f"  ... {len(where) - TABLE_ROWS} more")
    return rows


def _fmt(value: torch.Tensor) -> str:
    item = value.item()
    if isinstance(item, float):
        return f"{item:.9g}"
    return str(item)


def ulp_of(expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` at |expected| (float64), subnormal spacing near zero."""
    e = expected.double().abs()
    _, exp = torch.frexp(e)  # e = m * 2**exp with m in [0.5, 1)
    floor_log2 = torch.where(e == 0, float(MIN_EXPONENT[dtype]), exp.double() - 1).clamp(min=MIN_EXPONENT[dtype])
    return torch.pow(2.0, floor_log2 - MANTISSA_BITS[dtype])


def _compare_tolerant(name: str, expected: torch.Tensor, actual: torch.Tensor, policy: Policy) -> OutputVerdict:
    fmt = torch.bfloat16 if policy.kind == "bf16" else expected.dtype
    if fmt not in MANTISSA_BITS:
        fmt = torch.float32
    e = expected.double()
    a = actual.double()
    lines: list[str] = []
    # 1. masks: NaN, +inf, -inf and sentinel positions must agree exactly.
    masks = {"NaN": (torch.isnan(e), torch.isnan(a)), "+inf": (e == float("inf"), a == float("inf")),
             "-inf": (e == float("-inf"), a == float("-inf"))}
    for value in policy.sentinels:
        masks[f"sentinel {value:g}"] = (e == value, a == value)
    mask_failures = 0
    for label, (me, ma) in masks.items():
        bad = me != ma
        if bool(bad.any()):
            mask_failures += int(bad.sum())
            first = tuple(bad.nonzero()[0].tolist())
            lines.append(
                f"  {label} positions differ at {int(bad.sum())} element(s); first at {list(first)}: "
                f"actual {_fmt(actual[first])}, expected {_fmt(expected[first])}"
            )
    finite = torch.isfinite(e) & torch.isfinite(a)
    for value in policy.sentinels:
        finite &= e != value
    diff = torch.where(finite, (a - e).abs(), torch.zeros_like(e))
    ulp = ulp_of(e, fmt)
    ulps = torch.where(finite, diff / ulp, torch.zeros_like(e))
    scale = float(torch.where(finite, e.abs(), torch.zeros_like(e)).max()) if e.numel() else 0.0
    bound = policy.ulps * ulp + policy.atol + policy.atol_rel * scale
    over = finite & (diff > bound)
    over_count = int(over.sum())
    ef = torch.where(finite, e, torch.zeros_like(e))
    ref_norm = float(ef.norm())
    err_norm = float(diff.norm())
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    max_ulps = float(ulps.max()) if ulps.numel() else 0.0
    counted = int(finite.sum())
    diff_fraction = float((diff > 0).sum()) / counted if counted else 0.0
    max_abs = float(diff.max()) if diff.numel() else 0.0
    metrics = {
        "numel": expected.numel(),
        "mismatched": over_count + mask_failures,
        "max_abs_err": max_abs,
        "max_ulps": max_ulps,
        "rel_l2": rel_l2,
        "diff_fraction": diff_fraction,
        "ulps_headroom": (max_ulps / policy.ulps) if policy.ulps else None,
        "rel_l2_headroom": (rel_l2 / policy.rel_l2) if policy.rel_l2 else None,
    }
    ok = (mask_failures == 0 and over_count == 0 and rel_l2 <= policy.rel_l2
          and diff_fraction <= policy.max_diff_fraction)
    if ok:
        return OutputVerdict(name, True, metrics=metrics)
    header = [f"output '{name}': not close ({policy.describe()})"]
    if over_count:
        header.append(_mismatch_count(over_count, expected.numel()))
        worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(torch.where(over, diff / bound.clamp_min(1e-300), torch.zeros_like(e))), e.shape)) if e.dim() else ()
        header.append(
            f"  worst element {list(worst)}: actual {_fmt(actual[worst])}, expected {_fmt(expected[worst])}, "
            f"|diff| {float(diff[worst]):.3g} = {float(ulps[worst]):.3g} ulp (allowed {float(bound[worst]):.3g})"
        )
    header.append(f"  max {max_ulps:.3g} ulp, max |diff| {max_abs:.3g}, rel L2 {rel_l2:.3g} (allowed {policy.rel_l2:g}), "
                  f"{100 * diff_fraction:.3g}% of elements differ (allowed {100 * policy.max_diff_fraction:.3g}%)")
    if over_count:
        header += _value_table(expected, actual, over)
    return OutputVerdict(name, False, "\n".join(header + lines), metrics)


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
    aux: dict[str, torch.Tensor],
    params: dict[str, Any],
) -> OutputVerdict:
    from .index_verdict import classify_index_rows

    if torch.equal(expected, actual):
        # identical to the reference, whose ids passed the invariants when it was generated
        rows = expected.reshape(-1, expected.shape[-1]).shape[0] if expected.dim() else 1
        return OutputVerdict(name, True, metrics={"rows": rows, "rows_exact": rows, "rows_tie": 0, "rows_miss": 0})
    if policy.scores is None or policy.scores not in aux:
        verdict = _compare_exact(name, expected, actual)
        verdict.metrics["rows_exact"] = None
        return verdict
    offset = int(params.get(policy.offset_param, 0)) if policy.offset_param else 0
    scores = aux[policy.scores]
    if scores.dtype in (torch.bfloat16, torch.float16):
        scores = scores.float()  # exact widening, as torch's CPU top-k compares them
    result = classify_index_rows(
        expected, actual, scores, offset=offset, largest=bool(params.get("largest", policy.largest)),
        order=policy.order, id_limit=aux.get(policy.limit) if policy.limit else None,
        fill_is_worst=policy.fill_is_worst
    )
    metrics = {"rows": result.rows, "rows_exact": result.exact, "rows_tie": result.tie, "rows_miss": result.miss}
    unordered = _unordered_rows(expected, actual) if policy.order == "set" else 0
    if unordered:
        metrics["rows_unordered"] = unordered
        return OutputVerdict(name, False, f"output '{name}': {unordered} row(s) are not in ascending order with the "
                             "-1 lanes last, as the reference orders them (ids sorted ascending, then -1 fill)\n  "
                             + result.describe().replace("\n", "\n  "), metrics)
    if result.tie == 0 and result.miss == 0:
        return OutputVerdict(name, True, metrics=metrics)
    lines = [f"output '{name}': ids differ in {result.tie + result.miss} of {result.rows} row(s): "
             f"{result.tie} tie order only, {result.miss} miss"]
    lines += ["  " + line for line in result.describe().splitlines()]
    ok = result.miss == 0 and policy.accept_ties
    if ok:
        lines[0] += " (tie order accepted by policy)"
    return OutputVerdict(name, ok, "\n".join(lines), metrics, tie_only=result.miss == 0)
