"""The top-k emulation against the real torch.topk (docs/topk-tie-order.md; v41-reference.md §7),
its two paths against each other, and the dispatcher that uses torch.topk once a probe proves it.

`emulate_topk` is the definition, so the equality tests call it explicitly (the dispatcher may
hand the same call to torch.topk, which would make them vacuous). Indices must match element for
element and in order, values bit for bit, over tie-heavy random rows on both libstdc++ branches,
every dtype the kernel dispatches, other dims and batched / permuted / strided inputs, plus
McIlroy-adversary rows that exhaust both depth limits (the heap fallbacks are proven hit through
TopkStats). The array path (numpy / heapq) is held to the list path (a line-by-line account of
libstdc++) without torch, counts included. The documented examples are also pinned as literal
values, which hold without torch. Comparisons with torch skip where the running torch is not a
Linux + GCC (libstdc++) build, since only that tie order is emulated.
"""

from __future__ import annotations

import math
import platform

import numpy as np
import pytest
import torch
from antiqsort import antiqsort_keys, antiqsort_values

import v41_conformance.reference.topk as topk_module
from v41_conformance.reference.topk import (
    TOPK_MODE_ENV,
    TopkStats,
    emulate_topk,
    order_from_keys,
    torch_cpu_topk,
    torch_topk_matches,
    uses_partial_sort,
)
from v41_conformance.reference.topk_probe import PROBED_DTYPES, probe_topk

_CONFIG = torch.__config__.show()
LIBSTDCXX = platform.system() == "Linux" and "GCC" in _CONFIG
needs_libstdcxx = pytest.mark.skipif(
    not LIBSTDCXX,
    reason=f"torch's CPU topk tie order is emulated for Linux + GCC (libstdc++) builds only; "
    f"this is {platform.system()} torch {torch.__version__}",
)
INF, NAN = math.inf, math.nan
_FLOAT_DTYPES = [torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.float64]
_BITS = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_BITS[t.dtype]) if t.dtype in _BITS else t


