"""Diagnose one failing case: re-run the reference under each applicable variant of the catalogue
(harness/diagnosis/variants.py) and name those that reproduce the implementation's outputs.

A variant *matches* when, under it, every output the implementation failed is reproduced bit for
bit or explained far better than by the reference (its distance to the implementation's value is
at most `EXPLAINED` of the reference's), and no output the implementation got right moves away
from it. Nothing else is ever named: when no variant matches, the diagnosis says so. Variants run
in catalogue order within a time budget per case, until one reproduces every failing output bit for
bit (and that variant's twins: the ones that are the same arithmetic on some shapes, so both are
named); what the budget left untried is reported.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .variants import VARIANTS, Variant

EXPLAINED = 0.1  # a failing output is explained when the variant is at least 10x closer to it than the reference


@dataclass(frozen=True)
class Match:
    variant: str
    summary: str
    identical: int  # failing outputs the variant reproduces bit for bit
    explained: int  # failing outputs it reproduces or explains (identical included)
    outputs: int  # failing outputs judged

    def describe(self) -> str:
        how = (f"{self.identical}/{self.outputs} failing output(s) bit-identical" if self.identical == self.outputs
               else f"{self.identical}/{self.outputs} failing output(s) bit-identical, the other "
                    f"{self.outputs - self.identical} at least {round(1 / EXPLAINED)}x closer than the reference")
        return f"matches: {self.summary} [{self.variant}]; {how}"


@dataclass
class Diagnosis:
    matches: list[Match] = field(default_factory=list)
    tried: int = 0
    applicable: int = 0
    seconds: float = 0.0
    stopped: str = ""  # why variants were left untried ('' when every applicable one ran)
    at: str = ""  # the first divergent step or stage the outputs were failing from

    def lines(self) -> list[str]:
        where = f" (from {self.at})" if self.at else ""
        if self.matches:
            lines = [f"diagnosis{where}: {m.describe()}" for m in self.matches]
        elif not self.applicable:
            lines = [f"diagnosis: no variant of the catalogue changes this component (docs/diagnosis.md)"]
        else:
            lines = [f"diagnosis{where}: none of the {self.tried} known porting bug(s) tried reproduces these "
                     "outputs (docs/diagnosis.md)"]
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


def diagnose(component: str, golden: dict[str, torch.Tensor], actual: dict, failing: list[str], params: dict,
             execute: Callable[[dict], dict | None], budget_s: float, at: str = "") -> Diagnosis:
    """`execute(params)` runs the reference on the case's inputs (under whatever variant is applied)
    and returns its outputs (None when it could not); `failing`: the outputs the implementation failed."""
    start = time.perf_counter()
    result = Diagnosis(at=at)
    candidates = applicable(component, params)
    result.applicable = len(candidates)
    judged = [n for n in failing if isinstance(actual.get(n), torch.Tensor)]
    right = [n for n in golden if n not in failing and _comparable(golden[n], actual.get(n))]
    if not judged:
        result.stopped = "no failing output is a tensor to compare"
        return result
    # the reference's distance to each failing output; None where its dtype or shape is not the
    # reference's (a block size, say): only a variant that reproduces it bit for bit explains it
    reference = {n: _distance(actual[n], golden[n]) if _comparable(golden.get(n), actual[n]) else None
                 for n in judged}
    longest = 0.0
    for i, v in enumerate(candidates):
        spent = time.perf_counter() - start
        if i and spent + longest > budget_s:  # the first variant always runs
            result.stopped = (f"time budget {budget_s:g} s spent after {i} of {len(candidates)} variant(s) "
                              "(--diagnosis-budget)")
            break
        began = time.perf_counter()
        outputs = _run_variant(v, params, execute)
        longest = max(longest, time.perf_counter() - began)
        result.tried += 1
        if outputs is None:
            continue
        match = _match(v, outputs, actual, golden, judged, right, reference)
        if match is not None:
            result.matches.append(match)
            if match.identical == match.outputs:  # reproduced bit for bit: only its twins are left to try
                for twin in (t for t in candidates[i + 1:] if t.name in v.twins):
                    outputs = _run_variant(twin, params, execute)
                    result.tried += 1
                    found = None if outputs is None else _match(twin, outputs, actual, golden, judged, right, reference)
                    if found is not None:
                        result.matches.append(found)
                break
    result.matches.sort(key=lambda m: (-m.identical, -m.explained))
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _run_variant(v: Variant, params: dict, execute: Callable[[dict], dict | None]) -> dict | None:
    try:
        if v.params is not None:
            return execute(v.params(params))
        with v.apply():
            return execute(params)
    except Exception:  # a variant that cannot run on this case explains nothing
        return None


def _match(v: Variant, outputs: dict, actual: dict, golden: dict, judged: list[str], right: list[str],
           reference: dict[str, float]) -> Match | None:
    identical = explained = 0
    for name in judged:
        mine = outputs.get(name)
        if not _comparable(actual[name], mine):
            return None
        if _bits_equal(actual[name], mine):
            identical += 1
            explained += 1
            continue
        if reference[name] is not None and _distance(actual[name], mine) <= EXPLAINED * reference[name]:
            explained += 1
        else:
            return None
    for name in right:  # what the implementation got right must stay right under the variant
        mine = outputs.get(name)
        if not _comparable(actual[name], mine):
            return None
        if _distance(actual[name], mine) > 2 * _distance(actual[name], golden[name]) + _floor(golden[name]):
            return None
    return Match(v.name, v.summary, identical, explained, len(judged))


def _comparable(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
    return torch.equal(a, b)


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """L2 distance of float tensors (a NaN or inf where the other side differs: infinite); the number of
    differing elements otherwise."""
    if not a.dtype.is_floating_point:
        return float((a != b).sum())
    x, y = a.double(), b.double()
    same = (x == y) | (torch.isnan(x) & torch.isnan(y))
    finite = torch.isfinite(x) & torch.isfinite(y)
    if bool((~same & ~finite).any()):
        return float("inf")
    return float(torch.where(same, 0.0, x - y).norm())


def _floor(t: torch.Tensor) -> float:
    """A tiny slack for outputs that were right: 2^-20 of the output's norm (floats), none for ids."""
    if not t.dtype.is_floating_point:
        return 0.0
    v = t.double()
    return float(torch.where(torch.isfinite(v), v, 0.0).norm()) * 2.0 ** -20
