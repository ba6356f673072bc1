"""Judging one stage of a chain, and what a stage hands to the stages after it.

A stage is one output or intermediate of one call. Its rows that equal the golden's (the stored
tensor, or the reference's row digests for an intermediate the golden does not hold) pass as they
are: they are the reference's own values. The other rows are rederived: the reference re-run on
the values the implementation itself fed that stage (its intermediates and earlier outputs, where
they passed), so a difference inherited from a quantisation or selection decision upstream is not
charged to this stage. The whole output is then judged by its one policy against that expected
tensor. What the stage hands downstream is the implementation's own value, failing or not (so a
bug is reported once, at the stage that holds it, and what follows is judged given it); only a
value of the wrong dtype or shape, or one not returned, is replaced by the reference's.

`Lazy` holds a stage the implementation did not return: the reference, computed row by row only
for the rows a later stage asks for. Pure functions of tensors otherwise; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from ..accumulation import ACC, ACC_RMS, Terms
from ..compare import OutputVerdict

# (recorded name, expected, actual, extra context for the comparator) -> the verdict by the
# output's configured policy (the runner binds the config, the implementation's flags, params)
Judge = Callable[[str, torch.Tensor, Any, dict[str, torch.Tensor]], OutputVerdict]


@dataclass
class StageVerdict:
    """One judged output or intermediate, with what it was judged given."""

    name: str  # as recorded: `s00.l1.index_scores`
    verdict: OutputVerdict
    given: tuple[str, ...] = ()  # the implementation's own values its reference was rederived from
    assumed: tuple[str, ...] = ()  # values it did not return (or that failed): the reference's stood in
    rederived_rows: int = 0  # rows recomputed from them (0: every row equals the golden's)
    hint: str = ""  # for an unexplained difference: what to return so the harness can attribute it
    intermediate: bool = False

    @property
    def explained(self) -> bool:
        return explained(self.verdict)


# The stages a diagnosis screens a variant on (harness/runner.py, `stage_passes`): rederived from their
# inputs whatever those are, never taken as the golden's rows (the shortcut would take them as the
# reference computed them, not as the variant in force does).
REDERIVED: ContextVar[frozenset[str]] = ContextVar("REDERIVED", default=frozenset())

# The one stage a walk is for (the diagnosis's screen, harness/runner.py `_stage_stop`): every stage
# before it hands on the value it holds, unjudged and nothing of it rederived. What a stage hands on
# never depends on its verdict (module docstring), so the screened stage is judged given the same values.
ONLY: ContextVar[str | None] = ContextVar("ONLY", default=None)


@dataclass
class Reuse:
    """A chain walked again under a diagnosis's variant, given the first judgement (harness/runner.py,
    `confirmed`): a stage whose rederivation calls none of the variant's functions keeps its first verdict;
    one that calls them is rederived under the variant on every row, and keeps its first verdict too where
    every call returned what the reference's function returns (the stage is then the reference's)."""

    first: dict[str, OutputVerdict]  # every stage's verdict in the first judgement
    trace: Any  # diagnosis.patching.Trace: the variant's functions called (and diverging) since the last stage
    seen: set[str] = field(default_factory=set)  # every one called along the walk
    changed: dict[str, torch.Tensor] = field(default_factory=dict)  # stage -> its expected value, the variant's
    rederived: int = 0  # stages rederived under the variant
    walked: bool = False  # the chain began its walk with nothing of the variant's called before it


class Untargeted(Exception):
    """A chain that cannot be walked again stage by stage under a variant (`Reuse`): the whole reference
    must be re-run."""


REUSE: ContextVar[Reuse | None] = ContextVar("REUSE", default=None)


# The screen of one stage under a variant that replaces functions alone (harness/runner.py `stage_judged`):
# the trace of the variant's calls (diagnosis.patching.Trace), cleared at every stage passed over. Where
# rederiving the screened stage (probed on one row) calls none of them, it is the reference's: `Unreached`.
SCREEN_TRACE: ContextVar[Any] = ContextVar("SCREEN_TRACE", default=None)


class Unreached(Exception):
    """The screened stage calls none of the variant's functions: the variant leaves it as it is."""


@dataclass
class Sample:
    """A screen's first try at its stage (harness/runner.py, `stage_judged`): `count` of its differing rows,
    those farthest from the reference's own rederivation (`reference`, by stage, where known; else spread
    evenly), rederived under the variant alone. `fails(name, expected rows, actual rows, actual)` tells
    whether they prove the whole stage fails (harness/row_sample.py): then the rest is not computed."""

    fails: Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor], bool]
    reference: dict[str, torch.Tensor] = field(default_factory=dict)
    count: int = 16
    chosen: dict[str, torch.Tensor] = field(default_factory=dict)  # stage -> its rows, kept across screens

    def rows(self, name: str, actual: torch.Tensor, differ: torch.Tensor, lead: int) -> torch.Tensor:
        chosen = self.chosen.get(name)
        if chosen is None:
            chosen = self.chosen[name] = _farthest(actual, self.reference.get(name), differ, lead, self.count)
        return chosen


