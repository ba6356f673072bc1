"""Verdict for index-valued outputs: exact, tie-order difference, or miss (DESIGN.md, Comparison).

Top-k selections on the V4.1 path (indexer M:577-580, candidate blocks M:607) break ties in an
implementation-defined way (v41-reference.md §7; torch's CPU order: docs/topk-tie-order.md). A
row of selected ids that differs from the reference is therefore judged against the reference
scores the selection was made from:

* ``exact``: the row is identical (``order="set"``: identical after sorting each row, so a
  permutation of the same ids is exact; ``order="sequence"`` and ``"unordered"``: identical
  position by position).
* ``tie``: the rows differ only among elements tied with the k-th reference score: the ids
  whose score is not equivalent to that score are the same set on both sides, both sides hold
  equally many tied ids, and for ``order="sequence"`` the reference scores at the two rows are
  also equal position by position. ``order="unordered"`` (a top-k with ``sorted=False``, whose
  order is the algorithm's) judges ties as sets: a row that only permutes its ids, or picks
  other tied ids and arranges everything differently, is tie order. Equivalence is the top-k comparator's: all NaN are one
  value, -0 == +0. The k-th reference score is the worst score (NaN best when ``largest``,
  worst otherwise) among the reference row's valid ids. This implies equal multisets of
  reference scores and, for two true top-k selections, is the same thing; it is stricter
  only when the reference is not a top-k of the scores (ids swapped at a better tied value
  are then a miss).
* ``near``: with ``near_ulps`` > 0, not tie order, but the same with "tied" widened to "within
  ``near_ulps`` bf16 ulps of the k-th score": the ids whose reference scores lie outside that
  band are the same on both sides and both hold equally many inside it. An implementation whose
  scores are within their own tolerance of the reference's can pick such ids
  (docs/index-verdicts.md, "Near ties").
* ``miss``: anything else, including every row with an invariant violation, reported
  separately: an id out of range (``id - offset`` outside ``[0, N)``, ``id >= id_limit``, or
  below -1), a duplicate id, -1 where the reference has a valid id, or a valid id where the
  reference has -1 (position by position for ``"sequence"``, by count for ``"set"``).

The sentinel is the raw id -1 (upstream writes -1, never -1 + offset). Rows are the flattened
leading dims; examples report them as multi-indices. Pure function: no printing, no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from .ulps import ulp_of

__all__ = ["IndexVerdict", "LEAK_KINDS", "RowExample", "VIOLATION_KINDS", "classify_index_rows"]

VIOLATION_KINDS: dict[str, str] = {
    "out_of_range": "id out of range",
    "duplicate": "duplicate id within the row",
    "missing_id": "-1 where the reference has a valid id",
    "unexpected_id": "valid id where the reference has -1",
    "leaked": "leak: a valid id of a masked (-inf) row where the case's candidate_leak is drop",
    "dropped": "drop: -1 where the reference leaks a masked (-inf) row, and no masked row anywhere "
    "in the output: the drop policy where the case's candidate_leak is upstream",
}
LEAK_KINDS = ("leaked", "dropped")  # the candidate-pool policy (docs/index-verdicts.md): never tie order
_MAX_MESSAGES = 20
_BIG = torch.iinfo(torch.int64).max


ORDERS = ("sequence", "set", "unordered")


@dataclass(frozen=True)
class RowExample:
    """One non-exact row, spelled out for a report."""

    row: tuple[int, ...]  # multi-index over the leading dims
    expected: list[int]
    actual: list[int]
    only_expected: list[tuple[int, float | None]]  # (id, reference score) only the reference chose
    only_actual: list[tuple[int, float | None]]  # score None when the id is out of range
    kth_score: float | None  # None when the reference row has no valid id
    tied_total: int  # entries of the row's scores equivalent to the k-th score
    tied_selected: int  # of those, how many the reference selected
    tied_selected_actual: int  # and how many the actual row selected
    violations: list[str] = field(default_factory=list)
    band: float = 0.0  # near ties: half-width of the band around the k-th score

    def describe(self) -> str:
        within = f"lie within {self.band:.3g} of it" if self.band else "tie with it"
        lines = [
            f"row {self.row}: k-th reference score {self.kth_score!r}; "
            f"{self.tied_total} entries {within}, reference selected {self.tied_selected}, "
            f"actual selected {self.tied_selected_actual}",
            f"  expected ids: {_clip(self.expected)}",
            f"  actual ids:   {_clip(self.actual)}",
            f"  only in expected (id, score): {_clip(self.only_expected)}",
            f"  only in actual (id, score):   {_clip(self.only_actual)}",
        ]
        lines += [f"  violation: {v}" for v in self.violations]
        return "\n".join(lines)


@dataclass(frozen=True)
class IndexVerdict:
    """Counts per class over all rows, the non-exact rows and an example of each kind."""

    lead_shape: tuple[int, ...]
    rows: int
    exact: int
    tie: int
    miss: int
    tie_rows: tuple[int, ...]  # flat row indices
    miss_rows: tuple[int, ...]
    violations: dict[str, int]  # kind -> number of rows with that violation
    violation_messages: tuple[str, ...]  # the first few, each naming row and kind
    first_tie: RowExample | None
    first_miss: RowExample | None
    near: int = 0
    near_rows: tuple[int, ...] = ()
    first_near: RowExample | None = None

    @property
    def non_exact_rows(self) -> tuple[int, ...]:
        return tuple(sorted(self.tie_rows + self.near_rows + self.miss_rows))

    @property
    def all_exact(self) -> bool:
        return self.exact == self.rows

    @property
    def leak_policy(self) -> str:
        """'' or what the misses say about the candidate-pool policy ("3 row(s) leak where the case drops")."""
        said = {"leaked": "leak where the case drops", "dropped": "drop where the case leaks"}
        return "; ".join(f"{self.violations[k]} row(s) {said[k]}" for k in LEAK_KINDS if self.violations.get(k))

    def describe(self) -> str:
        near = f", {self.near} near tie" if self.near else ""
        head = f"{self.rows} rows: {self.exact} exact, {self.tie} tie order{near}, {self.miss} miss"
        parts = [head]
        if self.tie_rows:
            parts.append(f"tie-order rows (flat index): {_clip(list(self.tie_rows), 16)}")
        if self.near_rows:
            parts.append(f"near-tie rows (flat index): {_clip(list(self.near_rows), 16)}")
        if self.miss_rows:
            parts.append(f"miss rows (flat index): {_clip(list(self.miss_rows), 16)}")
        bad = {k: v for k, v in self.violations.items() if v}
        if bad:
            parts.append("invariant violations (rows): " + ", ".join(f"{k}={v}" for k, v in bad.items()))
            parts += [f"  {m}" for m in self.violation_messages]
        if self.first_tie is not None:
            parts += ["first tie-order row:", self.first_tie.describe()]
        if self.first_near is not None:
            parts += ["first near-tie row:", self.first_near.describe()]
        if self.first_miss is not None:
            parts += ["first miss row:", self.first_miss.describe()]
        return "\n".join(parts)


def _clip(items: list, limit: int = 32) -> str:
    return str(items) if len(items) <= limit else f"{items[:limit]}... ({len(items)} in all)"


def _eqv(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Comparator equivalence of scores: NaN ~ NaN, -0 == +0."""
    return (x == y) | (torch.isnan(x) & torch.isnan(y))


