"""Diagnose one failing case: judge the implementation's outputs again against the reference re-run
under each applicable variant of the catalogue (harness/diagnosis/variants.py), and name the variants
under which its failing outputs pass.

The comparator is the only judge. A variant *explains* a failing output when, against the reference
re-run under that variant (its outputs, its aux, the chain's rederivations), the implementation's
output passes that output's own comparison: the same policy and tolerances, the same boundary flips,
signed zeros and index verdicts, re-derived under the variant, and the variant moves that output's
expected value toward the implementation's (never a pass won by removing an accident of the golden:
an exact value that happened to meet a rule, say). A variant may be named only when no
output the implementation got right fails under it. So a port's own arithmetic around a bug never
hides the bug, and nothing the verdict would not accept is ever "explained": a NaN is never explained
by a finite value.

A variant that explains every failing output is a match. When none does, pairs of variants that each
explain part of the failing outputs (or move them) are tried together: two bugs at once. Whatever is
left, each output says which variant explains it, and which no variant explains. Some variants need
evidence beyond a pass: a tie order matches any one tied row by chance half the time, so it is named
only where the tied rows it decides could not have come out so by chance (`Variant.evidence`).

The search is bounded by work, never by wall time, so the same case gets the same diagnosis on any
machine under any load: at most `budget` re-runs of the reference, single variants in catalogue order
first, then pairs.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .variants import VARIANTS, Variant, together


@dataclass(frozen=True)
class Rejudged:
    """A case judged again under a variant (or a pair of them)."""

    ok: dict[str, bool]  # every judged output (and returned intermediate) -> passes under the variant
    changed: frozenset[str]  # outputs whose expected value the variant moves from the golden's
    digest: str  # of every expected tensor: two variants with one digest compute the same on this case
    evidence: dict[str, float] = field(default_factory=dict)  # output -> bits of evidence of a tie-order match
    complete: bool = True  # False: stopped at the first failing output of those it was asked to stop on
    # output -> whether the variant moved its expected value toward the implementation's answer (asked only
    # of the failing outputs a pass would explain; None: every move counts): a pass won by moving it away
    # reproduces an accident of the golden, not the implementation
    nearer: Callable[[str], bool] | None = None
    # output -> its tied rows (a digest of what decides each -> its bits: index_verdict.tied_rows), where
    # the variant moves a selection: what a run gathers across its cases (diagnosis/across_cases.py)
    tied: dict[str, dict[str, float]] = field(default_factory=dict)
    cost: float | None = None  # what it cost, in re-runs of the whole case (None: one re-run)


# (params for the reference, outputs to stop at when one fails) -> the case judged again under whatever
# variant is in force; None when the reference could not run on the case under it
Rejudge = Callable[[dict, frozenset], "Rejudged | None"]


@dataclass(frozen=True)
class Match:
    variants: tuple[str, ...]  # one name, or two: two bugs at once
    summaries: tuple[str, ...]
    explains: tuple[tuple[str, ...], ...]  # per variant: the failing outputs it explains on its own
    outputs: tuple[str, ...]  # the failing outputs this match explains (all of them, for a full match)
    failing: int  # failing outputs of the case
    indistinguishable: tuple[str, ...] = ()  # variants computing the same on this case (named beside it)

    @property
    def full(self) -> bool:
        return len(self.outputs) == self.failing

    def describe(self) -> str:
        named = [f"{s} [{v}]" for v, s in zip(self.variants, self.summaries)]
        if len(self.variants) == 1:
            what = f"matches: {named[0]}" if self.full else f"explains {_count(self.outputs, self.failing)}: {named[0]}"
        else:
            parts = [f"{n} (alone: {_names(e) or 'none on its own'})" for n, e in zip(named, self.explains)]
            what = (
                f"two known bugs at once, together explaining {_count(self.outputs, self.failing)}: "
                + "; and ".join(parts)
            )
        if self.full:
            what += f"; every failing output passes its own comparison against the reference with {'this bug' if len(self.variants) == 1 else 'both'}"
        if self.indistinguishable:
            what += (
                f"; this case cannot tell it from {', '.join(f'[{t}]' for t in self.indistinguishable)}, "
                "which computes the same here"
            )
        return what


def _names(outputs) -> str:
    outputs = list(outputs)
    return ", ".join(outputs[:6]) + (f" and {len(outputs) - 6} more" if len(outputs) > 6 else "")


def _count(outputs, failing: int) -> str:
    return (
        f"{len(outputs)} of {failing} failing output(s) ({_names(outputs)})"
        if len(outputs) < failing
        else f"all {failing} failing output(s)"
    )


@dataclass
class Diagnosis:
    matches: list[Match] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)  # failing outputs that no variant named explains
    # (variant, output, bits): a variant that reproduces an output on too little evidence to be named
    weak: list[tuple[str, str, float]] = field(default_factory=list)
    tried: int = 0  # re-runs of the reference (screens of a schedule's first steps included)
    screened: int = 0  # variants judged on the first divergent stage alone (nothing re-run; not in `tried`)
    confirmed: int = 0  # variants judged along the chain without a re-run (`confirm`; not in `tried`)
    spent: float = 0.0  # what they cost, in re-runs of the whole case (a screen costs its share of the steps, a
    # confirmation the share of the stages it rederived)
    applicable: int = 0
    budget: int = 0
    stopped: str = ""  # why candidates were left untried ('' when every candidate ran)
    at: str = ""  # the first divergent step or stage
    # tie orders a run may name from several cases (diagnosis/across_cases.py): variant -> the tied rows of
    # this case it reproduces every failing output with, on too little evidence here alone (digest -> bits)
    tie_support: dict[str, dict[str, float]] = field(default_factory=dict)
    tie_contradicts: list[str] = field(default_factory=list)  # tie orders this case rules out

    def lines(self) -> list[str]:
        where = f" (from {self.at})" if self.at else ""
        if self.matches:
            lines = [f"diagnosis{where}: {m.describe()}" for m in self.matches]
            if self.unexplained:
                lines.append(f"  no known porting bug explains {_names(self.unexplained)}")
        elif not self.applicable:
            lines = ["diagnosis: no variant of the catalogue changes this component (docs/diagnosis.md)"]
        else:
            lines = [
                f"diagnosis{where}: none of the {self.applicable} known porting bug(s) that can change this "
                "component explains these outputs (docs/diagnosis.md)"
            ]
        named = {v for m in self.matches for v in m.variants}
        for variant, output, bits in self.weak:
            if variant not in named:
                lines.append(
                    f"  [{variant}] reproduces {output}, but the tied rows it decides hold {bits:.2g} bit(s) of "
                    f"choice: another tie order matches it by chance 1 time in {2**bits:.3g}; not named "
                    "(docs/diagnosis.md, \"Evidence\")"
                )
        if self.stopped:
            lines.append(f"  diagnosis stopped: {self.stopped}")
        return lines

    def to_json(self) -> dict:
        return {**asdict(self), "matches": [asdict(m) for m in self.matches]}


def applicable(component: str, params: dict) -> list[Variant]:
    out = []
    for v in VARIANTS:
        if not any(fnmatch.fnmatchcase(component, p) for p in v.components):
            continue
        if v.params is not None and v.params(params) is None:
            continue
        out.append(v)
    return out


@dataclass
class _Single:
    variant: Variant
    judged: Rejudged
    explains: frozenset[str]
    breaks: frozenset[str]


def diagnose(
    component: str,
    verdicts: dict[str, bool],
    params: dict,
    rejudge: Rejudge,
    budget: int,
    at: str = "",
    screen: Rejudge | None = None,
    screen_cost: float = 1.0,
    stage: Rejudge | None = None,
    confirm: Rejudge | None = None,
) -> Diagnosis:
    """`verdicts`: every judged output's verdict (True: passed) under the reference; `rejudge(params,
    stop_on)` judges the case again under whatever variant is in force; `budget`: re-runs at most.
    `screen`, for a long schedule: the same on its first steps only (up to the first divergent one),
    `screen_cost` of a whole re-run; a variant under which an output you got right there fails is
    dropped before its whole schedule is re-run (it could be named for nothing).
    `stage`, along a chain: the first divergent stage alone judged under the variant, given the
    implementation's own inputs to it (nothing re-run, nothing spent). The variants under which it passes,
    and the tie orders (whose evidence a run gathers), are re-run whole first: a variant under which it
    still fails cannot explain every failing output, so the others are re-run only where none of the
    first does (for what each explains, and pairs). A match is then found for one whole re-run, not one
    per variant, and the names are those of re-running them all.
    `confirm`, along a chain the implementation returned every stage of: what `rejudge` concludes, from the
    stages the variant reaches alone (nothing re-run: it spends the share of the stages it rederives; None
    where it cannot stand for a re-run). Used for one variant at a time, never for a tie order whose
    evidence a re-run must count (one the first divergent stage passes under)."""
    result = Diagnosis(at=at, budget=budget)
    failing = sorted(n for n, ok in verdicts.items() if not ok)
    passing = frozenset(n for n, ok in verdicts.items() if ok)
    candidates = applicable(component, params)
    result.applicable = len(candidates)
    if not failing:
        return result

    def under(variants: tuple[Variant, ...], judge: Rejudge, stop_on: frozenset[str]) -> Rejudged | None:
        try:
            with together(variants) as variant_params:
                return judge(variant_params(params), stop_on)
        except Exception:  # a variant that cannot run on this case explains nothing
            return None

    def run(
        *variants: Variant, stop_on: frozenset[str] = passing, judge: Rejudge = rejudge, cost: float = 1.0
    ) -> Rejudged | None:
        if confirm is not None and judge is rejudge and len(variants) == 1 and variants[0].name not in counted:
            judged = under(variants, confirm, stop_on)
            if judged is not None:
                result.confirmed += 1
                result.spent = round(result.spent + (judged.cost or 0.0), 6)
                return judged
        result.tried += 1
        result.spent = round(result.spent + cost, 6)
        return under(variants, judge, stop_on)

    leading = candidates
    counted: set[str] = set()  # tie orders whose evidence only a re-run counts (`confirm` is not used)
    if stage is not None:
        leading = []
        for v in candidates:
            judged = under((v,), stage, frozenset())
            result.screened += 1
            passes = judged is not None and all(judged.ok.values())
            if v.evidence and passes:
                counted.add(v.name)
            if v.evidence or passes:
                leading.append(v)
        candidates = leading + [v for v in candidates if v not in leading]
    else:
        counted = {v.name for v in candidates if v.evidence}
    singles: list[_Single] = []
    for i, v in enumerate(candidates):
        if i == len(leading) and any(len(s.explains) == len(failing) and not s.breaks for s in singles):
            break  # a match among the variants the first divergent stage passes under: the rest cannot be one
        if result.spent + (screen_cost if screen is not None else 0.0) + 1 > budget:
            result.stopped = (
                f"budget of {budget} re-run(s) spent after {i} of {len(candidates)} variant(s) (--diagnosis-budget)"
            )
            break
        if screen is not None:
            first = run(v, judge=screen, cost=screen_cost)
            if first is not None and any(not ok for n, ok in first.ok.items() if n in passing):
                if v.evidence:
                    result.tie_contradicts.append(v.name)
                continue  # fails an output you got right early on: no cause, no partner of one
        judged = run(v)
        if judged is None or not judged.changed:  # changes nothing on this case: no evidence either way
            continue
        explains = frozenset(n for n in failing if _passes(judged, n) and _evident(v, n, judged))
        result.weak += [
            (v.name, n, round(judged.evidence.get(n, 0.0), 3))
            for n in failing
            if _passes(judged, n) and n not in explains
        ]
        breaks = frozenset(n for n in passing if not judged.ok.get(n, True))
        singles.append(_Single(v, judged, explains, breaks))
        if v.evidence:
            _tie_record(result, v, judged, failing, breaks, explains)
    causes = [s for s in singles if s.explains and not s.breaks]
    full = [s for s in causes if len(s.explains) == len(failing)]
    if full:
        result.matches = _full_matches(full, len(failing))
        return result
    pair = None if result.stopped else _pair(singles, causes, failing, passing, run, budget, result)
    if pair is not None:
        result.matches = [pair]
        return result
    # what single variants explain: each failing output named once, by its first cause in catalogue order
    left = set(failing)
    for s in sorted(causes, key=lambda s: -len(s.explains)):
        if s.explains & left:
            result.matches.append(
                Match(
                    (s.variant.name,),
                    (s.variant.summary,),
                    (tuple(sorted(s.explains)),),
                    tuple(sorted(s.explains)),
                    len(failing),
                )
            )
            left -= s.explains
    result.unexplained = sorted(left) if result.matches else []
    return result


def _tie_record(
    result: Diagnosis, v: Variant, judged: Rejudged, failing: list[str], breaks: frozenset[str], explains
) -> None:
    """What a tie-order variant tells a run beyond this case: support where it reproduces every failing
    output but is not named here for want of evidence (its tied rows, to be summed across cases), a
    contradiction where it breaks an output you got right or leaves a selection it moved unexplained."""
    if breaks or any(n in judged.changed and not _passes(judged, n) for n in failing):
        result.tie_contradicts.append(v.name)
    elif all(_passes(judged, n) for n in failing) and len(explains) < len(failing):
        rows: dict[str, float] = {}
        for n in failing:
            rows.update(judged.tied.get(n, {}))
        if rows:
            result.tie_support[v.name] = rows


def _passes(judged: Rejudged, name: str) -> bool:
    """Whether `name` passes under the variant, having moved toward the implementation's answer (a variant
    that passes an output by moving its expected value away from the answer explains an accident of the
    golden, never the implementation: `Rejudged.nearer`). An output a whole judgement did not record passes:
    it is judged only where what it is derived from fails (a candidate mask's kept blocks, say)."""
    return judged.ok.get(name, judged.complete) and (judged.nearer is None or judged.nearer(name))


def _evident(v: Variant, name: str, judged: Rejudged) -> bool:
    """Whether a variant's pass of `name` is evidence of it (a tie order decided by too few tied rows
    matches by chance: `Variant.evidence` bits at least)."""
    return not v.evidence or judged.evidence.get(name, v.evidence) >= v.evidence


def _evident_pair(a: _Single, b: _Single, failing: list[str], judged: Rejudged) -> bool:
    """Whether what each variant of a pair adds to its partner is evidence of it (`_evident`)."""
    return all(
        _evident(x.variant, n, judged) for x, other in ((a, b), (b, a)) for n in failing if n not in other.explains
    )


def _full_matches(full: list[_Single], failing: int) -> list[Match]:
    """One match per distinct computation: variants with one digest on this case are named together."""
    groups: dict[str, list[_Single]] = {}
    for s in full:
        groups.setdefault(s.judged.digest, []).append(s)
    out = []
    for group in groups.values():
        first, *same = group
        names = tuple(sorted(first.explains))
        out.append(
            Match(
                (first.variant.name,),
                (first.variant.summary,),
                (names,),
                names,
                failing,
                tuple(s.variant.name for s in same),
            )
        )
    return out


def _pair(
    singles: list[_Single],
    causes: list[_Single],
    failing: list[str],
    passing: frozenset[str],
    run,
    budget: int,
    result: Diagnosis,
) -> Match | None:
    """Two variants applied together that explain every failing output and break none that passed:
    first pairs of partial causes that cover the failures between them, then a cause with a variant
    that moves what it leaves, then two variants that each move a failing output."""
    movers = [s for s in singles if not s.breaks and s.judged.changed & set(failing)]
    want = set(failing)
    seen: set[tuple[str, ...]] = set()
    ordered = [(a, b) for a, b in itertools.combinations(causes, 2) if a.explains | b.explains == want]
    ordered += [(a, b) for a in causes for b in movers if b is not a and b.judged.changed & (want - a.explains)]
    ordered += list(itertools.combinations(movers, 2))
    for a, b in ordered:
        key = tuple(sorted((a.variant.name, b.variant.name)))
        if key in seen:
            continue
        seen.add(key)
        if result.spent + 1 > budget:
            result.stopped = f"budget of {budget} re-run(s) spent trying pairs of variants (--diagnosis-budget)"
            return None
        judged = run(a.variant, b.variant, stop_on=passing | want)
        if judged is None:
            continue
        if (
            all(_passes(judged, n) for n in failing)
            and all(judged.ok.get(n, True) for n in passing)
            and _evident_pair(a, b, failing, judged)
        ):
            return Match(
                (a.variant.name, b.variant.name),
                (a.variant.summary, b.variant.summary),
                (tuple(sorted(a.explains)), tuple(sorted(b.explains))),
                tuple(failing),
                len(failing),
            )
    return None