def _farthest(
    actual: torch.Tensor, reference: torch.Tensor | None, differ: torch.Tensor, lead: int, count: int
) -> torch.Tensor:
    """Up to `count` of the rows `differ` marks: those whose largest |actual - reference| is largest
    (a NaN or inf on one side only first), else spread evenly over them."""
    candidates = differ.nonzero().flatten()
    if candidates.numel() <= count:
        return candidates
    if reference is None or reference.shape != actual.shape or not actual.dtype.is_floating_point:
        return candidates[torch.linspace(0, candidates.numel() - 1, count).round().long().unique()]
    a = rows_of(actual, lead)[candidates].float().reshape(candidates.numel(), -1)
    e = rows_of(reference, lead)[candidates].float().reshape(candidates.numel(), -1)
    same = (a == e) | (torch.isnan(a) & torch.isnan(e))
    gap = torch.where(same, 0.0, (a - e).abs().nan_to_num(nan=math.inf))
    return candidates[gap.amax(-1).topk(count).indices.sort().values]


SAMPLE: ContextVar[Sample | None] = ContextVar("SAMPLE", default=None)


class Proven(Exception):
    """The screened stage fails on the rows of a `Sample`: it fails whole, computed no further."""


def unjudged(name: str) -> OutputVerdict | None:
    """The stand-in verdict of a stage a walk for another stage passes over (`ONLY`); None: judge it."""
    only = ONLY.get()
    if only is None or name == only:
        return None
    trace = SCREEN_TRACE.get()
    if trace is not None:  # what the variant's functions computed for this stage is not the screened stage's
        trace.clear()
    return OutputVerdict(name, True, "not judged: the walk is for " + only)


@dataclass
class ChainJudgement:
    """Every output's and intermediate's verdict, in chain order (step, layer, stage)."""

    verdicts: list[StageVerdict] = field(default_factory=list)
    flips: int = 0  # decisions inside the computation found to have flipped at a rounding boundary
    flip_example: str = ""

    def first_divergent(self) -> StageVerdict | None:
        return next((v for v in self.verdicts if not v.verdict.ok), None)


def explained(verdict: OutputVerdict) -> bool:
    """Whether every difference of this verdict is one the harness explains (accepted or merely
    refused by an opt-in flag: tie order, near ties, boundary flips under strict_boundaries), so
    the implementation's value can stand as the input of what follows."""
    if verdict.ok:
        return True
    m = verdict.metrics
    if not m:  # wrong dtype, shape or type
        return False
    if "rows_miss" in m and m.get("rows_exact") is not None:
        return m["rows_miss"] == 0 and not m.get("rows_unordered")
    if "scale_flips" in m:  # quantised
        return m.get("mismatched", 1) == 0
    return False


def rows_of(t: torch.Tensor, lead: int) -> torch.Tensor:
    """The tensor with its first `lead` dims flattened into one row axis."""
    rows = 1
    for n in t.shape[:lead]:
        rows *= int(n)
    return t.reshape(rows, *t.shape[lead:])


def differing(actual: torch.Tensor, golden: torch.Tensor, lead: int) -> torch.Tensor:
    """bool [rows]: rows whose bits differ (same dtype and shape)."""
    a, g = rows_of(actual, lead), rows_of(golden, lead)
    if a.dtype.is_floating_point:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, g = a.contiguous().view(width), g.contiguous().view(width)
    elif a.dtype == torch.bool:
        a, g = a.to(torch.uint8), g.to(torch.uint8)
    if a.shape[0] == 0:
        return torch.zeros(0, dtype=torch.bool)
    return (a != g).reshape(a.shape[0], -1).any(-1)


def assemble(base: torch.Tensor, rows: torch.Tensor, values: torch.Tensor, lead: int) -> torch.Tensor:
    """`base` with the given flat rows replaced by `values` (a new tensor)."""
    out = rows_of(base, lead).clone()
    if rows.numel():
        out[rows] = values.to(out.dtype)
    return out.reshape(base.shape)