def _kth(se: torch.Tensor, valid: torch.Tensor, largest: bool) -> torch.Tensor:
    """Worst score of each row's valid entries (NaN best when largest, worst otherwise).

    se, valid: [R, K] -> [R] float64; NaN also stands for "no valid entry" (see callers).
    """
    nan = torch.isnan(se)
    plain = valid & ~nan
    if largest:  # worst = smallest non-NaN; NaN only if every valid entry is NaN
        m = torch.where(plain, se, torch.inf).amin(dim=1)  # K >= 1 here: empty rows are exact
        return torch.where(plain.any(dim=1), m, torch.nan)
    m = torch.where(plain, se, -torch.inf).amax(dim=1)
    return torch.where((valid & nan).any(dim=1), torch.nan, m)


def _check_inputs(expected: torch.Tensor, actual: torch.Tensor, scores: torch.Tensor, order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    for name, t in (("expected", expected), ("actual", actual)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} ids must be an integer tensor, got {t.dtype}")
        if t.dim() == 0:
            raise ValueError(f"{name} ids must have a last dim of selected ids; got a 0-dim tensor")
    if expected.shape != actual.shape:
        raise ValueError(
            f"expected ids have shape {tuple(expected.shape)} but actual ids {tuple(actual.shape)}; "
            "compare shapes before classifying rows"
        )
    if scores.dim() == 0 or scores.shape[:-1] != expected.shape[:-1]:
        raise ValueError(
            f"scores {tuple(scores.shape)} must share the leading dims of the ids "
            f"{tuple(expected.shape)}: [..., N] against [..., K]"
        )


def _row_limits(id_limit: int | torch.Tensor | None, lead: tuple[int, ...], r: int) -> torch.Tensor | None:
    if id_limit is None:
        return None
    if isinstance(id_limit, torch.Tensor) and id_limit.dim() > 0:
        if tuple(id_limit.shape) != lead:
            raise ValueError(f"id_limit {tuple(id_limit.shape)} must have the ids' leading dims {lead}")
        return id_limit.reshape(r).to(torch.int64)
    return torch.full((r,), int(id_limit), dtype=torch.int64)


def _validate_expected(e: torch.Tensor, n: int, offset: int, id_limit: torch.Tensor | None) -> None:
    """The reference must itself satisfy the invariants; anything else is a harness bug."""
    valid = e != -1
    pos = e - offset
    bad = valid & ((pos < 0) | (pos >= n) | (e < 0))
    if id_limit is not None:
        bad |= valid & (e >= id_limit[:, None])
    if bad.any():
        r, c = (int(v) for v in torch.nonzero(bad)[0])
        raise ValueError(
            f"reference ids are invalid: row {r} slot {c} holds {int(e[r, c])}, outside "
            f"[offset, offset + N) = [{offset}, {offset + n}) (id_limit={None if id_limit is None else int(id_limit[r])}); "
            "check offset and that scores are aligned with the ids"
        )
    srt = torch.sort(torch.where(valid, e, -1 - torch.arange(e.shape[1])), dim=1).values
    if (srt[:, 1:] == srt[:, :-1]).any():
        raise ValueError("reference ids contain a duplicate within a row; the golden is broken")


def classify_index_rows(
    expected: torch.Tensor,
    actual: torch.Tensor,
    scores: torch.Tensor,
    *,
    offset: int = 0,
    largest: bool = True,
    order: Literal["sequence", "set", "unordered"] = "sequence",
    id_limit: int | torch.Tensor | None = None,
    fill_is_worst: bool = False,
    near_ulps: float = 0.0,
    leak: Literal["upstream", "drop"] | None = None,
) -> IndexVerdict:
    """Classify each row of ``actual`` ids against ``expected`` as exact, tie, near tie or miss.

    expected, actual: int [..., K] selected ids (-1 = none); scores: float [..., N] reference
    scores the selection was made from, score position = id - offset. Raises ValueError when
    shapes disagree or the reference ids break the invariants themselves.

    id_limit: an exclusive upper bound on valid ids, one for all rows or a tensor with one per
    row (the leading dims), e.g. compress_lens + offset: a valid id at or above it points at a
    row the query cannot reach and is out of range.
    fill_is_worst: for selections of fixed width k whose -1 lanes stand for picks of the worst
    possible score (unreachable entries that top-k had to take): in rows whose k-th reference
    score is that worst value (-inf when largest), a -1 lane is tied with the k-th score, so
    trading a -1 for another worst-score id (or back) is tie order, not a miss.
    near_ulps: the near-tie band, in bf16 ulps of the k-th reference score (0: no near ties).
    leak: the case's candidate-pool policy for -inf picks (with ``fill_is_worst`` and ``largest``).
    Which -inf rows fill a short row is tie order, but the policy is not: under ``"drop"`` a valid
    id at a -inf score is a ``leaked`` violation; under ``"upstream"``, when the reference returns
    a masked row somewhere and the implementation nowhere, each row that holds fewer of them than
    the reference is ``dropped``. Both are misses, whatever ``accept_ties`` says.

    >>> s = torch.tensor([[1.0, 1.0, 0.0]])
    >>> classify_index_rows(torch.tensor([[0]]), torch.tensor([[1]]), s).tie
    1
    """
    _check_inputs(expected, actual, scores, order)
    lead = tuple(expected.shape[:-1])
    k, n = expected.shape[-1], scores.shape[-1]
    r = math.prod(lead)
    e = expected.reshape(r, k).to(torch.int64)  # [R, K]
    a = actual.reshape(r, k).to(torch.int64)  # [R, K]
    limits = _row_limits(id_limit, lead, r)  # [R] int64 or None
    _validate_expected(e, n, offset, limits)
    if order == "set":
        e, a = torch.sort(e, dim=1).values, torch.sort(a, dim=1).values
    rows = torch.nonzero(~(e == a).all(dim=1)).flatten()  # [R'] non-exact rows
    if order == "unordered":  # exact position by position; ties judged on the sets
        e, a = torch.sort(e, dim=1).values, torch.sort(a, dim=1).values
    kinds = dict.fromkeys(VIOLATION_KINDS, 0)
    if rows.numel() == 0:
        return IndexVerdict(lead, r, r, 0, 0, (), (), kinds, (), None, None)
    ev, av = e[rows], a[rows]  # [R', K]
    sv = scores.reshape(r, n)[rows].to(torch.float64)  # [R', N]
    if n == 0:  # nothing can be valid; a dummy column keeps the gathers below in bounds
        sv = torch.zeros(rows.numel(), 1, dtype=torch.float64)
    e_ok, a_valid = ev != -1, av != -1
    pos_a = av - offset
    oob = a_valid & ((av < 0) | (pos_a < 0) | (pos_a >= n))
    if limits is not None:
        oob |= a_valid & (av >= limits[rows][:, None])
    a_ok = a_valid & ~oob
    srt = torch.sort(torch.where(a_valid, av, -1), dim=1).values
    viol = {"out_of_range": oob.any(dim=1), "duplicate": ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] != -1)).any(dim=1)}
    if order == "sequence":  # "unordered" rows are sorted by now: counts decide, as for sets
        viol["missing_id"] = (e_ok & ~a_valid).any(dim=1)
        viol["unexpected_id"] = (a_valid & ~e_ok).any(dim=1)
    else:
        viol["missing_id"] = a_valid.sum(dim=1) < e_ok.sum(dim=1)
        viol["unexpected_id"] = a_valid.sum(dim=1) > e_ok.sum(dim=1)
    se = torch.gather(sv, 1, torch.where(e_ok, ev - offset, 0))  # [R', K]
    sa = torch.gather(sv, 1, torch.where(a_ok, pos_a, 0))  # [R', K]
    if fill_is_worst:
        worst = -torch.inf if largest else torch.inf
        se = torch.where(e_ok, se, worst)
        sa = torch.where(a_ok, sa, worst)
        kth = _kth(se, torch.ones_like(e_ok), largest)  # -1 lanes count as worst-score picks
        has_kth = torch.ones_like(e_ok[:, 0])
        fill_tied = (kth == worst)[:, None]  # rows where a -1 lane ties with the k-th pick
        viol["missing_id"] &= ~fill_tied[:, 0]
        viol["unexpected_id"] &= ~fill_tied[:, 0]
        tied_e = (e_ok & _eqv(se, kth[:, None])) | (~e_ok & fill_tied)
        tied_a = (a_ok & _eqv(sa, kth[:, None])) | (~a_valid & fill_tied)
    else:
        kth = _kth(se, e_ok, largest)  # [R']
        has_kth = e_ok.any(dim=1)
        tied_e = e_ok & _eqv(se, kth[:, None])
        tied_a = a_ok & _eqv(sa, kth[:, None])
    if leak is not None and fill_is_worst and largest and n:
        viol.update(_leak_violations(leak, e, scores.reshape(r, n), offset, rows, a_ok, sa, e_ok, se))
    broken = torch.stack(list(viol.values())).any(dim=0)  # [R']
    tie = ~broken & has_kth & _same_outside(ev, av, e_ok & ~tied_e, a_ok & ~tied_a, tied_e, tied_a)
    if order == "sequence":
        tie &= (_eqv(se, sa) | (~e_ok & ~a_valid)).all(dim=1)
    band = torch.zeros_like(kth)
    near = torch.zeros_like(tie)
    if near_ulps > 0:
        band = torch.where(torch.isfinite(kth), near_ulps * ulp_of(torch.nan_to_num(kth), torch.bfloat16), 0.0)
        near_e = e_ok & ((se - kth[:, None]).abs() <= band[:, None])
        near_a = a_ok & ((sa - kth[:, None]).abs() <= band[:, None])
        near = ~tie & ~broken & has_kth & torch.isfinite(kth)
        near &= _same_outside(
            ev, av, e_ok & ~near_e & ~tied_e, a_ok & ~near_a & ~tied_a, near_e | tied_e, near_a | tied_a
        )
        if order == "sequence":
            near &= ((se - sa).abs() <= 2 * band[:, None]).all(dim=1)
    rows_l: list[int]  # (the lambda reads it after the line below)
    lim_of = (lambda j: None) if limits is None else (lambda j: int(limits[rows_l[j]]))

    rows_l, tie_l, near_l = rows.tolist(), tie.tolist(), near.tolist()
    tie_rows = tuple(r for r, t in zip(rows_l, tie_l) if t)
    near_rows = tuple(r for r, n in zip(rows_l, near_l) if n)
    miss_rows = tuple(r for r, t, n in zip(rows_l, tie_l, near_l) if not (t or n))
    messages: list[str] = []
    for kind, flags in viol.items():
        hit = torch.nonzero(flags).flatten().tolist()
        kinds[kind] = len(hit)
        for j in hit[: _MAX_MESSAGES - len(messages)]:
            messages.append(f"row {_multi(rows_l[j], lead)}: {VIOLATION_KINDS[kind]} ({kind})")

    def example(j: int, within: float = 0.0) -> RowExample:
        return _example(
            j,
            rows_l[j],
            lead,
            expected,
            actual,
            sv[j, :n],
            offset,
            lim_of(j),
            kth[j] if bool(has_kth[j]) else None,
            viol,
            within,
        )

    first_tie = example(tie_l.index(True)) if tie_rows else None
    first_near = example(near_l.index(True), float(band[near_l.index(True)])) if near_rows else None
    first_miss = example(rows_l.index(miss_rows[0])) if miss_rows else None
    return IndexVerdict(
        lead,
        r,
        r - len(rows_l),
        len(tie_rows),
        len(miss_rows),
        tie_rows,
        miss_rows,
        kinds,
        tuple(messages),
        first_tie,
        first_miss,
        len(near_rows),
        near_rows,
        first_near,
    )


