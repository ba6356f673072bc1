"""torch.topk on Linux CPU (torch 2.13, libstdc++), emulated element for element, ties included.

Every top-k on the V4.1 attention path (indexer M:579, candidate blocks M:607) runs torch's
CPU kernel (ATen `TopKImpl.h`), which fills a queue of (value, index) pairs and calls
libstdc++'s algorithms with a value-only comparator (NaN best for largest, worst for
smallest; ±0 equal):

* `k*64 <= n`: `std::partial_sort(q, q+k, q+n)` = `__heap_select` + `__sort_heap`; always
  sorted, whatever `sorted` says;
* otherwise `std::nth_element(q, q+k-1, q+n)` (`__introselect`), then, only if `sorted`,
  `std::sort(q, q+k-1)` (`__introsort_loop` + `__final_insertion_sort`).

Which tied elements survive, and in which order, is an artefact of those algorithms'
data movement, so this module re-runs them (written from the account in
`docs/topk-tie-order.md` §1-2, not from either code base). Each row is mapped once to keys
with `comp(x, y) <=> key(x) < key(y)` (floats: ``-v`` / ``v`` with NaN pinned to ∓inf, or
dense integer ranks when the row also holds that infinity).

The emulation exists twice, and the tests hold the two to each other:

* the list algorithms (`_heap_select`, `_introselect_loop`, ...) are a line-by-line account of
  libstdc++ on Python lists of keys and logical indices. Only ``<`` is ever applied to keys, so
  :func:`order_from_keys` on a list runs on any objects defining ``__lt__`` (the antiqsort
  adversary in the tests uses this);
* the array path (:func:`order_from_keys` on a numpy array, and so :func:`emulate_topk`) does
  the same data movement in bulk: a partition of a long range is computed with numpy from the
  positions of its stoppers (`_partition_pivot_np`); heaps are run by `heapq` in C, whose
  operations move items exactly as libstdc++'s do (`_KeyHeap`), after numpy has dropped the
  elements that cannot enter; a range of equal keys is moved as a cached permutation
  (`_Uniform`), and the final insertion sort is a stable sort. Ranges of at most
  `_NUMPY_MIN_RANGE` elements go to the list code itself. When no `TopkStats` is asked for,
  a sort whose keys are all distinct skips straight to its only possible order.

:func:`torch_cpu_topk` is what the harness calls. The emulation (:func:`emulate_topk`) is the
definition; torch.topk is used only where the probe (:func:`torch_topk_matches`, run once
per process) proves this torch breaks ties identically, and then only for CPU tensors of the
dtypes it probed. ``CONFORMANCE_TOPK=emulate`` forces the emulation, ``=torch`` torch.topk. The
emulation matches libstdc++ builds (Linux wheels) only; macOS, Windows and CUDA break ties
differently (doc §4), so there the probe fails and the emulation runs.
"""

from __future__ import annotations

import functools
import heapq
import math
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .topk_probe import PROBED_DTYPES, probe_topk

__all__ = [
    "TOPK_MODE_ENV",
    "TopkStats",
    "emulate_topk",
    "order_from_keys",
    "torch_cpu_topk",
    "topk_mode",
    "torch_topk_matches",
    "uses_partial_sort",
]

_INSERTION_THRESHOLD = 16  # libstdc++ _S_threshold for __introsort_loop
_SELECT_THRESHOLD = 3  # __introselect loops while the range is longer than 3
_CHUNK_ELEMENTS = 1 << 20  # rows are turned into key arrays this many elements at a time
_UNSUPPORTED = (torch.bool, torch.complex32, torch.complex64, torch.complex128)
# Up to this length a partition costs less in the list code (~30 ns per element) than the
# dozen numpy calls of `_partition_pivot_np` (~7 µs, and ~10 µs at 2,000 elements).
_NUMPY_MIN_RANGE = 256
_UNIFORM_MAX_LENGTH = 1 << 13  # longest range of equal keys whose outcome is cached (`_Uniform`)
# `_KeyHeap.offer` filters the scan in chunks that start this long (or the heap's size) and
# double: the heap's root improves over the scan, so later chunks keep fewer candidates.
_OFFER_FIRST_CHUNK = 1024
_EXACT_INT_IN_FLOAT = 1 << 53  # integers up to this magnitude are exact in float64
_BF16_CANONICAL_NAN = torch.tensor(0x7FC0, dtype=torch.int16).view(torch.bfloat16)  # 0-dim

