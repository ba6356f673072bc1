"""Spaces of the numeric building blocks: quantisers, linears, norm, RoPE, kv.finish, cache bytes, topology.

Each draw samples what a case file could hold for its component (harness/components/numeric.py,
rope.py, kv.py, topology.py), keeping to what the builders and references accept: last dims in
whole quantiser blocks, K in 32-blocks for linear.fp8, head dims in 16/32-blocks that hold the
rope dims for kv.finish, values that stay finite in bf16. Sizes are log-uniform (small shapes
common, production-size ones occasional) under a per-component element budget, so a typical draw
costs well under 0.3 s of reference time; `cost` estimates build_golden seconds (measured on the
CPU reference: input generation plus the reference itself).
"""

from __future__ import annotations

import math
import random
from typing import Any

from ..space import Spec, Space, log_int, register_space

# --- shared helpers -----------------------------------------------------------------------------


def _pick(rng: random.Random, weighted: list[tuple[float, object]]):
    """One value from (weight, value) pairs."""
    total = sum(w for w, _ in weighted)
    x = rng.uniform(0.0, total)
    for w, value in weighted:
        x -= w
        if x <= 0:
            return value
    return weighted[-1][1]


def _sig(value: float, digits: int = 4) -> float:
    """A float rounded to a few significant digits (readable in a case file)."""
    return float(f"{value:.{digits}g}")


def _pow2_scale(rng: random.Random, low: int, high: int) -> float:
    """2^e (e an integer in [low, high]), sometimes with a mantissa: magnitudes across binades."""
    e = rng.randint(low, high)
    if rng.random() < 0.3:
        return _sig(rng.uniform(1.0, 2.0) * 2.0**e)
    return float(2.0**e)


def _bf16_ulp(x: float) -> float:
    """The bf16 spacing at |x| (normal range)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def _leading(rng: random.Random, rank: int, last: int, budget: int, low: int = 1, high: int = 64) -> list[int]:
    """`rank - 1` leading dims (log-uniform), halved (largest first) until the shape fits `budget`."""
    dims = [log_int(rng, low, high) for _ in range(rank - 1)]
    while dims and math.prod(dims) * last > budget and max(dims) > 1:
        i = dims.index(max(dims))
        dims[i] //= 2
    return dims


# the positive float8_e4m3fn values: subnormals k * 2^-9, normals (1 + j/8) * 2^e up to 448
E4M3_VALUES = sorted(
    {k * 2.0**-9 for k in range(1, 8)}
    | {v for e in range(-6, 9) for j in range(8) if (v := (1 + j / 8) * 2.0**e) <= 448}
)
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


# --- quant.e2m1 ---------------------------------------------------------------------------------

E2M1_BUDGET = 1 << 20  # elements; the reference rounds ~16 M elements a second (one core)


def _e2m1(rng: random.Random) -> Spec:
    """midpoints (the fixed tie vector), or uniform / bf16-valued values in [-6, 6] of any shape:
    rank 0-4, dims 1..4096 (rarely an empty dim), up to 2^20 elements."""
    kind = _pick(rng, [(0.08, "midpoints"), (0.5, "uniform"), (0.42, "bf16")])
    if kind == "midpoints":
        return {}, {"kind": "midpoints"}
    rank = _pick(rng, [(0.03, 0), (0.35, 1), (0.35, 2), (0.17, 3), (0.1, 4)])
    if rank == 0:
        return {}, {"kind": kind, "shape": []}
    last = log_int(rng, 1, 4096 if rank > 1 else E2M1_BUDGET)
    shape = [*_leading(rng, rank, last, E2M1_BUDGET), last]
    if rng.random() < 0.03:
        shape[rng.randrange(rank)] = 0
    return {}, {"kind": kind, "shape": shape}


def _e2m1_cost(params: dict, build: dict) -> float:
    n = 52 if build.get("kind") == "midpoints" else math.prod(build.get("shape", [1]))
    return 0.0002 + n * 6e-8


register_space(
    Space(
        "quant.e2m1",
        _e2m1,
        _e2m1_cost,
        simple={"kind": "uniform"},
        note="kind midpoints|uniform|bf16; any shape, rank 0-4, dims up to 4096 (1-D up to 2^20), <= 2^20 elements, "
        "rare empty dims",
    )
)


# --- the three block quantisers -----------------------------------------------------------------


def _scaled_amax(rng: random.Random, fmt: str) -> float:
    """A block maximum where the quantiser's scale does something interesting."""
    if fmt == "fp4_e4m3":  # scale e4m3(amax / 6): floor 6*2^-9, subnormal below 6*2^-6, saturates above 2688
        choice = _pick(rng, [(2, "edge"), (2, "subnormal"), (1, "floor"), (1, "saturate"), (2, "random")])
        if choice == "edge":  # 6 x an e4m3 value or the midpoint to its neighbour, +- a bf16 ulp
            i = rng.randrange(len(E4M3_VALUES) - 1)
            v = 6 * (E4M3_VALUES[i] if rng.random() < 0.4 else (E4M3_VALUES[i] + E4M3_VALUES[i + 1]) / 2)
            return v + rng.choice([0.0, 0.0, 1.0, -1.0]) * _bf16_ulp(v)
        if choice == "subnormal":
            return _sig(rng.uniform(6 * 2.0**-9, 6 * 2.0**-6))
        if choice == "floor":
            return rng.choice([0.0, 0.001, 0.0117, 0.01171875, 0.0118, 1e-30])
        if choice == "saturate":
            return rng.choice([2688.0, 2700.0, 3000.0, 1e5, 1e30, 3e38])
        return _pow2_scale(rng, -20, 20)
    top, low_e, high_e = (6.0, -130, 125) if fmt == "fp4_e8m0" else (448.0, -40, 118)
    choice = _pick(rng, [(3, "pow2"), (1, "floor"), (2, "random")])
    if choice == "pow2":  # top * 2^k exactly, or one bf16 step either side of it
        v = top * 2.0 ** rng.randint(low_e, high_e)
        return v * rng.choice([1.0, 1.0, 1 + 2.0**-7, 1 - 2.0**-8])
    if choice == "floor":
        if fmt == "fp4_e8m0":
            return rng.choice([0.0, 6 * 2.0**-126, 6 * 2.0**-127, 1e-40, 6 * 2.0**-125])
        return rng.choice([0.0, 1e-4, 9e-5, 1.1e-4, 1e-7, 0.0448])
    return _pow2_scale(rng, -40, 40)


