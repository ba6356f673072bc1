"""Deterministic sampling of fresh cases for `conformance fuzz` (pure; no I/O, no clock).

Case `i` of seed `s` is a pure function of (s, i, the components chosen): its component comes
from a cost-balanced rotation (the component whose estimated reference time so far is least goes
next, ties in name order), its spec from that component's `Space.draw` with a `random.Random`
seeded from (s, i), redrawn while its estimated cost is above `MAX_COST_S` (so the budget is not
spent on one huge shape). Its name, `fuzz-s<seed>-<i>`, gives its data seed (harness/cases.py),
so the same seed and index build the same tensors on every machine.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .cases import CaseSpec, concrete_specs
from .ids import matches
from .known import components
from .space import Space
from .spaces import spaces

MAX_COST_S = 1.0  # estimated reference seconds above which a draw is redrawn
REDRAWS = 20


@dataclass(frozen=True)
class Sampled:
    index: int
    spec: CaseSpec  # concrete (expanded, typed): what is built and judged
    entry: CaseSpec  # as a case file would hold it (promotion writes this)
    cost: float


def fuzz_name(seed: int, index: int) -> str:
    return f"fuzz-s{seed}-{index}"


def rng_for(seed: int, index: int, salt: str = "") -> random.Random:
    digest = hashlib.sha256(f"{seed}/{index}/{salt}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def selected_spaces(select: list[str]) -> dict[str, Space]:
    """The spaces of the components the selection names (`sparse_attn`, `quant.*`, `compressor/*`)."""
    chosen = {}
    for name, space in sorted(spaces().items()):
        if not select or any(matches(f"{name}/fuzz", [p]) or matches(f"{name}/x", [p.split("/")[0]]) for p in select):
            chosen[name] = space
    return chosen


def draw(space: Space, seed: int, index: int, name: str | None = None) -> Sampled:
    """One case of `space`: the first draw under the cost cap (or the cheapest of `REDRAWS`)."""
    component = components()[space.component]
    best: tuple[dict[str, Any], dict[str, Any], float] | None = None
    for attempt in range(REDRAWS):
        params, build = space.draw(rng_for(seed, index, f"{space.component}/{attempt}"))
        cost = float(space.cost(params, build))
        if best is None or cost < best[2]:
            best = (params, build, cost)
        if cost <= MAX_COST_S:
            break
    assert best is not None  # REDRAWS >= 1 draws
    params, build, cost = best
    entry = CaseSpec(
        space.component, name or fuzz_name(seed, index), params, build, source=f"fuzz seed {seed} case {index}"
    )
    concrete = concrete_specs(entry, component)
    return Sampled(index, concrete[0], entry, cost)


def sample(seed: int, chosen: dict[str, Space], start: int = 0) -> Iterator[Sampled]:
    """Cases `start`, `start + 1`, ... of this seed, forever; the caller stops when its budget ends."""
    spent = {name: 0.0 for name in chosen}
    index = 0
    while True:
        name = min(spent, key=lambda n: (spent[n], n))
        case = draw(chosen[name], seed, index)
        spent[name] += max(case.cost, 1e-3)
        if index >= start:
            yield case
        index += 1
