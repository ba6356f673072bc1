"""How close each output came to its tolerance, read from a results document.

A tolerance output records, per case, the fraction of each bound it used (`bound_used`: the
worst element's error over its element-wise bound; `rel_l2_headroom`: the relative L2 error over
its bound). 1.0 is at the bound; a passing output never exceeds it. Stepped components record
one output per step (and layer), `s03.l1.out`; their headroom is grouped by the output's own
name (`out`), the worst step standing for all of them.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# metric key -> how a person names that bound
BOUNDS = {"bound_used": "element bound", "rel_l2_headroom": "rel L2"}
LEGACY = {"bound_used": "ulps_headroom"}  # results written before bound_used existed
STEP = re.compile(r"^s(\d+)\.(?:l(\d+)\.)?(.+)$")


class Worst(NamedTuple):
    value: float  # the largest fraction of a bound used, over cases (and steps)
    bound: str  # which bound: a key of BOUNDS
    case: str  # the case that came closest
    ok: bool  # whether every case passed this output


def output_group(name: str) -> str:
    """`s03.l1.out` -> `out`; `s00.ring` -> `ring`; anything else unchanged."""
    match = STEP.match(name)
    return match.group(3) if match else name


def step_of(name: str) -> tuple[int, int | None, str] | None:
    """`s03.l1.out` -> (3, 1, 'out'); `s03.out` -> (3, None, 'out'); None for an unstepped name."""
    match = STEP.match(name)
    if not match:
        return None
    return int(match.group(1)), (int(match.group(2)) if match.group(2) is not None else None), match.group(3)


def bounds_used(metrics: dict) -> dict[str, float]:
    """The fraction of each bound an output used, for the bounds it has."""
    used = {}
    for key in BOUNDS:
        value = metrics.get(key)
        if value is None and key in LEGACY:
            value = metrics.get(LEGACY[key])
        if isinstance(value, (int, float)):
            used[key] = float(value)
    return used


def worst_per_output(cases: list[dict]) -> dict[str, Worst]:
    """Per output group of these cases (one component's), the bound it came closest to."""
    worst: dict[str, Worst] = {}
    failed: set[str] = set()
    for case in cases:
        for name, metrics in (case.get("outputs") or {}).items():
            group = output_group(name)
            if metrics.get("ok") is False:  # a declined output (ok None) neither passed nor failed
                failed.add(group)
            for bound, value in bounds_used(metrics).items():
                if group not in worst or value > worst[group].value:
                    worst[group] = Worst(value, bound, case["id"], True)
    return {g: w._replace(ok=g not in failed) for g, w in sorted(worst.items())}


def per_case(case: dict) -> dict[tuple[str, str], float]:
    """(output group, bound) -> the largest fraction used in this case."""
    found: dict[tuple[str, str], float] = {}
    for name, metrics in (case.get("outputs") or {}).items():
        for bound, value in bounds_used(metrics).items():
            key = (output_group(name), bound)
            found[key] = max(found.get(key, 0.0), value)
    return found