TOPK_MODE_ENV = "CONFORMANCE_TOPK"
_MODES = ("auto", "emulate", "torch")


@dataclass
class TopkStats:
    """Counters filled in by one or more emulated calls (pass one in; nothing is global)."""

    rows: int = 0
    partial_sort_rows: int = 0  # rows that took the k*64 <= n branch
    partitions: int = 0  # __unguarded_partition_pivot calls (introselect and introsort)
    introselect_heap_fallbacks: int = 0  # __introselect ran out of depth -> __heap_select
    introsort_heap_fallbacks: int = 0  # __introsort_loop ran out of depth -> heap sort
    # Array-path bookkeeping, not a libstdc++ event (so left out of ==, which holds the two paths
    # to each other): ranges of more than 16 equal keys that `_introsort_short` moved as one
    # cached `_uniform_introsort` permutation.
    short_uniform_runs: int = field(default=0, compare=False)


def uses_partial_sort(n: int, k: int) -> bool:
    """True when torch's CPU kernel takes the `std::partial_sort` branch (TopKImpl.h L45)."""
    return k * 64 <= n


# ---------------------------------------------------------------------------------------------
# libstdc++ algorithms on parallel lists K (keys) and I (logical indices); ranges [first, last).
# "x < y" on keys is the kernel's comp(x, y), "x should come before y".


def _lg(n: int) -> int:
    return n.bit_length() - 1  # std::__lg


def _median_position(ka: Any, kb: Any, kc: Any, a: int, b: int, c: int) -> int:
    """__move_median_to_first's choice among positions a, b, c holding keys ka, kb, kc."""
    if ka < kb:
        return b if kb < kc else (c if ka < kc else a)
    if ka < kc:
        return a
    if kb < kc:
        return c
    return b  # all three tie: the middle element becomes the pivot


def _partition_pivot(K: list, I: list, first: int, last: int) -> int:
    """__unguarded_partition_pivot: median of (first+1, mid, last-1) to first, then partition."""
    a, b, c = first + 1, first + (last - first) // 2, last - 1
    m = _median_position(K[a], K[b], K[c], a, b, c)
    K[first], K[m] = K[m], K[first]
    I[first], I[m] = I[m], I[first]
    p = K[first]  # the pivot stays at `first` throughout
    lo, hi = first + 1, last
    while True:
        while K[lo] < p:
            lo += 1
        hi -= 1
        while p < K[hi]:
            hi -= 1
        if lo >= hi:
            return lo
        K[lo], K[hi] = K[hi], K[lo]
        I[lo], I[hi] = I[hi], I[lo]
        lo += 1


def _insertion_sort(K: list, I: list, first: int, last: int) -> None:
    """__insertion_sort: stable; an element better than *first is moved there directly."""
    for i in range(first + 1, last):
        v, vi = K[i], I[i]
        if v < K[first]:
            K[first + 1 : i + 1] = K[first:i]
            I[first + 1 : i + 1] = I[first:i]
            K[first], I[first] = v, vi
        else:
            j = i - 1
            while v < K[j]:  # __unguarded_linear_insert
                K[j + 1] = K[j]
                I[j + 1] = I[j]
                j -= 1
            K[j + 1], I[j + 1] = v, vi


def _unguarded_insertion_sort(K: list, I: list, first: int, last: int) -> None:
    for i in range(first, last):
        v, vi = K[i], I[i]
        j = i - 1
        while v < K[j]:
            K[j + 1] = K[j]
            I[j + 1] = I[j]
            j -= 1
        K[j + 1], I[j + 1] = v, vi


def _adjust_heap(K: list, I: list, base: int, hole: int, length: int, v: Any, vi: int) -> None:
    """__adjust_heap: sift the hole down to a leaf (right child wins ties), then __push_heap."""
    top = hole
    child = hole
    half = (length - 1) // 2
    while child < half:
        child = 2 * child + 2
        if K[base + child] < K[base + child - 1]:
            child -= 1
        K[base + hole] = K[base + child]
        I[base + hole] = I[base + child]
        hole = child
    if not length & 1 and child == (length - 2) // 2:
        child = 2 * child + 1
        K[base + hole] = K[base + child]
        I[base + hole] = I[base + child]
        hole = child
    parent = (hole - 1) // 2
    while hole > top and K[base + parent] < v:  # strict: a tie stops the climb
        K[base + hole] = K[base + parent]
        I[base + hole] = I[base + parent]
        hole = parent
        parent = (hole - 1) // 2
    K[base + hole], I[base + hole] = v, vi


