"""The space a component's cases come from: what `conformance fuzz` samples and shrinks.

Frozen cases (`cases/*.yaml`) are points someone chose; a component's `Space` describes every
case it may be given: a `draw` that samples one case spec (its `params` and `build`, exactly as a
case file would write them) from a `random.Random`, respecting the constraints the reference
checks, and a `cost` that estimates how long the reference takes on it (relative seconds), so the
fuzzer can balance its budget across components and keep away from huge shapes.

Shrinking is generic (`shrink_candidates`): smaller integers in `build` and `params` (halved, or
one less), shorter lists (shapes, schedules by their steps), simpler choices (`Space.simple`:
key -> the simplest value, such as `kind: normal`). A candidate that the builder or the reference
refuses is skipped, so a shrink step never needs to know a component's constraints.

Spaces are registered by `harness/spaces/*.py` (`register_space`); `v41_conformance.spaces.spaces()` returns them.
A draw must be deterministic given the `random.Random` it is handed (no other randomness): the
same seed samples the same cases on every machine.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .schedules import parse_schedule_name, schedule_name

Spec = tuple[dict[str, Any], dict[str, Any]]  # (params, build), as in a case file


@dataclass(frozen=True)
class Space:
    component: str
    draw: Callable[[random.Random], Spec]
    cost: Callable[[dict[str, Any], dict[str, Any]], float] = lambda params, build: 0.01
    simple: dict[str, Any] = field(default_factory=dict)  # key -> its simplest value (build or params)
    keep: tuple[str, ...] = ()  # keys the generic shrinker must leave alone
    # Constraints of the space beyond what the reference checks (a kernel's head_dim multiple of
    # 32, say): a shrunk case must still lie in the space. None: whatever the reference accepts.
    contains: Callable[[dict[str, Any], dict[str, Any]], bool] | None = None
    note: str = ""  # what the space covers, for `conformance list --spaces`


SPACES: dict[str, Space] = {}


def register_space(space: Space) -> Space:
    if space.component in SPACES:
        raise ValueError(f"space for {space.component} registered twice")
    SPACES[space.component] = space
    return space


# --- helpers for draws ---------------------------------------------------------------------------


def log_int(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high], log-uniform: small values as likely per octave as large ones."""
    import math

    if low >= high:
        return low
    value = math.exp(rng.uniform(math.log(max(low, 1)), math.log(high + 1)))
    return max(low, min(high, int(value)))


def composition(rng: random.Random, total: int, most_steps: int = 8) -> list[int]:
    """Random positive step lengths summing to `total` (at most `most_steps` steps)."""
    steps = rng.randint(1, max(1, min(most_steps, total)))
    cuts = sorted(rng.sample(range(1, total), steps - 1)) if steps > 1 else []
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def random_schedule(rng: random.Random, total: int, q_max: int | None = None, rollbacks: bool = True) -> str:
    """A schedule name over `total` accepted positions. Without `q_max`: a random composition of
    contiguous chunks. With it: a prefill, then decode steps of 1..q_max positions, a quarter of
    them drafts of which only a prefix is accepted (the next step starts inside them)."""
    if q_max is None:
        return schedule_name(_from_lengths(composition(rng, total)))
    steps = [(0, rng.randint(1, total))]
    position = steps[0][1]
    while position < total:
        end = min(position + rng.randint(1, q_max), total)
        steps.append((position, end))
        if rollbacks and end - position > 1 and rng.random() < 0.25:
            position = rng.randint(position, end - 1)  # the draft's accepted prefix
        else:
            position = end
    return schedule_name(steps)


def _from_lengths(lengths: list[int]) -> list[tuple[int, int]]:
    steps, start = [], 0
    for length in lengths:
        steps.append((start, start + length))
        start += length
    return steps


# --- generic shrinking ---------------------------------------------------------------------------


def shrink_candidates(space: Space, params: dict[str, Any], build: dict[str, Any]) -> Iterator[Spec]:
    """Smaller or simpler variants of a case: without an optional build key, then each value
    smaller or simpler, most aggressive first within each key."""
    for key in sorted(build):
        if key not in space.keep:
            candidate = (params, {k: v for k, v in build.items() if k != key})
            if space.contains is None or _inside(space, *candidate):
                yield candidate
    for where, tree in (("build", build), ("params", params)):
        for path, value in _leaves(tree):
            if path[0] in space.keep:
                continue
            for smaller in _smaller(path, value, space):
                changed = _replace(tree, path, smaller)
                candidate = (params, changed) if where == "build" else (changed, build)
                if space.contains is None or _inside(space, *candidate):
                    yield candidate


def _inside(space: Space, params: dict[str, Any], build: dict[str, Any]) -> bool:
    assert space.contains is not None  # asked only of a space with a contains
    try:
        return bool(space.contains(params, build))
    except (KeyError, TypeError, ValueError, IndexError):  # a key the candidate dropped
        return False


def _leaves(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(tree, dict):
        for key in sorted(tree):
            yield from _leaves(tree[key], path + (key,))
        return
    if isinstance(tree, list) and tree and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in tree):
        yield path, tree  # a shape or a list of sizes: shrunk element by element and as a whole
        return
    if isinstance(tree, list) and path and path[-1] == "schedules":
        yield path, tree
        return
    yield path, tree


def _smaller(path: tuple, value: Any, space: Space) -> Iterator[Any]:
    key = path[-1] if path else None
    if key in space.simple and value != space.simple[key]:
        yield space.simple[key]
    if isinstance(value, bool):
        if value:
            yield False
        return
    if isinstance(value, int):
        yield from _decrements(value, floor=0)
        return
    if isinstance(value, float):
        if value not in (0.0, 1.0):
            yield round(value, 1) if round(value, 1) != value else 1.0
        return
    if isinstance(value, list) and key == "schedules":
        for i, name in enumerate(value):
            for shorter in _shorter_schedules(name):
                yield [*value[:i], shorter, *value[i + 1 :]]
        return
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        for i, v in enumerate(value):
            if isinstance(v, int):
                for smaller in _decrements(v, floor=1):
                    yield [*value[:i], smaller, *value[i + 1 :]]
        return


def _decrements(value: int, floor: int) -> Iterator[int]:
    """value/2, 3/4 value, 7/8 value, ..., value - 1 (not below `floor`): a failure at 400 that
    needs more than 256 shrinks in a dozen steps, not 144 steps of one."""
    step = value - max(value // 2, floor)
    while step >= 1:
        yield value - step
        step //= 2


def _shorter_schedules(name: str) -> Iterator[str]:
    """The schedule without its last step; with its last two steps merged; with a shorter prefill."""
    try:
        steps = parse_schedule_name(name)
    except ValueError:
        return
    if len(steps) > 1:
        last_start, last_end = steps[-1]
        previous = steps[-2]
        if last_start == previous[1]:  # contiguous: drop the last step
            yield schedule_name(steps[:-1])
            yield schedule_name([*steps[:-2], (previous[0], last_end)])
    start, end = steps[0]
    if len(steps) == 1 and end > 1:
        yield schedule_name([(0, end // 2)])


def _replace(tree: Any, path: tuple, value: Any) -> Any:
    out = copy.deepcopy(tree)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out