def _check(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> None:
    ev, ei = torch.topk(x, k, dim=dim, largest=largest, sorted=sorted)
    av, ai = emulate_topk(x, k, dim=dim, largest=largest, sorted=sorted)
    ctx = f"shape={tuple(x.shape)} dtype={x.dtype} k={k} dim={dim} largest={largest} sorted={sorted}"
    assert ai.dtype == torch.int64 and av.dtype == x.dtype, ctx
    assert ai.shape == ei.shape and av.shape == ev.shape, ctx
    head = f"\n torch {ei.flatten()[:24].tolist()}\n emul  {ai.flatten()[:24].tolist()}"
    assert torch.equal(ai, ei), ctx + head
    assert torch.equal(_bits(av), _bits(ev)), f"values differ for {ctx}"


# ---------------------------------------------------------------------------- row generators


def _row(rng: np.random.Generator, n: int) -> np.ndarray:
    """One tie-heavy row [n] float64 (doc §5 generator, plus NaN / ±0 / +inf sprinkles)."""
    kind = int(rng.integers(8))
    if kind == 0:
        x = rng.choice([0.0, 1.0], n)
    elif kind == 1:
        x = rng.choice([-INF, 0.5, 1.0, -2.0], n)
    elif kind == 2:
        x = np.full(n, -INF)
    elif kind == 3:  # -inf with a scatter of finite values
        x = np.full(n, -INF)
        hit = rng.random(n) < rng.uniform(0.005, 0.2)
        x[hit] = rng.integers(-3, 4, int(hit.sum()))
    elif kind == 4:  # bf16-quantised Gaussian with a -inf scatter
        x = torch.from_numpy(rng.standard_normal(n)).to(torch.bfloat16).double().numpy()
        x[rng.random(n) < rng.uniform(0.0, 0.5)] = -INF
    elif kind == 5:
        x = rng.integers(0, int(rng.integers(1, 51)), n).astype(np.float64)
        x[rng.random(n) < 0.2] = -INF
    elif kind == 6:
        x = rng.choice([-INF, 0.0, -0.0, 3.0, INF, NAN], n)
    else:
        x = rng.choice([0.0, -0.0], n)
    for value, p in ((NAN, 0.15), (INF, 0.1), (-0.0, 0.1)):
        if rng.random() < p:
            x[rng.random(n) < rng.uniform(0.001, 0.1)] = value
    return x


def _pick_k(rng: np.random.Generator, n: int) -> int:
    r = rng.random()
    if r < 0.25:
        return int(rng.integers(1, max(1, n // 64) + 1))  # partial_sort branch when n >= 64
    if r < 0.4:
        return min(n, n // 64 + 1)  # the first k on the nth_element branch
    if r < 0.55:
        return max(1, min(n, int(rng.choice([1, 2, n - 1, n]))))
    return int(rng.integers(1, n + 1))


def _pick_n(rng: np.random.Generator) -> int:
    return int(rng.integers(1, int(rng.choice([70, 700, 4000])) + 1))


# ---------------------------------------------------------------------------- random rows


@needs_libstdcxx
@pytest.mark.parametrize("seed", range(8))
def test_random_tie_heavy_rows_match_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(500):
        n = _pick_n(rng)
        dtype = _FLOAT_DTYPES[int(rng.integers(len(_FLOAT_DTYPES)))]  # float32 twice as often
        x = torch.from_numpy(_row(rng, n)).to(dtype)
        _check(x, _pick_k(rng, n), largest=bool(rng.random() < 0.5), sorted=bool(rng.random() < 0.5))


@needs_libstdcxx
@pytest.mark.parametrize("k", [1, 2, 3, 5, 16])
def test_branch_threshold_neighbourhood(k: int) -> None:
    rng = np.random.default_rng(100 + k)
    for n in (64 * k - 1, 64 * k, 64 * k + 1):
        assert uses_partial_sort(n, k) == (k * 64 <= n)
        for _ in range(6):
            x = torch.from_numpy(_row(rng, n)).to(torch.bfloat16)
            for largest in (True, False):
                for sorted_ in (True, False):
                    _check(x, k, largest=largest, sorted=sorted_)


@needs_libstdcxx
@pytest.mark.parametrize("n,k", [(16384, 256), (16384, 257), (16384, 2048), (65536, 512), (65536, 1024), (65536, 1025)])
def test_large_rows(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    x = torch.from_numpy(rng.standard_normal(n)).to(torch.bfloat16)
    x[torch.from_numpy(rng.random(n) < 0.3)] = -INF
    x[::97] = 0.0
    _check(x, k, sorted=bool(k % 2))


@needs_libstdcxx
@pytest.mark.parametrize("n,k", [(2050, 2048), (16384, 512), (4096, 64)])
def test_rows_without_ties_match_torch(n: int, k: int) -> None:
    """Distinct keys: the emulation may skip std::sort's partitions (only one order exists)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    for largest in (True, False):
        for sorted_ in (True, False):
            _check(x, k, largest=largest, sorted=sorted_)


@needs_libstdcxx
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_integer_dtypes(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(7)
    info = torch.iinfo(dtype)
    for _ in range(60):
        n = int(rng.integers(1, 600))
        lo, hi = max(info.min, -3), min(info.max, 4)
        x = torch.from_numpy(rng.integers(lo, hi + 1, n)).to(dtype)
        x[torch.from_numpy(rng.random(n) < 0.05)] = info.min
        x[torch.from_numpy(rng.random(n) < 0.05)] = info.max
        _check(x, _pick_k(rng, n), largest=bool(rng.random() < 0.5), sorted=bool(rng.random() < 0.5))


# ---------------------------------------------------------------------------- layouts


@needs_libstdcxx
@pytest.mark.parametrize("n", [7, 100, 640, 1000])
def test_dims_batches_and_views(n: int) -> None:
    rng = np.random.default_rng(n)
    base = torch.from_numpy(np.stack([_row(rng, n) for _ in range(12)])).float()  # [12, n]
    cube = base.reshape(3, 4, n).permute(0, 2, 1)  # [3, n, 4], non-contiguous
    for k in sorted({1, 2, max(1, n // 64), n // 64 + 1, n // 2 + 1, n}):
        for largest in (True, False):
            _check(base, k, dim=-1, largest=largest)
            _check(base.t(), k, dim=0, largest=largest, sorted=False)
            _check(base.t().contiguous().t(), k, dim=1, largest=largest)
            _check(cube, k, dim=1, largest=largest, sorted=bool(k % 2))
            _check(cube.contiguous(), k, dim=-2, largest=largest)
            _check(cube.to(torch.bfloat16), k, dim=1, largest=largest)
    wide = torch.from_numpy(_row(rng, 2 * n)).float().reshape(1, 2 * n)[:, ::2]  # strided view
    _check(wide, max(1, n // 3), dim=1)
    small = base[:, :5].reshape(3, 4, 5)
    for dim in (0, 1, 2, -3):
        _check(small, 2, dim=dim, largest=bool(dim % 2))


# ---------------------------------------------------------------------------- antiqsort


@needs_libstdcxx
@pytest.mark.parametrize("target", ["select", "sort"])
def test_adversarial_rows_hit_both_heap_fallbacks(target: str) -> None:
    total = TopkStats()
    cases = [(n, k) for n in (40, 100, 300, 1000) for k in (2, n // 4 + 1, n // 2, n - 20, n - 1, n)]
    for i, (n, k) in enumerate(cases):
        largest = bool(i % 2)
        x = torch.tensor(antiqsort_values(n, k, largest, True, target), dtype=torch.float32)
        stats = TopkStats()
        ai = emulate_topk(x, k, largest=largest, stats=stats)[1]
        assert torch.equal(ai, torch.topk(x, k, largest=largest).indices), (target, n, k)
        for tie_step in (2, 5):  # tie-heavy near-adversarial variants
            xt = torch.tensor(antiqsort_values(n, k, largest, True, target, tie_step), dtype=torch.bfloat16)
            _check(xt, k, largest=largest)
        for f in ("introselect_heap_fallbacks", "introsort_heap_fallbacks"):
            setattr(total, f, getattr(total, f) + getattr(stats, f))
    if target == "select":
        assert total.introselect_heap_fallbacks >= 12, total
    else:
        assert total.introsort_heap_fallbacks >= 8, total


def test_adversary_replays_its_own_run() -> None:
    """The frozen values reproduce the adversarial run's comparisons (same stats, same ids)."""
    for target in ("select", "sort"):
        played = TopkStats()
        keys = antiqsort_keys(500, 250, True, target, played)
        replay = TopkStats()
        order_from_keys(keys, 250, True, replay)
        assert replay == played
        assert played.introselect_heap_fallbacks + played.introsort_heap_fallbacks >= 1


def test_random_rows_do_not_reach_fallbacks_but_adversary_does() -> None:
    stats = TopkStats()
    order_from_keys(np.random.default_rng(0).standard_normal(5000).tolist(), 2000, True, stats)
    assert stats.introselect_heap_fallbacks == stats.introsort_heap_fallbacks == 0
    assert stats.partitions > 0 and stats.partial_sort_rows == 0


# ---------------------------------------------------------------------------- documented examples


def _ids(x: torch.Tensor, k: int, **kw) -> list[int]:
    return emulate_topk(x, k, **kw)[1].tolist()


def test_documented_examples() -> None:
    """docs/topk-tie-order.md §3 and v41-reference.md §7, as recorded from torch 2.13 CPU."""
    assert _ids(torch.full((1000,), -INF), 16) == [
        664,
        671,
        670,
        669,
        668,
        667,
        666,
        665,
        660,
        657,
        658,
        659,
        662,
        663,
        672,
        661,
    ]
    assert _ids(torch.full((640,), -INF), 10) == [8, 9, 4, 7, 5, 3, 1, 0, 2, 6]
    x = torch.full((1000,), -INF)
    x[[3, 500, 999]] = 0.0
    assert _ids(x, 5) == [999, 3, 500, 1, 4]
    y = torch.tensor([1.0, NAN, 2.0, NAN, INF])
    assert _ids(y, 3) == [1, 3, 4]
    assert _ids(y, 3, largest=False) == [0, 2, 4]
    assert sorted(_ids(torch.zeros(20, dtype=torch.bfloat16), 4)) == [12, 13, 14, 15]
    assert sorted(_ids(torch.zeros(300, dtype=torch.bfloat16), 4)) == [0, 1, 2, 3]


@needs_libstdcxx
def test_documented_examples_match_torch() -> None:
    x = torch.full((1000,), -INF)
    x[[3, 500, 999]] = 0.0
    for t, k in (
        (torch.full((1000,), -INF), 16),
        (torch.full((640,), -INF), 10),
        (x, 5),
        (torch.zeros(20, dtype=torch.bfloat16), 4),
        (torch.zeros(300, dtype=torch.bfloat16), 4),
    ):
        _check(t, k)
    y = torch.tensor([1.0, NAN, 2.0, NAN, INF])
    _check(y, 3)
    _check(y, 3, largest=False)


# ---------------------------------------------------------------------------- edge cases


def test_signed_zero_and_nan_values_come_back_as_torch_writes_them() -> None:
    x = torch.tensor([-0.0, 0.0, -0.0, 1.0])
    v, i = emulate_topk(x, 3, largest=False)
    assert torch.equal(v.view(torch.int32), x[i].view(torch.int32))  # each keeps its own sign
    b = torch.tensor([0x7FC1, -0x0040, 0x3F80], dtype=torch.int16).view(torch.bfloat16)  # NaNs
    v, _ = emulate_topk(b, 3)
    assert v.view(torch.int16).tolist() == [0x7FC0, 0x7FC0, 0x3F80]  # float->bf16 canonical NaN


def test_shapes_k_zero_n_one_and_zero_dim() -> None:
    v, i = emulate_topk(torch.ones(3, 5, 2), 0, dim=1)
    assert v.shape == i.shape == (3, 0, 2) and i.dtype == torch.int64
    v, i = emulate_topk(torch.ones(4, 0), 0)
    assert v.shape == i.shape == (4, 0)
    v, i = emulate_topk(torch.tensor([NAN]), 1)
    assert i.tolist() == [0] and math.isnan(v.item())
    for k in (0, 1):  # 0-dim: value copied, index 0, whatever k in {0, 1}
        v, i = emulate_topk(torch.tensor(2.5), k)
        assert v.shape == i.shape == () and v.item() == 2.5 and i.item() == 0
    assert uses_partial_sort(64, 1) and not uses_partial_sort(63, 1) and not uses_partial_sort(5, 5)


@pytest.mark.parametrize("topk", [emulate_topk, torch_cpu_topk])
@pytest.mark.parametrize("shape,k", [((5,), 6), ((5,), -1), ((), 2), ((2, 3), 4)])
def test_k_out_of_range_raises_like_torch(topk, shape: tuple[int, ...], k: int) -> None:
    x = torch.zeros(shape)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.topk(x, k)
    with pytest.raises(ValueError, match=rf"k={k}.*n=\d"):
        topk(x, k)


@pytest.mark.parametrize("topk", [emulate_topk, torch_cpu_topk])
def test_unsupported_dtype_and_dim_errors(topk) -> None:
    with pytest.raises(TypeError, match="bool"):
        topk(torch.ones(3, dtype=torch.bool), 1)
    with pytest.raises(IndexError, match="dim=2"):
        topk(torch.ones(3, 4), 1, dim=2)


# ---------------------------------------------------------------------------- array path vs list path


def _key_row(rng: np.random.Generator, n: int) -> np.ndarray:
    """float64 keys [n], NaN-free as make_keys leaves them, tie-heavy in different ways."""
    kind = int(rng.integers(6))
    if kind == 0:
        return rng.integers(0, int(rng.integers(1, 5)), n).astype(np.float64)
    if kind == 1:
        return rng.integers(0, int(rng.integers(2, 300)), n).astype(np.float64)
    if kind == 2:
        return rng.standard_normal(n)  # no ties at all
    if kind == 3:
        return np.zeros(n)  # one long tie
    if kind == 4:
        return rng.choice([-INF, -0.0, 0.0, 1.5, INF], n)
    x = torch.from_numpy(rng.standard_normal(n)).to(torch.bfloat16).double().numpy()
    x[rng.random(n) < 1 / 3] = INF  # masked scores (keys are -v for largest)
    return x


@pytest.mark.parametrize("small_ranges", [False, True])
def test_array_path_equals_list_path(small_ranges: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same indices and counts; without stats (shortcuts allowed) the same indices again.

    With small_ranges, numpy partitions and the heap's chunked scan also run on tiny ranges."""
    if small_ranges:
        monkeypatch.setattr(topk_module, "_NUMPY_MIN_RANGE", 4)
        monkeypatch.setattr(topk_module, "_OFFER_FIRST_CHUNK", 1)
    rng = np.random.default_rng(31 + small_ranges)
    for _ in range(300):
        n = int(rng.integers(1, int(rng.choice([70, 700, 2000])) + 1))
        keys, k, sorted_ = _key_row(rng, n), _pick_k(rng, n), bool(rng.random() < 0.5)
        want_stats, got_stats = TopkStats(), TopkStats()
        want = order_from_keys(keys.tolist(), k, sorted_, want_stats)
        assert order_from_keys(keys, k, sorted_, got_stats) == want, (n, k, sorted_)
        assert got_stats == want_stats, (n, k, sorted_)
        assert order_from_keys(keys, k, sorted_) == want, (n, k, sorted_)


@pytest.mark.parametrize("target", ["select", "sort"])
def test_array_path_replays_the_adversary(target: str) -> None:
    """Adversarial keys drive the array path into both heap fallbacks, with the same outcome."""
    for n, k in ((300, 76), (700, 350), (700, 680)):
        for tie_step in (1, 3):
            keys = [v // tie_step for v in antiqsort_keys(n, k, True, target)]
            want_stats, got_stats = TopkStats(), TopkStats()
            want = order_from_keys(keys, k, True, want_stats)
            assert order_from_keys(np.array(keys), k, True, got_stats) == want, (n, k, tie_step)
            assert got_stats == want_stats, (n, k, tie_step)


def test_heapq_heaps_move_like_libstdcxx_beyond_2500_entries() -> None:
    """CPython heapifies lists over 2,500 items in another (cache-friendly) order; the heap and
    the sorted range must still be libstdc++'s."""
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 40, 6000).astype(np.float64)
    K, I = keys.tolist(), list(range(6000))
    topk_module._heap_select(K, I, 0, 3000, 6000)
    Ka, Ia = keys.copy(), np.arange(6000)
    topk_module._heap_select_np(Ka, Ia, 0, 3000, 6000)
    assert Ia[:3000].tolist() == I[:3000]
    topk_module._sort_heap(K, I, 0, 3000)
    Kb, Ib = keys[:3000].copy(), np.arange(3000)
    topk_module._heap_sort_np(Kb, Ib, 0, 3000)
    K2, I2 = keys[:3000].tolist(), list(range(3000))
    topk_module._make_heap(K2, I2, 0, 3000)
    topk_module._sort_heap(K2, I2, 0, 3000)
    assert Ib.tolist() == I2


def test_order_from_keys_on_arrays_checks_its_keys() -> None:
    with pytest.raises(ValueError, match="NaN"):
        order_from_keys(np.array([1.0, NAN]), 1)
    assert order_from_keys(np.array([2**62, -(2**62), 5, 5]), 2) == order_from_keys([2**62, -(2**62), 5, 5], 2)


# ---------------------------------------------------------------------------- probe and dispatcher


def _stable_sort_topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """A top-k that keeps tied elements in index order: torch.topk as another platform might be."""
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def _tie_heavy_row(n: int, seed: int) -> torch.Tensor:
    """bf16 [n] as on the indexer path: Gaussian scores, a third -inf, an eighth exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(torch.bfloat16)
    x[torch.rand(n, generator=g) < 1 / 3] = -INF
    x[torch.rand(n, generator=g) < 1 / 8] = 0.0
    return x


def _same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[1], b[1]) and torch.equal(_bits(a[0]), _bits(b[0])) and a[0].dtype == b[0].dtype


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch):
    """No CONFORMANCE_TOPK, and a probe verdict taken afresh here and again after the test."""
    monkeypatch.delenv(TOPK_MODE_ENV, raising=False)
    torch_topk_matches.cache_clear()
    yield
    monkeypatch.undo()
    torch_topk_matches.cache_clear()


def _spy_on_torch_topk(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype]:
    calls: list[torch.dtype] = []
    real = torch.topk

    def spy(x, *args, **kwargs):
        calls.append(x.dtype)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch, "topk", spy)
    return calls


@needs_libstdcxx
def test_probe_passes_with_this_torch(fresh_probe) -> None:
    assert torch_topk_matches()


def test_probe_rejects_a_topk_that_breaks_ties_otherwise() -> None:
    assert not probe_topk(emulate_topk, _stable_sort_topk)


@needs_libstdcxx
@pytest.mark.parametrize("n,k", [(4096, 64), (2050, 2048), (700, 300)])
def test_dispatcher_uses_torch_topk_and_returns_the_emulations_result(
    n: int, k: int, fresh_probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert torch_topk_matches()
    calls = _spy_on_torch_topk(monkeypatch)
    x = _tie_heavy_row(n, seed=n + k)
    for values in (x, x.float(), torch.stack([x, x.flip(0)]).t()):
        for largest in (True, False):
            for sorted_ in (True, False):
                dim = 0 if values.dim() == 2 else -1
                got = torch_cpu_topk(values, k, dim=dim, largest=largest, sorted=sorted_)
                assert _same(got, emulate_topk(values, k, dim=dim, largest=largest, sorted=sorted_))
    assert len(calls) == 12  # every call went to torch.topk


def test_emulate_mode_forces_the_emulation(fresh_probe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOPK_MODE_ENV, "emulate")
    calls = _spy_on_torch_topk(monkeypatch)
    x = _tie_heavy_row(2050, seed=1)
    assert _same(torch_cpu_topk(x, 2048, sorted=False), emulate_topk(x, 2048, sorted=False))
    assert calls == [] and torch_topk_matches.cache_info().currsize == 0  # not even probed


def test_torch_mode_forces_torch_topk(fresh_probe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOPK_MODE_ENV, "torch")
    calls = _spy_on_torch_topk(monkeypatch)
    x = torch.tensor([3, 1, 3, 2], dtype=torch.int8)  # a dtype the probe does not cover
    values, indices = torch_cpu_topk(x, 2)
    assert calls == [torch.int8] and values.tolist() == [3, 3] and indices.dtype == torch.int64
    assert torch_topk_matches.cache_info().currsize == 0


def test_probe_failure_falls_back_to_the_emulation(fresh_probe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "topk", _stable_sort_topk)
    assert not torch_topk_matches()
    x = _tie_heavy_row(2050, seed=2)
    for k, sorted_ in ((2048, True), (2048, False), (32, True)):
        emulated = emulate_topk(x, k, sorted=sorted_)
        assert _same(torch_cpu_topk(x, k, sorted=sorted_), emulated)
        assert not _same(_stable_sort_topk(x, k, sorted=sorted_), emulated)  # a real difference


@needs_libstdcxx
def test_unprobed_inputs_and_stats_use_the_emulation(fresh_probe, monkeypatch: pytest.MonkeyPatch) -> None:
    assert torch.int8 not in PROBED_DTYPES and torch_topk_matches()
    calls = _spy_on_torch_topk(monkeypatch)
    x8 = torch.tensor([3, 1, 3, 2, 3], dtype=torch.int8)
    assert _same(torch_cpu_topk(x8, 2), emulate_topk(x8, 2))
    stats = TopkStats()
    torch_cpu_topk(torch.zeros(300), 200, stats=stats)  # counters exist only in the emulation
    assert calls == [] and stats.rows == 1 and stats.partitions > 0


def test_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOPK_MODE_ENV, "fast")
    with pytest.raises(ValueError, match="CONFORMANCE_TOPK='fast'"):
        torch_cpu_topk(torch.zeros(3), 1)