def _make_heap(K: list, I: list, first: int, last: int) -> None:
    length = last - first
    for parent in range((length - 2) // 2, -1, -1):
        _adjust_heap(K, I, first, parent, length, K[first + parent], I[first + parent])


def _heap_select(K: list, I: list, first: int, middle: int, last: int) -> None:
    """__heap_select: keep the best middle-first in a heap whose root is the worst of them."""
    _make_heap(K, I, first, middle)
    length = middle - first
    if length == 0:
        return
    root = K[first]
    for i in range(middle, last):
        if K[i] < root:  # only strictly better candidates are admitted (__pop_heap)
            v, vi = K[i], I[i]
            K[i], I[i] = root, I[first]
            _adjust_heap(K, I, first, 0, length, v, vi)
            root = K[first]


def _sort_heap(K: list, I: list, first: int, last: int) -> None:
    while last - first > 1:
        last -= 1
        v, vi = K[last], I[last]
        K[last], I[last] = K[first], I[first]
        _adjust_heap(K, I, first, 0, last - first, v, vi)


def _introselect_loop(K: list, I: list, first: int, nth: int, last: int, depth: int, stats: TopkStats) -> None:
    """__introselect's loop with `depth` partitions left, insertion sort below 4 elements."""
    while last - first > _SELECT_THRESHOLD:
        if depth == 0:
            stats.introselect_heap_fallbacks += 1
            _heap_select(K, I, first, nth + 1, last)
            K[first], K[nth] = K[nth], K[first]  # the heap root (worst kept) goes to nth
            I[first], I[nth] = I[nth], I[first]
            return
        depth -= 1
        stats.partitions += 1
        cut = _partition_pivot(K, I, first, last)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(K, I, first, last)


def _introselect(K: list, I: list, first: int, nth: int, last: int, stats: TopkStats) -> None:
    """std::nth_element = __introselect(depth 2*lg(len))."""
    _introselect_loop(K, I, first, nth, last, 2 * _lg(last - first), stats)


def _introsort_loop(K: list, I: list, first: int, last: int, depth: int, stats: TopkStats) -> None:
    while last - first > _INSERTION_THRESHOLD:
        if depth == 0:
            stats.introsort_heap_fallbacks += 1
            _make_heap(K, I, first, last)  # __partial_sort(first, last, last): heap sort
            _sort_heap(K, I, first, last)
            return
        depth -= 1
        stats.partitions += 1
        cut = _partition_pivot(K, I, first, last)
        _introsort_loop(K, I, cut, last, depth, stats)
        last = cut


def _sort(K: list, I: list, first: int, last: int, stats: TopkStats) -> None:
    """std::sort = __introsort_loop(depth 2*lg(len)) + __final_insertion_sort."""
    if first == last:
        return
    _introsort_loop(K, I, first, last, 2 * _lg(last - first), stats)
    if last - first > _INSERTION_THRESHOLD:
        _insertion_sort(K, I, first, first + _INSERTION_THRESHOLD)
        _unguarded_insertion_sort(K, I, first + _INSERTION_THRESHOLD, last)
    else:
        _insertion_sort(K, I, first, last)


def _order_from_list(keys: list, k: int, sorted: bool, stats: TopkStats) -> list[int]:
    """The list algorithms on one row of keys (any objects with ``__lt__``)."""
    n = len(keys)
    K, I = list(keys), list(range(n))
    if uses_partial_sort(n, k):
        stats.partial_sort_rows += 1
        _heap_select(K, I, 0, k, n)  # std::partial_sort; `sorted` is ignored on this branch
        _sort_heap(K, I, 0, k)
    else:
        _introselect(K, I, 0, k - 1, n, stats)
        if sorted:
            _sort(K, I, 0, k - 1, stats)  # only the first k-1 slots are sorted
    return I[:k]


# ---------------------------------------------------------------------------------------------
# The same algorithms on numpy arrays: float64 keys K (NaN-free) and int64 logical indices I.
# Each function does to the slots the kernel later reads what the list function of the same
# name (less the suffix) does; the tests hold the two paths to each other.


class _KeyHeap:
    """libstdc++'s heap over the (key, slot) pairs of K[first:middle], run by `heapq` in C.

    Why heapq is exact: CPython's heapify, heappushpop and heappop move items as libstdc++'s
    __make_heap, __heap_select's __pop_heap and __sort_heap do (the hole sinks to a leaf, taking
    the right child when the two children tie, then the item climbs back while its parent
    compares strictly lower; heapify sifts every parent after its children), and heappushpop
    admits an item only if it beats the root strictly. heapq keeps the *smallest* item on top
    where libstdc++ keeps the worst (largest key), so the entries are the negated keys.

    Entries are distinct float objects, which carry no slot: ``id(entry)`` maps each back to its
    slot, and every entry list stays referenced in ``_alive`` so no id can be reused.
    """

    def __init__(self, K: np.ndarray, first: int, middle: int) -> None:
        self.entries = (-K[first:middle]).tolist()
        self._alive = [self.entries]
        self._origin = dict(zip(map(id, self.entries), range(first, middle)))
        heapq.heapify(self.entries)  # __make_heap

    def offer(self, K: np.ndarray, lo: int, hi: int) -> None:
        """__heap_select's scan of slots [lo, hi), in slot order."""
        heap, pushpop = self.entries, heapq.heappushpop
        step = max(len(heap), _OFFER_FIRST_CHUNK)
        while lo < hi and heap:
            end = min(hi, lo + step)
            # The root only gets harder to beat as the scan goes on, so a slot that does not
            # strictly beat it at the start of its chunk cannot enter: numpy drops those.
            hits = np.flatnonzero(K[lo:end] < -heap[0]) + lo
            if hits.size:
                offered = (-K[hits]).tolist()
                self._alive.append(offered)
                self._origin.update(zip(map(id, offered), hits.tolist()))
                for entry in offered:
                    pushpop(heap, entry)  # enters only if strictly better than the root
            lo, step = end, 2 * step

    def slots(self) -> list[int]:
        """Where each heap entry came from, in heap (array) order."""
        return [self._origin[id(e)] for e in self.entries]

    def drain(self) -> list[int]:
        """__sort_heap: the slots in the order the sorted range holds them (best first).

        Each heappop moves the last item to the root and sifts it, as __pop_heap does; the
        popped root is what libstdc++ stores at the back of the shrinking range.
        """
        heap, pop = self.entries, heapq.heappop
        popped = [pop(heap) for _ in range(len(heap))]
        popped.reverse()
        return [self._origin[id(e)] for e in popped]


def _heap_select_np(K: np.ndarray, I: np.ndarray, first: int, middle: int, last: int) -> None:
    """__heap_select; slots [middle, last) are left as they were (nothing reads them again)."""
    heap = _KeyHeap(K, first, middle)
    heap.offer(K, middle, last)
    src = heap.slots()
    K[first:middle], I[first:middle] = K[src], I[src]


def _heap_sort_np(K: np.ndarray, I: np.ndarray, first: int, last: int) -> None:
    """__partial_sort(first, last, last): __make_heap, then __sort_heap of the whole range."""
    src = _KeyHeap(K, first, last).drain()
    K[first:last], I[first:last] = K[src], I[src]


def _partition_pivot_np(K: np.ndarray, I: np.ndarray, first: int, last: int) -> int:
    """`_partition_pivot` computed from the stoppers' positions instead of by scanning.

    With the pivot p at `first`, the left scan stops on the ascending positions L of keys >= p,
    the right scan on the descending positions R of keys <= p (the pivot itself ends R). Slots
    between the two scans are untouched, so the t-th swap exchanges L[t] and R[t], for as long
    as L[t] < R[t] (a prefix: L rises, R falls); with m swaps the returned cut is the first of
    L[m] (the next original stopper) and R[m-1] (where the last swap put a key >= p).
    """
    a, b, c = first + 1, first + (last - first) // 2, last - 1
    m = _median_position(K.item(a), K.item(b), K.item(c), a, b, c)
    K[first], K[m] = K[m], K[first]
    I[first], I[m] = I[m], I[first]
    p = K.item(first)
    body = K[first + 1 : last]
    left = np.flatnonzero(body >= p)  # never empty: the median-of-3 left one of each kind
    right = np.flatnonzero(body <= p)[::-1]
    common = min(left.size, right.size)
    swaps = int(np.count_nonzero(left[:common] < right[:common]))
    cut = int(left[swaps]) if swaps < left.size else last - first  # past any body slot
    if swaps:
        lo, hi = left[:swaps] + (first + 1), right[:swaps] + (first + 1)
        K[lo], K[hi] = K[hi], K[lo]
        I[lo], I[hi] = I[hi], I[lo]
        cut = min(cut, int(right[swaps - 1]))
    return cut + first + 1


@dataclass(frozen=True)
class _Uniform:
    """What a list algorithm does to a range of equal keys: slot j ends up with slot perm[j].

    Every comparison of equal keys is false, so the data movement depends only on the range's
    length and the algorithm's arguments; masked (-inf) and zero blocks meet it again and again.
    Cached for ranges of up to `_UNIFORM_MAX_LENGTH` (longer ones take the ordinary path).
    """

    perm: np.ndarray  # int64 [length]
    counts: TopkStats  # what the run counted

    @classmethod
    def of(cls, perm: list[int], counts: TopkStats) -> _Uniform:
        return cls(np.array(perm, dtype=np.int64), counts)


@functools.lru_cache(maxsize=256)
def _uniform_introsort(length: int, depth: int) -> _Uniform:
    perm, counts = list(range(length)), TopkStats()
    _introsort_loop([0] * length, perm, 0, length, depth, counts)
    return _Uniform.of(perm, counts)


@functools.lru_cache(maxsize=256)
def _uniform_introsort_take(length: int, depth: int) -> Callable[[list], Any]:
    """`_uniform_introsort`'s permutation as a getter for list slices (C speed)."""
    return operator.itemgetter(*_uniform_introsort(length, depth).perm.tolist())


@functools.lru_cache(maxsize=256)
def _uniform_introselect(length: int, nth: int, depth: int) -> _Uniform:
    perm, counts = list(range(length)), TopkStats()
    _introselect_loop([0] * length, perm, 0, nth, length, depth, counts)
    return _Uniform.of(perm, counts)


def _add_counts(stats: TopkStats, counts: TopkStats) -> None:
    stats.partitions += counts.partitions
    stats.introselect_heap_fallbacks += counts.introselect_heap_fallbacks
    stats.introsort_heap_fallbacks += counts.introsort_heap_fallbacks


def _is_uniform_np(K: np.ndarray, first: int, last: int) -> bool:
    """True if K[first:last] is one repeated key and short enough for the `_Uniform` caches."""
    if last - first > _UNIFORM_MAX_LENGTH:
        return False
    key = K.item(first)  # three probes turn away nearly every mixed range before the full scan
    return key == K.item(last - 1) == K.item((first + last) // 2) and bool((K[first:last] == key).all())


def _permute_np(K: np.ndarray, I: np.ndarray, first: int, uniform: _Uniform, stats: TopkStats) -> None:
    """Apply a `_Uniform` outcome to the range of equal keys that starts at `first`."""
    src = uniform.perm + first
    last = first + src.shape[0]
    K[first:last], I[first:last] = K[src], I[src]  # equal keys, but ±0 keep their own sign
    _add_counts(stats, uniform.counts)


def _introselect_np(K: np.ndarray, I: np.ndarray, nth: int, stats: TopkStats) -> None:
    """`_introselect` over the whole of K; the short tail runs the list code itself."""
    first, last = 0, K.shape[0]
    depth = 2 * _lg(last)
    while last - first > _SELECT_THRESHOLD:
        if _is_uniform_np(K, first, last):
            _permute_np(K, I, first, _uniform_introselect(last - first, nth - first, depth), stats)
            return
        if last - first <= _NUMPY_MIN_RANGE:
            break
        if depth == 0:
            stats.introselect_heap_fallbacks += 1
            _heap_select_np(K, I, first, nth + 1, last)
            K[first], K[nth] = K[nth], K[first]
            I[first], I[nth] = I[nth], I[first]
            return
        depth -= 1
        stats.partitions += 1
        cut = _partition_pivot_np(K, I, first, last)
        if cut <= nth:
            first = cut
        else:
            last = cut
    Kl, Il = K[first:last].tolist(), I[first:last].tolist()
    _introselect_loop(Kl, Il, 0, nth - first, last - first, depth, stats)
    K[first:last], I[first:last] = Kl, Il


def _introsort_loop_np(
    K: np.ndarray, I: np.ndarray, first: int, last: int, depth: int, stats: TopkStats, short: list[tuple[int, int, int]]
) -> None:
    """`_introsort_loop`; ranges of at most `_NUMPY_MIN_RANGE` go to ``short`` as (first, last,
    depth) for the list code (ranges are disjoint, so the order they are finished in is free)."""
    while last - first > _INSERTION_THRESHOLD:
        if _is_uniform_np(K, first, last):
            _permute_np(K, I, first, _uniform_introsort(last - first, depth), stats)
            return
        if last - first <= _NUMPY_MIN_RANGE:
            short.append((first, last, depth))
            return
        if depth == 0:
            stats.introsort_heap_fallbacks += 1
            _heap_sort_np(K, I, first, last)
            return
        depth -= 1
        stats.partitions += 1
        cut = _partition_pivot_np(K, I, first, last)
        _introsort_loop_np(K, I, cut, last, depth, stats, short)
        last = cut


def _introsort_short(K: list, I: list, ranges: list[tuple[int, int, int]], stats: TopkStats) -> None:
    """`_introsort_loop` on each (first, last, depth) of ``ranges`` in lists K and I, with ranges
    of one repeated key done by `_uniform_introsort` (an explicit stack: fewer Python calls)."""
    todo = list(ranges)
    while todo:
        first, last, depth = todo.pop()
        while last - first > _INSERTION_THRESHOLD:
            key = K[first]
            # Three probes turn away nearly every mixed range before min / max scan it.
            if key == K[last - 1] == K[(first + last) // 2] and min(K[first:last]) == max(K[first:last]):
                take = _uniform_introsort_take(last - first, depth)
                I[first:last] = take(I[first:last])
                K[first:last] = take(K[first:last])  # equal keys, but ±0 keep their own sign
                _add_counts(stats, _uniform_introsort(last - first, depth).counts)
                stats.short_uniform_runs += 1
                break
            if depth == 0:
                stats.introsort_heap_fallbacks += 1
                _make_heap(K, I, first, last)
                _sort_heap(K, I, first, last)
                break
            depth -= 1
            stats.partitions += 1
            cut = _partition_pivot(K, I, first, last)
            todo.append((cut, last, depth))
            last = cut


def _distinct_order(keys: np.ndarray) -> np.ndarray | None:
    """The order that sorts ``keys`` if no two of them tie (±0 tie), else None.

    A look at the first few keys finds a tie in tie-heavy rows before a full sort is paid for.
    """
    head = keys[:64].tolist()
    if len(set(head)) < len(head):  # -0.0 == 0.0 and they hash alike, so they count as a tie
        return None
    order = np.argsort(keys)
    ordered = keys[order]
    return None if (ordered[1:] == ordered[:-1]).any() else order


def _sort_np(K: np.ndarray, I: np.ndarray, last: int, stats: TopkStats, shortcut: bool, key_of: np.ndarray) -> None:
    """`_sort` of K[:last]; key_of[j] is logical index j's key.

    __final_insertion_sort is a stable sort here: its unguarded inserts never run past the
    front, because __introsort_loop leaves the range's smallest key among its first 16 slots
    (in a block of at most 16 that no later key beats, or at the front of a heap-sorted
    block), and an insertion sort that stays in range is a stable sort. With ``shortcut``, a
    range where no two keys tie goes straight to its only sorted order (its partitions are then
    not run, so not counted either).
    """
    if last == 0:
        return
    order = _distinct_order(K[:last]) if shortcut else None
    if order is None:
        short: list[tuple[int, int, int]] = []
        _introsort_loop_np(K, I, 0, last, 2 * _lg(last), stats, short)
        if short:  # one round trip through lists for all the short ranges
            Kl, Il = K[:last].tolist(), I[:last].tolist()
            _introsort_short(Kl, Il, short, stats)
            I[:last] = Il
            K[:last] = key_of[I[:last]]  # cheaper than converting Kl back
        order = np.argsort(K[:last], kind="stable")
    K[:last], I[:last] = K[:last][order], I[:last][order]


def _float_keys(keys: np.ndarray) -> np.ndarray:
    """Float64 keys for a row of numeric keys: same order and ties; exact (ranks where float64
    cannot hold the integers). A new array: the array path rearranges it."""
    if keys.dtype.kind == "f":
        out = keys.astype(np.float64)  # exact widening, always a copy
        if np.isnan(out).any():
            raise ValueError("topk keys must not hold NaN (pin it to an infinity or use ranks)")
        return out
    if keys.dtype.kind not in "iub":
        raise TypeError(f"topk keys must be numbers, got numpy dtype {keys.dtype}")
    if keys.size and max(-int(keys.min()), int(keys.max())) > _EXACT_INT_IN_FLOAT:
        # float64 cannot hold these integers exactly: dense ranks per row keep order and ties
        rows = keys.reshape(-1, keys.shape[-1])
        ranks = np.stack([np.unique(row, return_inverse=True)[1].reshape(-1) for row in rows])
        return ranks.reshape(keys.shape).astype(np.float64)
    return keys.astype(np.float64)


def _order_from_array(K: np.ndarray, k: int, sorted: bool, stats: TopkStats | None) -> np.ndarray:
    """The array path on one row of float64 keys (NaN-free; K is rearranged in place): int64 [k]
    logical indices in output order. ``stats`` None allows the `_sort_np` shortcut."""
    n = K.shape[0]
    counts = stats if stats is not None else TopkStats()
    if uses_partial_sort(n, k):
        counts.partial_sort_rows += 1
        heap = _KeyHeap(K, 0, k)  # std::partial_sort; slot j still holds logical index j
        heap.offer(K, k, n)
        return np.array(heap.drain(), dtype=np.int64)  # `sorted` is ignored on this branch
    I = np.arange(n, dtype=np.int64)
    key_of = K.copy() if sorted else K
    _introselect_np(K, I, k - 1, counts)
    if sorted:
        _sort_np(K, I, k - 1, counts, stats is None, key_of)  # only the first k-1 slots
    return I[:k].copy()


def order_from_keys(keys: list | np.ndarray, k: int, sorted: bool = True, stats: TopkStats | None = None) -> list[int]:
    """Logical indices of the first k queue slots after torch's CPU kernel, for one row.

    keys[j] is row element j mapped so that ``keys[x] < keys[y]`` is the kernel's comparator
    (x better than y). A list may hold any objects with ``__lt__`` and runs the list
    algorithms; a 1-D numpy array of numbers (NaN-free) runs the array path. Both give the
    same k indices in output order, and count the same ``stats``.
    """
    n = len(keys)
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for a row of n={n}; need 0 <= k <= n")
    if stats is not None:
        stats.rows += 1
    if k == 0:
        return []
    if isinstance(keys, np.ndarray):
        return _order_from_array(_float_keys(keys), k, sorted, stats).tolist()
    return _order_from_list(keys, k, sorted, stats if stats is not None else TopkStats())


# ---------------------------------------------------------------------------------------------
# Keys and the torch-facing functions.


def _row_keys(x: torch.Tensor, largest: bool) -> np.ndarray:
    """x [R, n] -> float64 keys [R, n], a new array, with comp(a, b) <=> key[a] < key[b] (doc §1,
    make_keys): ``-v`` / ``v``, NaN pinned to ∓inf, or dense ranks when that infinity is taken."""
    if not x.is_floating_point():
        a = x.to(torch.int64).numpy()  # [R, n]
        return _float_keys(~a if largest else a)  # ~v = -v-1: order reversed, no overflow
    a = x.to(torch.float64).numpy()  # exact widening for bf16 / fp16 / fp32
    kx = -a if largest else a.copy()  # [R, n]; a may share memory with x when x is float64
    nan = np.isnan(kx)
    if not nan.any():
        return kx
    pin = -np.inf if largest else np.inf  # NaN is best (largest) or worst (smallest)
    clash = nan.any(axis=1) & (kx == pin).any(axis=1)  # that infinity is taken: use ranks
    kx[nan] = pin
    for r in np.flatnonzero(clash).tolist():
        row_nan = nan[r]
        _, inv = np.unique(kx[r][~row_nan], return_inverse=True)  # dense ranks, ±0 merged
        ranks = np.empty(kx.shape[1], dtype=np.int64)
        ranks[~row_nan] = inv.reshape(-1) + (1 if largest else 0)
        ranks[row_nan] = 0 if largest else int(inv.max(initial=-1)) + 1
        kx[r] = ranks
    return kx


def _checked_args(values: torch.Tensor, k: int, dim: int) -> tuple[int, int]:
    """(k, dim wrapped) after torch's own checks, raised as TypeError / IndexError / ValueError."""
    if values.dtype in _UNSUPPORTED:
        raise TypeError(f"topk: dtype {values.dtype} is not supported by torch's CPU topk")
    k = int(k)
    if values.dim() == 0:
        if dim not in (-1, 0):
            raise IndexError(f"topk: dim={dim} is out of range for a 0-dim tensor; use -1 or 0")
        if not 0 <= k <= 1:
            raise ValueError(f"topk: k={k} is out of range for a 0-dim input (n=1); need k <= 1")
        return k, 0
    nd = values.dim()
    if not -nd <= dim < nd:
        raise IndexError(f"topk: dim={dim} is out of range for a {nd}-dim tensor")
    dim = dim % nd
    n = values.shape[dim]
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for dim {dim} of size n={n}; need 0 <= k <= n")
    return k, dim


def emulate_topk(
    values: torch.Tensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,
    stats: TopkStats | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices int64) identical to ``torch.topk`` on Linux torch 2.13 CPU, by emulation.

    Same shapes, dtypes, element order and tie choices, for any dim and batch shape; values
    are gathered from the input (±0 keep their sign; bf16 NaN come back as the canonical
    0x7FC0 the kernel's float->bf16 store writes). ``stats`` collects branch / fallback counts.

    >>> emulate_topk(torch.tensor([1.0, float("nan"), 2.0, float("nan"), float("inf")]), 3)[1]
    tensor([1, 3, 4])
    """
    k, dim = _checked_args(values, k, dim)
    if values.dim() == 0:  # Sorting.cpp special case: copy the value, index 0, for k in {0, 1}
        return values.clone(), torch.zeros((), dtype=torch.int64, device=values.device)
    n = values.shape[dim]
    moved = values.movedim(dim, -1)  # [..., n]
    lead = moved.shape[:-1]
    rows = moved.reshape(math.prod(lead), n)  # [R, n]
    if k == 0 or rows.shape[0] == 0:
        idx = torch.zeros((rows.shape[0], k), dtype=torch.int64, device=rows.device)
    else:
        src = rows.detach().cpu()
        step = max(1, _CHUNK_ELEMENTS // max(n, 1))  # bounds the key arrays' memory
        picked = np.empty((src.shape[0], k), dtype=np.int64)  # [R, k]
        for lo in range(0, src.shape[0], step):
            for r, keys in enumerate(_row_keys(src[lo : lo + step], largest), start=lo):
                if stats is not None:
                    stats.rows += 1
                picked[r] = _order_from_array(keys, k, sorted, stats)
        idx = torch.from_numpy(picked).to(rows.device)
    out_vals = torch.gather(rows, 1, idx)  # [R, k]
    if values.dtype == torch.bfloat16 and out_vals.isnan().any():
        # The queue holds float, and the kernel's float->bf16 store writes NaN as 0x7FC0.
        out_vals = out_vals.masked_fill(out_vals.isnan(), _BF16_CANONICAL_NAN)
    shape = (*lead, k)
    return (out_vals.reshape(shape).movedim(-1, dim).contiguous(), idx.reshape(shape).movedim(-1, dim).contiguous())


def topk_mode() -> str:
    """``CONFORMANCE_TOPK``: "auto" (default: torch.topk where the probe proved it), "emulate"
    (always the emulation) or "torch" (always torch.topk, unchecked)."""
    mode = os.environ.get(TOPK_MODE_ENV, "").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"{TOPK_MODE_ENV}={mode!r}: use one of {', '.join(_MODES)}")
    return mode


@functools.lru_cache(maxsize=1)
def torch_topk_matches() -> bool:
    """`topk_probe.probe_topk` of ``torch.topk`` against the emulation, once per process
    (``cache_clear()`` runs it again)."""
    return probe_topk(emulate_topk)


def _torch_topk_is_proven(values: torch.Tensor) -> bool:
    return values.is_cpu and values.dtype in PROBED_DTYPES and torch_topk_matches()


def torch_cpu_topk(
    values: torch.Tensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,
    stats: TopkStats | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`emulate_topk`'s result, computed by ``torch.topk`` where that is proven identical.

    torch.topk is used for CPU tensors of the dtypes `topk_probe` checks, when the probe passed
    in this process (``CONFORMANCE_TOPK=torch`` uses it always, ``=emulate`` never); passing
    ``stats`` asks for the emulation's counters, so it always emulates. Errors are raised here,
    before either runs, as the emulation raises them.

    >>> torch_cpu_topk(torch.tensor([1.0, float("nan"), 2.0, float("nan"), float("inf")]), 3)[1]
    tensor([1, 3, 4])
    """
    k, dim = _checked_args(values, k, dim)
    mode = topk_mode()
    if stats is None and (mode == "torch" or (mode == "auto" and _torch_topk_is_proven(values))):
        out_values, out_indices = torch.topk(values, k, dim=dim, largest=largest, sorted=sorted)
        return out_values, out_indices
    return emulate_topk(values, k, dim=dim, largest=largest, sorted=sorted, stats=stats)