def _leak_violations(
    leak: str,
    e: torch.Tensor,
    scores: torch.Tensor,
    offset: int,
    rows: torch.Tensor,
    a_ok: torch.Tensor,
    sa: torch.Tensor,
    e_ok: torch.Tensor,
    se: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The ``leaked`` / ``dropped`` flags of the non-exact rows (``classify_index_rows``' leak)."""
    ninf = float("-inf")
    a_masked = (a_ok & (sa == ninf)).sum(dim=1)  # [R'] valid ids at -inf, per row
    none = torch.zeros_like(a_masked, dtype=torch.bool)
    if leak == "drop":
        return {"leaked": a_masked > 0, "dropped": none}
    e_masked = (e_ok & (se == ninf)).sum(dim=1)
    exact = torch.ones(e.shape[0], dtype=torch.bool)
    exact[rows] = False
    ee = e[exact]  # identical rows: the implementation returned the reference's masked rows there
    valid = ee != -1
    s_exact = torch.gather(scores[exact].to(torch.float64), 1, torch.where(valid, ee - offset, 0).clamp(min=0))
    leaks_somewhere = bool(a_masked.any()) or bool((valid & (s_exact == ninf)).any())
    return {"leaked": none, "dropped": (a_masked < e_masked) & (not leaks_somewhere)}


def _same_outside(
    ev: torch.Tensor,
    av: torch.Tensor,
    outside_e: torch.Tensor,
    outside_a: torch.Tensor,
    inside_e: torch.Tensor,
    inside_a: torch.Tensor,
) -> torch.Tensor:
    """[R'] rows whose ids outside the tied (or near-tied) set agree as sets, with equally many
    ids inside it on both sides."""
    core_e = torch.sort(torch.where(outside_e, ev, _BIG), dim=1).values
    core_a = torch.sort(torch.where(outside_a, av, _BIG), dim=1).values
    return (core_e == core_a).all(dim=1) & (inside_e.sum(dim=1) == inside_a.sum(dim=1))


def _multi(flat: int, lead: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, lead)) if lead else ()


def _example(
    j: int,
    flat: int,
    lead: tuple[int, ...],
    expected: torch.Tensor,
    actual: torch.Tensor,
    s_row: torch.Tensor,
    offset: int,
    id_limit: int | None,
    kth: torch.Tensor | None,
    viol: dict[str, torch.Tensor],
    band: float = 0.0,
) -> RowExample:
    """Spell out one row (original slot order, not the sorted form used for "set")."""
    k, n = expected.shape[-1], s_row.shape[0]
    e_ids = expected.reshape(-1, k)[flat].tolist()  # k >= 1 here: empty rows are exact
    a_ids = actual.reshape(-1, k)[flat].tolist()
    e_set, a_set = set(e_ids) - {-1}, set(a_ids) - {-1}

    def score(i: int) -> float | None:  # None for an id out of range
        ok = i >= 0 and 0 <= i - offset < n and (id_limit is None or i < id_limit)
        return float(s_row[i - offset]) if ok else None

    def close(values: torch.Tensor) -> torch.Tensor:
        assert kth is not None  # asked only where there is a k-th score
        return _eqv(values, kth) | ((values - kth).abs() <= band)

    def tied(i: int) -> bool:
        return kth is not None and score(i) is not None and bool(close(s_row[i - offset]))

    return RowExample(
        row=_multi(flat, lead),
        expected=e_ids,
        actual=a_ids,
        only_expected=[(i, score(i)) for i in sorted(e_set - a_set)],
        only_actual=[(i, score(i)) for i in sorted(a_set - e_set)],
        kth_score=float(kth) if kth is not None else None,
        tied_total=int(close(s_row).sum()) if kth is not None else 0,
        tied_selected=sum(map(tied, e_set)),
        tied_selected_actual=sum(map(tied, a_set)),
        violations=[f"{VIOLATION_KINDS[kd]} ({kd})" for kd, f in viol.items() if bool(f[j])],
        band=band,
    )


def tied_rows(
    ids: torch.Tensor,
    scores: torch.Tensor,
    *,
    offset: int = 0,
    largest: bool = True,
    id_limit: int | torch.Tensor | None = None,
) -> dict[str, float]:
    """The rows of a selection that hold a tie choice, each by a digest of what decides it (its scores, its
    ids, the offset) -> its bits (as `tie_choice_bits` counts them): two cases that read the same tied row
    (a schedule's shared prefix, a layer read twice) give it the same key, so evidence gathered across
    cases counts it once."""
    import hashlib

    lead = tuple(ids.shape[:-1])
    k, n = ids.shape[-1], scores.shape[-1]
    r = math.prod(lead)
    if not r or not k or not n:
        return {}
    e = ids.reshape(r, k).to(torch.int64)
    s = scores.reshape(r, n).to(torch.float64)
    bits = _row_ways(e, s, offset, largest, _row_limits(id_limit, lead, r)) / math.log(2.0)
    out = {}
    for row in torch.nonzero(bits > 0).flatten().tolist():
        key = hashlib.sha256(s[row].numpy().tobytes() + e[row].numpy().tobytes() + str(offset).encode()).hexdigest()[
            :24
        ]
        out[key] = float(bits[row])
    return out


def _row_ways(
    e: torch.Tensor, s: torch.Tensor, offset: int, largest: bool, limits: torch.Tensor | None
) -> torch.Tensor:
    """Per row, ln C(tied, picked) of its k-th score's tie (0 where it holds no choice)."""
    n = s.shape[-1]
    valid = e != -1
    se = torch.gather(s, 1, torch.where(valid, e - offset, 0).clamp(0, n - 1))
    kth = _kth(se, valid, largest)
    reachable = torch.ones(s.shape[0], n, dtype=torch.bool)
    if limits is not None:
        reachable = (torch.arange(n)[None, :] + offset) < limits[:, None]
    tied = (_eqv(s, kth[:, None]) & reachable).sum(dim=1).double()
    picked = (valid & _eqv(se, kth[:, None])).sum(dim=1).double()
    finite = torch.isfinite(kth) & (tied > picked) & (picked > 0)
    ways = torch.lgamma(tied + 1) - torch.lgamma(picked + 1) - torch.lgamma(tied - picked + 1)
    return torch.where(finite, ways, 0.0)


def tie_choice_bits(
    ids: torch.Tensor,
    scores: torch.Tensor,
    *,
    offset: int = 0,
    largest: bool = True,
    id_limit: int | torch.Tensor | None = None,
) -> float:
    """How much choice the ties of a selection hold, in bits: over the rows, log2 of the number of
    ways to pick as many ids as `ids` holds among those tied with its k-th score, C(tied, picked).
    A tie-breaking rule that reproduces every row of `ids` by chance does so with probability
    2^-bits (the diagnosis names a tie order only on such evidence: docs/diagnosis.md). Rows whose
    k-th score is not finite (fill, masked rows) hold no tie choice here.

    >>> tie_choice_bits(torch.tensor([[0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    1.0
    """
    lead = tuple(ids.shape[:-1])
    k, n = ids.shape[-1], scores.shape[-1]
    r = math.prod(lead)
    if not r or not k or not n:
        return 0.0
    e = ids.reshape(r, k).to(torch.int64)
    s = scores.reshape(r, n).to(torch.float64)
    return float(_row_ways(e, s, offset, largest, _row_limits(id_limit, lead, r)).sum()) / math.log(2.0)