def attribute_problem(actual: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    return not (
        isinstance(actual, torch.Tensor)
        and actual.dtype == dtype
        and tuple(actual.shape) == tuple(shape)
        and actual.device.type == "cpu"
    )


class Lazy:
    """A stage the implementation did not return (or returned wrong): the reference, row by row.

    `compute(rows)` gives the reference's values of the flat rows `rows` (int64 [n]) from the
    given inputs; each row is computed at most once.
    """

    def __init__(self, count: int, compute: Callable[[torch.Tensor], torch.Tensor]):
        self.count, self.compute = count, compute
        self.values: torch.Tensor | None = None
        self.known = torch.zeros(count, dtype=torch.bool)

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        missing = rows[~self.known[rows]]
        if missing.numel():
            missing = torch.unique(missing)
            fresh = self.compute(missing)
            if self.values is None:
                self.values = torch.zeros((self.count, *fresh.shape[1:]), dtype=fresh.dtype)
            self.values[missing] = fresh
            self.known[missing] = True
        if self.values is None:  # nothing asked yet and nothing computed: an empty request
            return self.compute(rows)
        return self.values[rows]


class RowContext:
    """What the comparator needs of a stage beyond its expected value, filled row by row as the rows
    are rederived (the exact value `<name>.exact`; an fp8 GEMM's term magnitudes: TermsContext): `fill`
    stands where nothing was computed (0: no allowance; NaN: not known)."""

    def __init__(self, name: str, rows: int, shape: tuple[int, ...], fill: float = 0.0):
        self.name, self.fill = name, fill
        self.values = torch.full((rows, *shape), fill, dtype=torch.float64)
        self.filled = False

    def put(self, rows: torch.Tensor, values: torch.Tensor | None) -> None:
        if values is not None and rows.numel():
            self.values[rows] = values.double().reshape(rows.numel(), *self.values.shape[1:])
            self.filled = True

    def extra(self, rows=None, values=None) -> dict[str, torch.Tensor]:
        return {self.name: self.values} if self.filled else {}


class TermsContext:
    """An fp8 GEMM's term magnitudes for a stage (`<name>.acc`, `<name>.acc_rms`: harness/accumulation.py),
    filled row by row as the rows are rederived."""

    def __init__(self, name: str, rows: int, shape: tuple[int, ...]):
        self.peak = RowContext(name + ACC, rows, shape)
        self.rms = RowContext(name + ACC_RMS, rows, shape)

    def put(self, rows: torch.Tensor, terms: Terms | None) -> None:
        if terms is not None:
            self.peak.put(rows, terms.peak)
            self.rms.put(rows, terms.rms)

    def extra(self, rows=None, values=None) -> dict[str, torch.Tensor]:
        return {**self.peak.extra(), **self.rms.extra()}


class Given:
    """A stage's value as the stages after it receive it: a full tensor (by flat row), or `Lazy`.
    `own`: the implementation's value (else the reference's stood in); `passed`: its verdict had no
    unexplained difference; `reference`: the value is bit for bit the reference's own (the golden's: a
    returned value equal to it, or one computed only from such values), so whatever the reference
    computes from it is the golden's too."""

    def __init__(
        self,
        name: str,
        full: torch.Tensor | None = None,
        lazy: Lazy | None = None,
        own: bool = False,
        passed: bool = True,
        reference: bool = False,
    ):
        self.name, self.full, self.lazy, self.own, self.passed = name, full, lazy, own, passed
        self.reference = reference

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        if self.full is not None:
            return self.full[rows]
        assert self.lazy is not None  # every Given holds its value in full or lazily
        return self.lazy.rows(rows)


def judge_rows(
    judge: Judge,
    name: str,
    actual: torch.Tensor,
    base: torch.Tensor,
    differ: torch.Tensor,
    reference: Callable[[torch.Tensor], torch.Tensor],
    lead: int,
    extra: Callable[[torch.Tensor, torch.Tensor | None], dict[str, torch.Tensor]] | None = None,
) -> tuple[OutputVerdict, torch.Tensor, int]:
    """(verdict, expected, rows rederived) for one stage whose differing rows are rederived.

    base: the golden's tensor, or the actual one where the golden holds only digests (rows that
    do not differ are then the reference's by construction); differ: bool [rows]; reference(rows)
    -> the reference's values of those rows given the implementation's inputs; extra(rows, values)
    -> aux tensors the comparator needs for them (term scales, the scores a selection ranked).
    """
    passed_over = unjudged(name)
    if passed_over is not None:
        return passed_over, base, 0
    trace = SCREEN_TRACE.get()
    if trace is not None and name == ONLY.get() and not trace.tainted and not trace.called and differ.any():
        reference(differ.nonzero().flatten()[:1])  # one row: does rederiving it call the variant?
        if not trace.called:
            raise Unreached(name)
    sample = SAMPLE.get()
    if sample is not None and name == ONLY.get() and extra is None:
        tried = sample.rows(name, actual, differ, lead)
        if 0 < tried.numel() < int(differ.sum()) and sample.fails(
            name, reference(tried), rows_of(actual, lead)[tried], actual
        ):
            raise Proven(name)
    reuse = REUSE.get()
    if reuse is not None and name in reuse.first:
        if not reuse.trace.called and differ.numel():
            reference(torch.zeros(1, dtype=torch.int64))  # one row: does rederiving it call the variant?
        if not reuse.trace.called:  # it cannot change this stage: its first verdict stands
            return reuse.first[name], base, 0
        differ = torch.ones_like(differ)  # it can: every row rederived under it
    rows = differ.nonzero().flatten()
    values: torch.Tensor | None = None  # the rederived rows (None: no row differs)
    expected = base
    if rows.numel():
        values = reference(rows)
        expected = assemble(base, rows, values, lead)
    context = extra(rows, values) if extra is not None else {}
    return judge(name, expected, actual, context), expected, int(rows.numel())
