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
dense integer ranks when the row also holds that infinity), and the algorithms run on Python
lists of keys and logical indices. Only ``<`` is ever applied to keys, so
:func:`order_from_keys` also runs on any objects defining ``__lt__`` (the antiqsort adversary
in the tests uses this). Valid only for libstdc++ builds (Linux wheels); macOS, Windows and
CUDA break ties differently (doc §4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["TopkStats", "order_from_keys", "torch_cpu_topk", "uses_partial_sort"]

_INSERTION_THRESHOLD = 16  # libstdc++ _S_threshold for __introsort_loop
_SELECT_THRESHOLD = 3  # __introselect loops while the range is longer than 3
_CHUNK_ELEMENTS = 1 << 20  # rows are turned into Python key lists this many elements at a time
_UNSUPPORTED = (torch.bool, torch.complex32, torch.complex64, torch.complex128)


@dataclass
class TopkStats:
    """Counters filled in by one or more emulated calls (pass one in; nothing is global)."""

    rows: int = 0
    partial_sort_rows: int = 0  # rows that took the k*64 <= n branch
    partitions: int = 0  # __unguarded_partition_pivot calls (introselect and introsort)
    introselect_heap_fallbacks: int = 0  # __introselect ran out of depth -> __heap_select
    introsort_heap_fallbacks: int = 0  # __introsort_loop ran out of depth -> heap sort


def uses_partial_sort(n: int, k: int) -> bool:
    """True when torch's CPU kernel takes the `std::partial_sort` branch (TopKImpl.h L45)."""
    return k * 64 <= n


# ---------------------------------------------------------------------------------------------
# libstdc++ algorithms on parallel lists K (keys) and I (logical indices); ranges [first, last).
# "x < y" on keys is the kernel's comp(x, y), "x should come before y".


def _lg(n: int) -> int:
    return n.bit_length() - 1  # std::__lg


def _partition_pivot(K: list, I: list, first: int, last: int) -> int:
    """__unguarded_partition_pivot: median of (first+1, mid, last-1) to first, then partition."""
    a, b, c = first + 1, first + (last - first) // 2, last - 1
    ka, kb, kc = K[a], K[b], K[c]
    if ka < kb:
        m = b if kb < kc else (c if ka < kc else a)
    elif ka < kc:
        m = a
    elif kb < kc:
        m = c
    else:
        m = b  # all three tie: the middle element becomes the pivot
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


def _introselect(K: list, I: list, first: int, nth: int, last: int, stats: TopkStats) -> None:
    """std::nth_element = __introselect(depth 2*lg(len)), insertion sort below 4 elements."""
    depth = 2 * _lg(last - first)
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


def order_from_keys(
    keys: list, k: int, sorted: bool = True, stats: TopkStats | None = None
) -> list[int]:
    """Logical indices of the first k queue slots after torch's CPU kernel, for one row.

    keys[j] is row element j mapped so that ``keys[x] < keys[y]`` is the kernel's comparator
    (x better than y); any objects with ``__lt__`` work. Returns k indices in output order.
    """
    n = len(keys)
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for a row of n={n}; need 0 <= k <= n")
    stats = stats if stats is not None else TopkStats()
    stats.rows += 1
    if k == 0:
        return []
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
# Keys and the torch-facing wrapper.


def _row_keys(x: torch.Tensor, largest: bool) -> list[list]:
    """x [R, n] -> R lists of keys with comp(a, b) <=> key[a] < key[b] (doc §1, make_keys)."""
    if not (x.is_floating_point()):
        a = x.to(torch.int64).numpy()  # [R, n]
        return (~a if largest else a).tolist()  # ~v = -v-1: order reversed, no overflow
    a = x.to(torch.float64).numpy()  # exact widening for bf16 / fp16 / fp32
    kx = -a if largest else a.copy()  # [R, n]
    nan = np.isnan(kx)
    if not nan.any():
        return kx.tolist()
    pin = -np.inf if largest else np.inf  # NaN is best (largest) or worst (smallest)
    clash = nan.any(axis=1) & (kx == pin).any(axis=1)  # that infinity is taken: use ranks
    kx[nan] = pin
    out = kx.tolist()
    for r in np.flatnonzero(clash).tolist():
        row_nan = nan[r]
        _, inv = np.unique(kx[r][~row_nan], return_inverse=True)  # dense ranks, ±0 merged
        ranks = np.empty(kx.shape[1], dtype=np.int64)
        ranks[~row_nan] = inv + (1 if largest else 0)
        ranks[row_nan] = 0 if largest else int(inv.max(initial=-1)) + 1
        out[r] = ranks.tolist()
    return out


def torch_cpu_topk(
    values: torch.Tensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,
    stats: TopkStats | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices int64) identical to ``torch.topk`` on Linux torch 2.13 CPU.

    Same shapes, dtypes, element order and tie choices, for any dim and batch shape; values
    are gathered from the input (±0 keep their sign; bf16 NaN come back as the canonical
    0x7FC0 the kernel's float->bf16 store writes). ``stats`` collects branch / fallback counts.

    >>> torch_cpu_topk(torch.tensor([1.0, float("nan"), 2.0, float("nan"), float("inf")]), 3)[1]
    tensor([1, 3, 4])
    """
    if values.dtype in _UNSUPPORTED:
        raise TypeError(f"topk: dtype {values.dtype} is not supported by torch's CPU topk")
    k = int(k)
    if values.dim() == 0:  # Sorting.cpp special case: copy the value, index 0, for k in {0, 1}
        if dim not in (-1, 0):
            raise IndexError(f"topk: dim={dim} is out of range for a 0-dim tensor; use -1 or 0")
        if not 0 <= k <= 1:
            raise ValueError(f"topk: k={k} is out of range for a 0-dim input (n=1); need k <= 1")
        return values.clone(), torch.zeros((), dtype=torch.int64, device=values.device)
    nd = values.dim()
    if not -nd <= dim < nd:
        raise IndexError(f"topk: dim={dim} is out of range for a {nd}-dim tensor")
    dim = dim % nd
    n = values.shape[dim]
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for dim {dim} of size n={n}; need 0 <= k <= n")
    moved = values.movedim(dim, -1)  # [..., n]
    lead = moved.shape[:-1]
    rows = moved.reshape(math.prod(lead), n)  # [R, n]
    stats = stats if stats is not None else TopkStats()
    if k == 0 or rows.shape[0] == 0:
        idx = torch.zeros((rows.shape[0], k), dtype=torch.int64, device=rows.device)
    else:
        src = rows.detach().cpu()
        step = max(1, _CHUNK_ELEMENTS // max(n, 1))  # bounds the Python key lists' memory
        picked = [
            order_from_keys(r, k, sorted, stats)
            for lo in range(0, src.shape[0], step)
            for r in _row_keys(src[lo : lo + step], largest)
        ]
        idx = torch.tensor(picked, dtype=torch.int64).to(rows.device)
    out_vals = torch.gather(rows, 1, idx)  # [R, k]
    if values.dtype == torch.bfloat16:  # queue holds float; float->bf16 maps NaN to 0x7FC0
        canon = torch.tensor(0x7FC0, dtype=torch.int16).view(torch.bfloat16)
        out_vals = torch.where(torch.isnan(out_vals), canon, out_vals)
    shape = (*lead, k)
    return (
        out_vals.reshape(shape).movedim(-1, dim).contiguous(),
        idx.reshape(shape).movedim(-1, dim).contiguous(),
    )

