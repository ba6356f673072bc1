"""McIlroy's quicksort adversary played against the emulated torch CPU top-k: rows that exhaust its depth limits.

M. D. McIlroy, "A Killer Adversary for Quicksort" (Software: Practice and Experience, 1999):
every element starts as "gas" (unknown, larger than every value fixed so far). When two gas
elements are compared, one is frozen to the next solid value: the one the algorithm is most
likely using as its pivot (the gas element seen in the previous comparison). Gas vs solid
compares as "solid is smaller". Since every comparison is answered consistently with the
values finally assigned (leftover gas shares one value, larger than all solids), feeding those
values back through the same algorithm replays the same comparisons, so the partitions split
off as little as possible each time and the depth limits of `__introselect` and
`__introsort_loop` run out, which sends both into their heap fallbacks
(`TopkStats.introselect_heap_fallbacks`, `introsort_heap_fallbacks`).

The adversary plays against `topk.order_from_keys` directly: keys are objects whose ``__lt__``
asks the adversary (the emulation only ever uses ``<`` on keys). The leftover gas is one long
tie; ``tie_step`` merges neighbouring solid values into more ties, so that the fallback's choice
among tied elements shows in the indices.
"""

from __future__ import annotations

from .topk import TopkStats, order_from_keys

__all__ = ["TARGETS", "antiqsort_keys", "antiqsort_values"]

TARGETS = ("select", "sort")


class _Adversary:
    """Gas-value comparator state for n elements; small value = compared as "better".

    Solid values are either low (0, 1, ... better than all gas) or high (2n, 2n-1, ... worse
    than all gas); leftover gas ends as n. The first ``high_first`` comparisons freeze to high
    values (the pivot ends up among the worst, so a partition splits off only the right end),
    the rest to low values (McIlroy's original: the pivot is among the best).
    """

    def __init__(self, n: int, high_first: int = 0) -> None:
        self.gas = n
        self.val = [n] * n
        self.low, self.high = 0, 2 * n
        self.candidate = -1
        self.comparisons = 0
        self.high_first = high_first

    def _freeze(self, i: int) -> None:
        """Give element i the next solid value (high during the first phase, else low)."""
        if self.comparisons <= self.high_first:
            self.val[i] = self.high
            self.high -= 1
        else:
            self.val[i] = self.low
            self.low += 1

    def less(self, x: int, y: int) -> bool:
        """The answer to "is element x better than element y?", freezing gas as it goes."""
        self.comparisons += 1
        val, gas = self.val, self.gas
        if val[x] == gas and val[y] == gas:
            self._freeze(x if x == self.candidate else y)
        if val[x] == gas:
            self.candidate = x
        elif val[y] == gas:
            self.candidate = y
        return val[x] < val[y]


class _GasKey:
    """Element i of the row, as a key whose ``<`` is answered by the adversary."""

    __slots__ = ("adv", "i")

    def __init__(self, i: int, adv: _Adversary) -> None:
        self.i, self.adv = i, adv

    def __lt__(self, other: _GasKey) -> bool:
        return self.adv.less(self.i, other.i)


def _play(n: int, k: int, sorted: bool, high_first: int, stats: TopkStats | None) -> _Adversary:
    """One emulated top-k(k) of n gas keys; the adversary afterwards holds the frozen values."""
    adv = _Adversary(n, high_first)
    order_from_keys([_GasKey(i, adv) for i in range(n)], k, sorted, stats)
    return adv


def antiqsort_keys(
    n: int, k: int, sorted: bool = True, target: str = "select", stats: TopkStats | None = None
) -> list[int]:
    """Keys in [0, 2n] (small = better) that drive the emulated top-k(k) of n into its worst case.

    target="select": McIlroy's adversary from the first comparison, which exhausts the
    `__introselect` depth. target="sort": during nth_element freeze pivots as the worst values
    (the gas, i.e. the undecided elements, stays in front of nth), then play McIlroy against
    the `std::sort` of the first k-1 slots, exhausting the `__introsort_loop` depth. The
    nth_element phase gets identical answers in both runs, so its comparison count (measured
    with sorted=False) marks the switch. For ``largest=False`` use the keys as input values;
    for ``largest=True`` negate them.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be 'select' or 'sort', got {target!r}")
    high_first = _play(n, k, False, n * n + 1, None).comparisons if target == "sort" else 0
    return list(_play(n, k, sorted, high_first, stats).val)


def antiqsort_values(
    n: int, k: int, largest: bool, sorted: bool = True, target: str = "select", tie_step: int = 1
) -> list[float]:
    """Input row for ``topk(row, k, largest, sorted)``; ``tie_step > 1`` merges adjacent keys into
    ties (the run is then no longer guaranteed adversarial, only tie-heavy and close to it)."""
    keys = [v // tie_step for v in antiqsort_keys(n, k, sorted, target)]
    return [float(-v if largest else v) for v in keys]