def _boundary_values(rng: random.Random, fmt: str) -> list[float]:
    """Values at (or a bf16 ulp beside) the rounding boundaries at scale 1, on the grid, and +-0."""
    out = []
    for _ in range(log_int(rng, 1, 48)):
        r = rng.random()
        if fmt == "fp8_ue8m0":
            i = rng.randrange(len(E4M3_VALUES) - 1)
            mid = (E4M3_VALUES[i] + E4M3_VALUES[i + 1]) / 2
            if r < 0.15:
                v = rng.choice([0.0, -0.0, E4M3_VALUES[i], 2.0**-10, 448.0])
            elif r < 0.7:
                v = mid
            else:
                v = mid + rng.choice([1.0, -1.0]) * _bf16_ulp(mid)
        else:
            if r < 0.15:
                v = rng.choice([*E2M1_GRID, -0.0])
            elif r < 0.7:
                v = rng.choice(E2M1_MIDPOINTS)
            else:
                m = rng.choice(E2M1_MIDPOINTS)
                v = m + rng.choice([1.0, -1.0]) * _bf16_ulp(m)
        out.append(-v if rng.random() < 0.5 else v)
    return out


def _quant_space(fmt: str, block: int, budget: int):
    def draw(rng: random.Random) -> Spec:
        """normal rows (row_scales across binades, zero rows), log-uniform magnitudes over the
        whole bf16 range, zero blocks, boundary values at scale 1, scaled blocks at the scale's
        edges (floors, subnormal or saturating scales, power-of-two steps); rank 1-4."""
        kind = _pick(
            rng, [(0.3, "normal"), (0.2, "log_uniform"), (0.15, "zero_blocks"), (0.15, "boundary"), (0.2, "scaled")]
        )
        last = block * log_int(rng, 1, 8192 // block)
        if kind == "boundary":  # the builder tiles the values over [shape[0], shape[-1]]: 2-D only
            rank = 2
        else:
            rank = _pick(rng, [(0.15, 1), (0.5, 2), (0.25, 3), (0.1, 4)])
        shape = [*_leading(rng, rank, last, budget), last]
        if rank > 1 and kind != "boundary" and rng.random() < 0.03:
            shape[0] = 0
        build = {"kind": kind, "shape": shape}
        if kind == "normal" and rng.random() < 0.6:
            build["row_scales"] = [
                0.0 if rng.random() < 0.15 else _pow2_scale(rng, -30, 30) for _ in range(log_int(rng, 1, 8))
            ]
        elif kind == "log_uniform" and rng.random() < 0.85:
            low = rng.randint(-140, 0)
            build["low_exp"] = low
            build["high_exp"] = min(127, low + log_int(rng, 1, 140))
        elif kind == "boundary":
            build["values"] = _boundary_values(rng, fmt)
        elif kind == "scaled":
            amax = [_scaled_amax(rng, fmt) for _ in range(log_int(rng, 1, 16))]
            build["amax"] = [-a if rng.random() < 0.1 else a for a in amax]
        return {}, build

    return draw


def _quant_cost(per_element: float):
    def cost(params: dict, build: dict) -> float:
        return 0.0004 + math.prod(build.get("shape", [1])) * per_element

    return cost


for _component, _fmt, _block, _budget, _rate in (
    ("quant.fp4_e4m3", "fp4_e4m3", 16, 1 << 20, 7e-8),
    ("quant.fp4_e8m0", "fp4_e8m0", 32, 1 << 20, 8.5e-8),
    ("quant.fp8_ue8m0", "fp8_ue8m0", 32, 1 << 21, 5.5e-8),
):
    register_space(
        Space(
            _component,
            _quant_space(_fmt, _block, _budget),
            _quant_cost(_rate),
            simple={"kind": "normal"},
            note=f"kind normal|log_uniform|zero_blocks|boundary|scaled; rank 1-4 (boundary 2-D), last dim {_block}.."
            f"8192 in blocks of {_block}, leading dims up to 64, <= 2^{_budget.bit_length() - 1} elements; "
            "row scales 2^-30..2^30 and 0, exponents -140..127, amax at scale floors/steps/saturation",
        )
    )


# --- linear.f32 ---------------------------------------------------------------------------------


def _linear_f32(rng: random.Random) -> Spec:
    """m 1-64, k 1-8192, n 1-4096 (log-uniform; production compressor 5120 -> 512/1024 at times),
    bf16-valued or true fp32 operands, x and w scales across binades."""
    m = log_int(rng, 1, 64)
    if rng.random() < 0.1:
        k, n = 5120, rng.choice([512, 1024])  # production wkv / wkv+wgate on the fp32 input
    else:
        k, n = log_int(rng, 1, 8192), log_int(rng, 1, 4096)
    while n * k > (1 << 22) and n > 1:
        n //= 2
    build: dict[str, Any] = {"mkn": [m, k, n]}
    if rng.random() < 0.3:
        build["bf16_valued"] = False
    if rng.random() < 0.3:
        build["x_scale"] = _pow2_scale(rng, -20, 20)
    if rng.random() < 0.2:
        build["w_scale"] = _pow2_scale(rng, -20, 4)
    return {}, build


def _linear_f32_cost(params: dict, build: dict) -> float:
    m, k, n = build["mkn"]
    return 0.0002 + 3.3e-8 * (n * k + m * k) + 5e-11 * m * k * n


register_space(
    Space(
        "linear.f32",
        _linear_f32,
        _linear_f32_cost,
        simple={"bf16_valued": True, "x_scale": 1.0},
        note="mkn m 1-64, k 1-8192, n 1-4096 (n*k <= 2^22; production 5120 -> 512/1024), bf16-valued or fp32, "
        "x_scale 2^-20..2^20, w_scale 2^-20..2^4",
    )
)


# --- norm.rms -----------------------------------------------------------------------------------


def _norm_rms_top_exponent(d: int) -> int:
    """The largest row scale 2^e whose squares upstream can sum in fp32: RMSNorm's mean of x^2
    (M:281-293) overflows to inf above about 2^128, and upstream then returns zeros, so rows past
    that are outside the domain where upstream's own arithmetic defines the answer. Normal rows of
    scale 2^e sum to about d 2^(2e): keep d 2^(2e) <= 2^112 (16 bits of headroom for the tail)."""
    return min(60, (112 - max(d, 1).bit_length()) // 2)


def _norm_rms(rng: random.Random) -> Spec:
    """[m, d] with m 1-256, d 1-8192 (production 128/512/1280/5120 at times), bf16 or fp32 input,
    rows scaled 2^-60 (where eps matters) up to where upstream's fp32 sum of squares stays finite
    (`_norm_rms_top_exponent`), zero rows, eps 1e-20 or larger."""
    if rng.random() < 0.2:
        d = rng.choice([128, 512, 1280, 5120])
    else:
        d = log_int(rng, 1, 8192)
    m = log_int(rng, 1, 256)
    while m * d > (1 << 20) and m > 1:
        m //= 2
    build: dict[str, Any] = {"shape": [m, d]}
    if rng.random() < 0.3:
        build["dtype"] = "f32"
    if rng.random() < 0.5:
        top = _norm_rms_top_exponent(d)
        build["row_scales"] = [_pow2_scale(rng, -60, top) for _ in range(log_int(rng, 1, 6))]
    if rng.random() < 0.2:
        build["zero_row"] = True
    params = {}
    if rng.random() < 0.25:
        params["eps"] = rng.choice([1e-6, 1e-5, 1e-12, 1e-30])
    return params, build


def _norm_rms_cost(params: dict, build: dict) -> float:
    return 0.0002 + 2e-8 * math.prod(build["shape"])


def _norm_rms_contains(params: dict, build: dict) -> bool:
    d = int(build["shape"][-1])
    return all(abs(float(s)) < 2.0 ** (_norm_rms_top_exponent(d) + 1) for s in build.get("row_scales", [1.0]))


register_space(
    Space(
        "norm.rms",
        _norm_rms,
        _norm_rms_cost,
        simple={"dtype": "bf16", "zero_row": False, "eps": 1e-20},
        contains=_norm_rms_contains,
        note="[m, d] m 1-256, d 1-8192 (<= 2^20 elements), bf16|f32, row_scales 2^-60..2^(56 - log2(d)/2) (upstream's "
        "fp32 sum of squares finite), zero_row, eps 1e-30..1e-5",
    )
)


# --- linear.fp8 ---------------------------------------------------------------------------------

# wq_a 5120 -> 1280, the indexer's wq_b 1280 -> 4096, wkv 5120 -> 512 (wq_b 1280 -> 32768 and wo_b
# 8192 -> 5120 cost 1.5-2 s of reference time: over the fuzzer's cap)
FP8_PRODUCTION = ((5120, 1280), (1280, 4096), (5120, 512))


def _linear_fp8(rng: random.Random) -> Spec:
    """M 1-64, K 32-8192 in blocks of 32, N 1-8192 (ragged last tile row), the production Linears
    at times; normal, zero/tiny blocks, saturating block maxima; x and w scales."""
    m = log_int(rng, 1, 64)
    if rng.random() < 0.1:
        k, n = rng.choice(FP8_PRODUCTION)
        m = min(m, 4)
    else:
        k, n = 32 * log_int(rng, 1, 256), log_int(rng, 1, 8192)
        while n * k > (1 << 22) and n > 1:
            n //= 2
        while m * n * k > (1 << 25) and m > 1:
            m //= 2
    build = {"mkn": [m, k, n], "kind": _pick(rng, [(0.5, "normal"), (0.25, "zero_tiny"), (0.25, "saturating")])}
    if rng.random() < 0.25:
        build["x_scale"] = _pow2_scale(rng, -20, 20)
    if rng.random() < 0.2:
        build["w_scale"] = _pow2_scale(rng, -20, 2)
    return {}, build


def _linear_fp8_cost(params: dict, build: dict) -> float:
    m, k, n = build["mkn"]
    return 0.0005 + 4.5e-8 * n * k + (k // 32) * (5e-5 + 3.5e-9 * m * n)


register_space(
    Space(
        "linear.fp8",
        _linear_fp8,
        _linear_fp8_cost,
        simple={"kind": "normal", "x_scale": 1.0},
        note="mkn M 1-64, K 32-8192 (x32), N 1-8192 any (n*k <= 2^22; production wq_a, indexer wq_b, wkv), "
        "kind normal|zero_tiny|saturating, x_scale 2^-20..2^20, w_scale",
    )
)


# --- rope.yarn_table and rope.apply -------------------------------------------------------------


def _table_params(rng: random.Random) -> dict:
    """base, and YaRN (original_seq_len, factor, beta_fast, beta_slow) on or off."""
    out = {}
    if rng.random() < 0.6:
        out["base"] = rng.choice([10000.0, 160000.0])
    else:
        out["base"] = _sig(10 ** rng.uniform(2.0, 7.0))
    yarn = _pick(rng, [(0.3, "off"), (0.35, "production"), (0.35, "random")])
    if yarn == "off":
        if rng.random() < 0.5:
            out["original_seq_len"] = 0
        return out
    if yarn == "production":
        out.update(original_seq_len=rng.choice([65536, 4096, 32768]), factor=16.0)
        if rng.random() < 0.5:
            out.update(beta_fast=32.0, beta_slow=1.0)
        return out
    out["original_seq_len"] = log_int(rng, 2, 1 << 20)
    if rng.random() < 0.7:
        out["factor"] = _sig(rng.choice([2.0, 4.0, 8.0, 16.0, 32.0, 40.0, rng.uniform(1.0, 64.0)]))
    if rng.random() < 0.6:
        out["beta_fast"] = rng.choice([32.0, 16.0, 64.0, 8.0, _sig(rng.uniform(2.0, 128.0))])
    if rng.random() < 0.6:
        out["beta_slow"] = rng.choice([1.0, 0.5, 2.0, _sig(rng.uniform(0.1, 4.0))])
    return out


def _position(rng: random.Random, top: int) -> int:
    r = rng.random()
    if r < 0.3:
        return rng.randint(0, 64)
    if r < 0.6:  # a power of two, or one either side of it
        return max(0, min(top, 2 ** rng.randint(1, top.bit_length() - 1) + rng.choice([-1, 0, 1])))
    return log_int(rng, 1, top)


def _yarn_table(rng: random.Random) -> Spec:
    """dim 2-512 even (production 64, tiny 32), base 10^2..10^7, YaRN off, production or random
    (original_seq_len 2..2^20, factor 1-64, betas); 0-64 positions up to 2^24, any order."""
    dim = rng.choice([32, 64]) if rng.random() < 0.4 else 2 * log_int(rng, 1, 256)
    params = {"dim": dim, **_table_params(rng)}
    top = 1 << rng.choice([12, 16, 20, 24])
    positions = [_position(rng, top) for _ in range(0 if rng.random() < 0.03 else log_int(rng, 1, 64))]
    if rng.random() < 0.6:
        positions.sort()
    return params, {"positions": positions}


register_space(
    Space(
        "rope.yarn_table",
        _yarn_table,
        lambda params, build: 0.00015 + 2e-8 * len(build["positions"]) * params["dim"],
        simple={"original_seq_len": 0, "base": 10000.0},
        note="dim 2-512 even, base 1e2..1e7, YaRN off|production|random (osl 2..2^20, factor 1-64, betas), "
        "0-64 positions up to 2^24",
    )
)


def _rope_apply(rng: random.Random) -> Spec:
    """[b, S, d] or [b, S, h, d]: b 1-3 (at times up to 8), S 1-128, h 1-64, rope_dim 2-256 even
    (production 64, tiny 32) within d, which may hold extra (odd) leading channels; start 0 to
    2^20 (the table is built up to start + S), inverse, x scales; any table parameters."""
    rope_dim = rng.choice([32, 64]) if rng.random() < 0.5 else 2 * log_int(rng, 1, 128)
    extra = _pick(rng, [(0.25, 0), (0.45, "mult"), (0.3, "any")])
    if extra == "mult":
        d = max(rope_dim, rng.choice([64, 128, 192, 512]))
    elif extra == "any":
        d = rope_dim + log_int(rng, 1, 512)
    else:
        d = rope_dim
    b = rng.randint(1, 3) if rng.random() < 0.9 else log_int(rng, 4, 8)
    s = log_int(rng, 1, 128)
    heads = rng.random() < 0.6
    h = log_int(rng, 1, 64) if heads else 1
    while b * s * h * d > (1 << 20):
        if h > 1:
            h //= 2
        elif s > 1:
            s //= 2
        else:
            b = max(1, b // 2)
            if b == 1:
                break
    shape = [b, s, h, d] if heads else [b, s, d]
    start = 0 if rng.random() < 0.3 else log_int(rng, 1, min(1 << 20, (1 << 22) // (rope_dim // 2)))
    params = {"rope_dim": rope_dim}
    if rng.random() < 0.3:
        params["inverse"] = True
    build = {"shape": shape, "start": start, **_table_params(rng)}
    if rng.random() < 0.25:
        build["scale"] = _pow2_scale(rng, -30, 30)
    return params, build


def _rope_apply_cost(params: dict, build: dict) -> float:
    half = params["rope_dim"] // 2
    rows = build.get("start", 0) + build["shape"][1]
    return 0.0002 + 5e-8 * rows * half + 3e-8 * math.prod(build["shape"])


register_space(
    Space(
        "rope.apply",
        _rope_apply,
        _rope_apply_cost,
        simple={"inverse": False, "start": 0, "original_seq_len": 0, "scale": 1.0},
        note="3-D/4-D x, b 1-8, S 1-128, h 1-64, rope_dim 2-256 <= d (extra channels, odd d), start 0..2^20, "
        "inverse, x scale 2^-30..2^30, any YaRN table",
    )
)


# --- kv.finish ----------------------------------------------------------------------------------


def _kv_finish(rng: random.Random) -> Spec:
    """ratio 1|2, rope_dim 2-128 even (production 64, tiny 32), head_dim 16-1024 in blocks of 16
    and index_head_dim 32-512 in blocks of 32 (both >= rope_dim), batch 1-3 (at times 4), 0-64
    groups: a prefill's contiguous run or scattered rows up to j = 2^17 (a table of <= 2^22
    angles); row scales across the e4m3 scale range (subnormal, saturating); eps."""
    preset = _pick(rng, [(0.2, "tiny"), (0.15, "production"), (0.65, "random")])
    if preset == "tiny":
        rope, hd, ihd = 32, 128, 64
    elif preset == "production":
        rope, hd, ihd = 64, 512, 128
    else:
        rope = 2 * log_int(rng, 1, 64)
        hd = 16 * log_int(rng, -(-rope // 16), 64)
        ihd = 32 * log_int(rng, -(-rope // 32), 16)
    ratio = rng.choice([1, 2])
    g = 0 if rng.random() < 0.06 else log_int(rng, 1, 64)
    # groups lie in [0, top); the table the builder makes covers (top * ratio) positions
    top = log_int(rng, max(g, 1), min(1 << rng.choice([6, 10, 14, 17]), (1 << 22) // (ratio * (rope // 2))))
    if g and rng.random() < 0.4:  # the rows a prefill (or chunk) completes: contiguous
        first = rng.randint(0, top - g)
        groups = list(range(first, first + g))
    else:
        groups = sorted(rng.sample(range(top), g))
    build = {
        "head_dim": hd,
        "index_head_dim": ihd,
        "batch": rng.randint(1, 3) if rng.random() < 0.9 else 4,
        "groups": groups,
    }
    if rng.random() < 0.4:
        build["row_scales"] = [
            rng.choice([1.0, 0.001, 0.01, 40.0, 1000.0, _pow2_scale(rng, -24, 12)]) for _ in range(log_int(rng, 1, 6))
        ]
    params: dict[str, Any] = {"ratio": ratio, "rope_dim": rope}
    if rng.random() < 0.2:
        params["eps"] = rng.choice([1e-6, 1e-12, 1e-20])
    return params, build


def _kv_finish_cost(params: dict, build: dict) -> float:
    groups = build["groups"]
    positions = ((max(groups) + 1) if groups else 1) * int(params.get("ratio", 2))
    rows = build["batch"] * len(groups)
    gemm = 2.5e-10 * build["head_dim"] * build["index_head_dim"] + 1e-5  # per row: wk, k_norm, quantisers
    return 0.0015 + 5e-8 * positions * (params["rope_dim"] // 2) + rows * gemm


register_space(
    Space(
        "kv.finish",
        _kv_finish,
        _kv_finish_cost,
        simple={"ratio": 2, "batch": 1},
        note="ratio 1|2, rope 2-128, hd 16-1024 (x16), ihd 32-512 (x32), b 1-4, 0-64 groups (contiguous or "
        "scattered, j < 2^17), row_scales 2^-24..2^12, eps",
    )
)


# --- cache.bytes --------------------------------------------------------------------------------


def _cache_bytes(rng: random.Random) -> Spec:
    """head_dim 32-8192 and index_head_dim 32-1024 (multiples of 32, the fp8/fp4 scale blocks),
    ratio 1|2, block_positions 1-4096 (a multiple of the ratio), state_slots r + q_max - 1 or
    any 0-64 (ratio 1 keeps no state: usually 0)."""
    if rng.random() < 0.15:
        hd, ihd = rng.choice([(512, 128), (128, 64)])
    else:
        hd, ihd = 32 * log_int(rng, 1, 256), 32 * log_int(rng, 1, 32)
    ratio = rng.choice([1, 2])
    if rng.random() < 0.3:
        positions = rng.choice([32, 64, 128, 256])
    else:
        positions = ratio * log_int(rng, 1, 4096 // ratio)
    if ratio == 1:
        slots = 0 if rng.random() < 0.7 else log_int(rng, 1, 64)
    else:
        slots = ratio + log_int(rng, 1, 64) - 1 if rng.random() < 0.7 else rng.randint(0, 64)
    return {
        "head_dim": hd,
        "index_head_dim": ihd,
        "ratio": ratio,
        "block_positions": positions,
        "state_slots": slots,
    }, {}


register_space(
    Space(
        "cache.bytes",
        _cache_bytes,
        lambda params, build: 0.0002,
        simple={"ratio": 2},
        note="hd 32-8192, ihd 32-1024 (x32), ratio 1|2, block_positions 1-4096 (x ratio), state_slots 0-65",
    )
)


# --- topology.validate --------------------------------------------------------------------------


def _valid_topology(rng: random.Random, n: int, with_candidates: bool) -> dict[str, list[int]]:
    """Maps built layer by layer from the choices the rules leave: take no part, publish, or read
    the latest publisher before the layer (within the coarser map's segment)."""
    main, ik, ix, cand = [], [], [], []
    last = {"main": -1, "ik": -1, "ix": -1, "cand": -1}
    p_none, p_publish = rng.uniform(0.0, 0.4), rng.uniform(0.1, 0.5)

    def choose(options: list[int], l: int) -> int:
        weights = {-1: p_none, l: p_publish}
        return _pick(rng, [(weights.get(o, 1.0 - p_none - p_publish), o) for o in options])

    for l in range(n):
        opts = [-1, l] + ([last["main"]] if last["main"] >= 0 else [])
        main.append(choose(opts, l))
        opts = [-1]
        if main[l] >= 0:
            opts.append(l)
            if last["ik"] >= 0 and main[last["ik"]] == main[l]:
                opts.append(last["ik"])
        ik.append(choose(opts, l))
        opts = [-1]
        if ik[l] >= 0:
            opts.append(l)
            if last["ix"] >= 0 and ik[last["ix"]] == ik[l]:
                opts.append(last["ix"])
        ix.append(choose(opts, l))
        opts = [-1]
        if ix[l] == l and ik[l] >= 0:
            opts.append(l)
            if last["cand"] >= 0 and ik[last["cand"]] == ik[l]:
                opts.append(last["cand"])
        cand.append(choose(opts, l) if with_candidates else -1)
        for key, src in (("main", main), ("ik", ik), ("ix", ix), ("cand", cand)):
            if src[l] == l:
                last[key] = l
    out = {"main_kv": main, "index_k": ik, "index": ix}
    if with_candidates:
        out["candidate"] = cand
    return out


def _topology(rng: random.Random) -> Spec:
    """1-64 layers; valid topologies built from the rules' choices (segments, layers taking no part,
    candidates or none), and the same with one fault: an entry moved anywhere in [-2, L], a map
    shortened or lengthened, two entries swapped; at times a named config's derived maps."""
    if rng.random() < 0.06:
        return {"derived_from": rng.choice(["tiny-a", "production"])}, {}
    n = log_int(rng, 1, 64)
    maps = _valid_topology(rng, n, rng.random() < 0.5)
    if rng.random() < 0.5:  # a fault
        key = rng.choice(sorted(maps))
        src = maps[key]
        fault = _pick(rng, [(0.6, "entry"), (0.15, "length"), (0.15, "swap"), (0.1, "range")])
        if fault == "entry":
            src[rng.randrange(n)] = rng.randint(-1, n - 1)
        elif fault == "range":
            src[rng.randrange(n)] = rng.choice([-2, n, n + 3])
        elif fault == "swap" and n > 1:
            i, j = rng.sample(range(n), 2)
            src[i], src[j] = src[j], src[i]
        elif fault == "length":
            if src and rng.random() < 0.5:
                src.pop()
            else:
                src.append(rng.randint(-1, n - 1))
    return maps, {}


register_space(
    Space(
        "topology.validate",
        _topology,
        lambda params, build: 0.0001 + 2e-7 * len(params.get("main_kv", [0] * 64)) ** 2,
        note="1-64 layers, valid maps (segments, -1 layers, optional candidates) and one-fault variants "
        "(entry, length, swap, out of range), derived_from tiny-a|production",
    )
)
