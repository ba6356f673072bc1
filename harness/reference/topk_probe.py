"""Start-up probe: does this process's ``torch.topk`` break ties exactly like the emulation?

`v41_conformance.reference.topk.emulate_topk` is the definition of the top-k the harness pins (torch
2.13's CPU kernel on libstdc++, ties included). It costs Python time, so `torch_cpu_topk` hands
CPU tensors to ``torch.topk`` itself, but only once this probe has run a small fixed set of rows
through both and found every index and every value (bit for bit) identical. The rows are built
to expose tie handling: both kernel branches (k*64 <= n and not, with and without the
std::sort of the first k-1), sorted and unsorted, largest and smallest, NaN, ±0, ±inf, rows
that are one long tie, a transposed input, in each dtype the dispatcher may hand to torch
(`PROBED_DTYPES`). A torch that picks or orders tied elements differently (another kernel,
another C++ standard library) fails, and the harness stays on the emulation. The verdict is
taken once per process (`topk.torch_topk_matches`) and costs about 20-30 ms. This module knows
the probe, not the emulation: the caller hands it the reference to hold torch.topk against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

__all__ = ["PROBED_DTYPES", "probe_rows", "probe_topk"]

PROBED_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32, torch.int64})
_FLOAT_POOL = (float("-inf"), float("inf"), float("nan"), 0.0, -0.0, 1.0, -2.0, 3.0)
# (n, k): partial_sort (10*64 <= 640); nth_element with a std::sort of 279 slots, long enough
# for the array path's numpy partitions; nth_element with a sort of 148, all in the list code.
_SHAPES = ((640, 10), (600, 280), (150, 149))
_SEED = 20_130

TopkFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def probe_rows(dtype: torch.dtype, n: int) -> torch.Tensor:
    """[3, n] deterministic rows of `dtype`, each tie-heavy in its own way: a pool of special
    values, bf16-like scores with masked (-inf) and zero clumps, and one long tie."""
    rng = np.random.default_rng(_SEED + n)
    if dtype.is_floating_point:
        pool = rng.choice(np.array(_FLOAT_POOL), n)  # NaN, ±0, ±inf and a few small values
        scores = torch.from_numpy(rng.standard_normal(n)).to(torch.bfloat16).double().numpy()
        scores[rng.random(n) < 1 / 3] = -np.inf  # masked, as on the indexer path
        scores[rng.random(n) < 1 / 8] = 0.0
        scores[rng.random(n) < 1 / 50] = np.nan
        tie = np.full(n, -np.inf)
    else:
        info = torch.iinfo(dtype)
        pool = rng.choice([info.min, info.max, -1, 0, 1, 2], n)
        scores = rng.integers(-5, 6, n)
        tie = np.zeros(n, dtype=np.int64)
    return torch.from_numpy(np.stack([pool, scores, tie])).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns, so NaN payloads and the sign of zero are compared too."""
    widths = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(widths[t.element_size()]) if t.is_floating_point() else t


def _probe_cases() -> Iterator[tuple[torch.Tensor, int, int, bool, bool]]:
    """(values, k, dim, largest, sorted) for every probed dtype."""
    for dtype in sorted(PROBED_DTYPES, key=str):
        rows_of = {n: probe_rows(dtype, n) for n in sorted({n for n, _ in _SHAPES})}
        for n, k in _SHAPES:
            for largest in (True, False):
                for sorted_ in (True, False):
                    yield rows_of[n], k, -1, largest, sorted_
        n, k = _SHAPES[1]
        yield rows_of[n].t(), k, 0, True, True  # the kernel reads a column through its stride


def probe_topk(reference: TopkFn, topk: TopkFn | None = None) -> bool:
    """True if ``topk`` (default: ``torch.topk`` as it is now) returns exactly ``reference``'s
    indices and values, dtypes and shapes on every probe case."""
    topk = topk if topk is not None else torch.topk
    for values, k, dim, largest, sorted_ in _probe_cases():
        want_values, want_indices = reference(values, k, dim=dim, largest=largest, sorted=sorted_)
        try:
            got_values, got_indices = topk(values, k, dim=dim, largest=largest, sorted=sorted_)
        except RuntimeError:  # a torch that cannot run a case cannot be trusted with it either
            return False
        if got_indices.dtype != torch.int64 or got_values.dtype != values.dtype:
            return False
        if not (torch.equal(got_indices, want_indices) and torch.equal(_bits(got_values), _bits(want_values))):
            return False
    return True
