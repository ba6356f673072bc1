"""Tests of v41_conformance.reference.numerics against hand-computed values and an independent slow
float64 formulation (docs/v41-reference.md §3.3, §6.1-6.2, Appendix B)."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from v41_conformance.reference import numerics as nm

F32 = torch.float32


def t32(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F32)


def bits16(x: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns, so that -0.0 != 0.0 and NaN == NaN in comparisons."""
    return x.contiguous().view(torch.int16)


def up(v: float) -> float:
    return torch.nextafter(t32(v), t32(math.inf)).item()


def down(v: float) -> float:
    return torch.nextafter(t32(v), t32(-math.inf)).item()


# ------------------------------------------------------------------------------------------
# e2m1
# ------------------------------------------------------------------------------------------

# every midpoint of the grid and its tie result (ties go to the even code index)
MIDPOINT_TIES = [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)]
# the two grid neighbours of each midpoint: (just below -> lower, just above -> upper)
MIDPOINT_NEIGHBOURS = [
    (0.25, 0.0, 0.5),
    (0.75, 0.5, 1.0),
    (1.25, 1.0, 1.5),
    (1.75, 1.5, 2.0),
    (2.5, 2.0, 3.0),
    (3.5, 3.0, 4.0),
    (5.0, 4.0, 6.0),
]


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("mid,expected", MIDPOINT_TIES)
def test_e2m1_round_midpoints_tie_to_even_code(mid: float, expected: float, sign: float) -> None:
    got = nm.e2m1_round(t32(sign * mid))
    assert got.item() == sign * expected
    assert torch.signbit(got).item() == (sign < 0)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("mid,lower,upper", MIDPOINT_NEIGHBOURS)
def test_e2m1_round_just_below_and_above_midpoints(mid: float, lower: float, upper: float, sign: float) -> None:
    got = nm.e2m1_round(t32(sign * down(mid), sign * up(mid)))
    assert got.tolist() == [sign * lower, sign * upper]


def test_e2m1_round_grid_points_zeros_and_saturation() -> None:
    grid = t32(*nm.E2M1_GRID)
    assert torch.equal(nm.e2m1_round(grid), grid)
    assert torch.equal(nm.e2m1_round(-grid), -grid)
    got = nm.e2m1_round(t32(0.0, -0.0, -0.1, 0.1, 5.5, -6.0, 6.0, 7.0))
    assert got.tolist() == [0.0, 0.0, -0.0, 0.0, 6.0, -6.0, 6.0, 6.0]
    assert torch.signbit(got).tolist() == [False, True, True, False, False, True, False, False]


def _e2m1_slow(v: float) -> float:
    """Nearest grid point in float64, ties to the even code index, sign kept."""
    mag = abs(v)
    best = min(range(8), key=lambda i: (abs(nm.E2M1_GRID[i] - mag), i % 2))
    return math.copysign(nm.E2M1_GRID[best], v)


def test_e2m1_round_matches_slow_nearest_even_on_dense_values() -> None:
    # a fine lattice over [-6, 6] that contains every midpoint, plus random fp32 values
    lattice = torch.arange(-6 * 64, 6 * 64 + 1, dtype=F32) / 64
    rand = (torch.rand(4000, generator=torch.Generator().manual_seed(0)) * 12 - 6).float()
    v = torch.cat([lattice, rand])
    expected = t32(*[_e2m1_slow(x) for x in v.tolist()])
    got = nm.e2m1_round(v)
    assert torch.equal(got, expected)
    assert torch.equal(torch.signbit(got), torch.signbit(expected))


def test_e2m1_encode_decode_all_codes() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    values = nm.e2m1_decode(codes)
    assert values[:8].tolist() == list(nm.E2M1_GRID)
    assert values[8:].tolist() == [-g for g in nm.E2M1_GRID]
    assert torch.signbit(values[8]).item()  # code 8 is -0.0
    assert torch.equal(nm.e2m1_encode(values), codes)
    assert nm.e2m1_encode(t32(-0.0, 0.0, 6.0, -1.5)).tolist() == [8, 0, 7, 11]


def test_e2m1_encode_rejects_off_grid_and_decode_rejects_wide_codes() -> None:
    with pytest.raises(ValueError, match="not an e2m1 value"):
        nm.e2m1_encode(t32(0.5, 2.5))
    with pytest.raises(ValueError, match="not an e2m1 value"):
        nm.e2m1_encode(t32(8.0))
    with pytest.raises(ValueError, match="4-bit"):
        nm.e2m1_decode(torch.tensor([16], dtype=torch.uint8))


def test_pack_nibbles_puts_even_element_low() -> None:
    codes = torch.tensor([[1, 2, 15, 8], [0, 7, 9, 0]], dtype=torch.uint8)
    assert nm.pack_nibbles(codes).tolist() == [[0x21, 0x8F], [0x70, 0x09]]
    with pytest.raises(ValueError, match="even last dim"):
        nm.pack_nibbles(torch.zeros(3, dtype=torch.uint8))


# ------------------------------------------------------------------------------------------
# pow2_ceil, e4m3_round, to_bf16
# ------------------------------------------------------------------------------------------


def test_pow2_ceil_exact_powers_map_to_themselves_and_one_ulp_above_doubles() -> None:
    powers = torch.tensor([2.0**e for e in range(-126, 128)], dtype=F32)
    assert torch.equal(nm.pow2_ceil(powers), powers)
    above = torch.nextafter(powers[:-1], t32(math.inf))
    assert torch.equal(nm.pow2_ceil(above), powers[1:])
    below = torch.nextafter(powers[1:], t32(0.0))
    assert torch.equal(nm.pow2_ceil(below), powers[1:])
    assert nm.pow2_ceil(t32(0.3, 1.5, 3.0, 1e-4)).tolist() == [0.5, 2.0, 4.0, 2.0**-13]


@pytest.mark.parametrize("bad", [0.0, -0.0, 2.0**-127, 1e-45, -1.0, math.inf, math.nan, 2.0**127 * 1.5])
def test_pow2_ceil_refuses_values_outside_the_normal_range(bad: float) -> None:
    with pytest.raises(ValueError, match="positive normal"):
        nm.pow2_ceil(t32(1.0, bad))


def test_e4m3_round_normals_subnormals_ties_and_saturation() -> None:
    s = 2.0**-9  # smallest subnormal
    x = t32(17.0, 19.0, 0.5 * s, 1.5 * s, 2.5 * s, 3 * s, 0.3, 448.0, 464.0, 1e6, -1e6, -0.0)
    # 17 ties between 16 and 18 -> 16 (even mantissa); 19 -> 20; 0.5s -> 0; 1.5s -> 2s; 2.5s -> 2s
    expected = [16.0, 20.0, 0.0, 2 * s, 2 * s, 3 * s, 0.3125, 448.0, 448.0, 448.0, -448.0, -0.0]
    assert nm.e4m3_round(x).tolist() == expected


def test_to_bf16_rounds_once_even_from_float64() -> None:
    x = torch.tensor(
        [1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-40), 1e-50, -1e-50, 1e300, math.inf, 3.0],
        dtype=torch.float64,
    )
    got = nm.to_bf16(x)
    assert got.dtype == torch.bfloat16
    assert got.float().tolist() == [1 + 2**-7, 1.0, 1 + 4 * 2**-8, -(1 + 2**-7), 0.0, -0.0, math.inf, math.inf, 3.0]
    assert torch.signbit(got[5]).item()
    assert torch.isnan(nm.to_bf16(torch.tensor([math.nan], dtype=torch.float64))).all()
    y = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(bits16(nm.to_bf16(y)), bits16(y.to(torch.bfloat16)))


def test_to_bf16_float64_matches_slow_rounding() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3000, generator=gen, dtype=torch.float64) * 2.0 ** torch.randint(-20, 20, (3000,), generator=gen)
    got = nm.to_bf16(x).double().tolist()
    for xv, g in zip(x.tolist(), got):
        m, e = math.frexp(abs(xv))  # |x| = m * 2^e, m in [0.5, 1): bf16 keeps 8 significant bits
        q = 2.0 ** (e - 8)
        assert g == math.copysign(round(abs(xv) / q) * q, xv)


# ------------------------------------------------------------------------------------------
# Quantisers: hand-computed blocks
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("zero", [0.0, -0.0])
def test_all_zero_blocks_use_the_floor_scales(zero: float) -> None:
    x = torch.full((2, 32), zero, dtype=torch.bfloat16)
    e4 = nm.fp4_qdq_e4m3(x)  # e4m3(0.01171875 / 6) = e4m3(2^-9): the smallest subnormal
    assert e4.scales.tolist() == [[2.0**-9] * 2] * 2 and e4.scale_bytes.tolist() == [[0x01] * 2] * 2
    e8 = nm.fp4_qdq_e8m0(x)  # pow2_ceil(6 * 2^-126 * fp32(1/6)) = 2^-126, byte 1
    assert e8.scales.tolist() == [[2.0**-126]] * 2 and e8.scale_bytes.tolist() == [[1]] * 2
    f8 = nm.fp8_qdq_ue8m0(x)  # pow2_ceil(fp32(1e-4) * fp32(1/448)) = 2^-22, byte 105
    assert f8.scales.tolist() == [[2.0**-22]] * 2 and f8.scale_bytes.tolist() == [[105]] * 2
    sign = 8 if math.copysign(1.0, zero) < 0 else 0
    for r in (e4, e8):
        assert (r.codes == sign).all() and torch.equal(bits16(r.y), bits16(x))
    assert (f8.codes == sign << 4).all() and torch.equal(bits16(f8.y), bits16(x))


def test_fp4_e4m3_block_by_hand() -> None:
    # amax 3.0 -> scale e4m3(0.5) = 0.5 (byte 0x30); v = x / 0.5; midpoints land on ties
    x = torch.tensor(
        [3.0, -3.0, 0.125, 0.375, 0.625, 0.875, 1.25, 1.75, -2.5, 0.0, -0.0, 0.1, 0.25, 0.5, 1.0, 2.0],
        dtype=torch.bfloat16,
    )
    r = nm.fp4_qdq_e4m3(x)
    assert r.scales.tolist() == [0.5] and r.scale_bytes.tolist() == [0x30]
    # v:        6, -6, .25, .75, 1.25, 1.75, 2.5, 3.5, -5, 0, -0, .2, .5, 1, 2, 4
    assert r.y.float().tolist() == [3.0, -3.0, 0.0, 0.5, 0.5, 1.0, 1.0, 2.0, -2.0, 0.0, -0.0, 0.0, 0.25, 0.5, 1.0, 2.0]
    assert r.codes.tolist() == [7, 15, 0, 2, 2, 4, 4, 6, 14, 0, 8, 0, 1, 2, 4, 6]


def test_fp4_e4m3_scale_is_not_a_power_of_two_and_subnormal_scales() -> None:
    # amax 1.0: 1/6 = 0.1666.. -> e4m3 0.171875 (1.375 * 2^-3, byte 0 0100 011); v = 5.818 -> 6
    # amax 0.03: 0.005 -> subnormal 3 * 2^-9 (byte 0x03); amax 0.02: 0.00333 -> 2 * 2^-9 (0x02)
    x = torch.zeros(3, 16, dtype=torch.bfloat16)
    x[0, 0], x[1, 5], x[2, 9] = 1.0, -0.03, 0.02
    r = nm.fp4_qdq_e4m3(x)
    assert r.scales[:, 0].tolist() == [0.171875, 3 * 2.0**-9, 2 * 2.0**-9]
    assert r.scale_bytes[:, 0].tolist() == [0x23, 0x03, 0x02]
    assert r.y[0, 0].item() == 6 * 0.171875
    assert r.y[1, 5].item() == -6 * 3 * 2.0**-9 and r.codes[1, 5].item() == 15
    assert r.y[2, 9].item() == 6 * 2 * 2.0**-9


def test_fp4_e4m3_scale_saturates_at_448() -> None:
    x = torch.zeros(16, dtype=torch.bfloat16)
    x[3] = 3008.0  # 3008 / 6 > 448: scale 448 (byte 0x7E); v = 6.7 -> clamped to 6
    r = nm.fp4_qdq_e4m3(x)
    assert r.scales.tolist() == [448.0] and r.scale_bytes.tolist() == [0x7E]
    assert r.y[3].item() == 2688.0 and r.codes[3].item() == 7


def test_fp4_e8m0_pow2_scale_at_and_just_above_powers() -> None:
    # amax 6: 6 * fp32(1/6) rounds to exactly 1.0 -> scale 1; the next bf16 up, 6.0625 -> scale 2
    # amax 3: -> 0.5; 3.015625 -> 1
    x = torch.zeros(4, 32, dtype=torch.bfloat16)
    x[0, 0], x[1, 0], x[2, 0], x[3, 0] = 6.0, 6.0625, -3.0, 3.015625
    x[:, 1] = 1.25
    r = nm.fp4_qdq_e8m0(x)
    assert r.scales[:, 0].tolist() == [1.0, 2.0, 0.5, 1.0]
    assert r.scale_bytes[:, 0].tolist() == [127, 128, 126, 127]
    assert r.y[:, 0].float().tolist() == [6.0, 6.0, -3.0, 3.0]
    assert r.codes[:, 0].tolist() == [7, 5, 15, 5]
    # 1.25 / 1 -> 1.25 tie -> 1; 1.25 / 2 = .625 -> .5 -> 1.0; 1.25 / .5 = 2.5 tie -> 2 -> 1.0
    assert r.y[:, 1].float().tolist() == [1.0, 1.0, 1.0, 1.0]


def test_fp8_ue8m0_pow2_scale_at_and_just_above_448() -> None:
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    x[0, 0], x[1, 0] = 448.0, 450.0  # 448 * fp32(1/448) rounds to 1.0 -> scale 1; 450 -> scale 2
    x[:, 1] = 17.0  # 17 / 1 ties between 16 and 18 -> 16; 17 / 2 = 8.5 ties 8 / 9 -> 8 -> 16
    x[:, 2] = -0.0
    r = nm.fp8_qdq_ue8m0(x)
    assert r.scales[:, 0].tolist() == [1.0, 2.0] and r.scale_bytes[:, 0].tolist() == [127, 128]
    assert r.y[:, :3].float().tolist() == [[448.0, 16.0, -0.0], [448.0, 16.0, -0.0]]
    assert r.codes[0, :3].tolist() == [0x7E, 0x58, 0x80]  # e4m3fn bits of 448, 16, -0
    assert r.codes[1, :3].tolist() == [0x76, 0x50, 0x80]  # 224 (0 1110 110), 8, -0


def test_top_codes_for_the_block_max() -> None:
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 128, generator=gen) * 2.0 ** torch.randint(-5, 8, (64, 1), generator=gen)).bfloat16()
    # E4M3 with normal scales (amax >= 6 * 2^-6): the block max always lands on code 7 (|v| = 6)
    r = nm.fp4_qdq_e4m3(x)
    amax_idx = x.float().abs().unflatten(-1, (-1, 16)).argmax(-1, keepdim=True)
    top = r.codes.unflatten(-1, (-1, 16)).gather(-1, amax_idx) & 7
    assert (top == 7).all()
    # E8M0: |v| of the block max in (3, 6] -> magnitude code 5, 6 or 7
    r = nm.fp4_qdq_e8m0(x)
    amax_idx = x.float().abs().unflatten(-1, (-1, 32)).argmax(-1, keepdim=True)
    top = r.codes.unflatten(-1, (-1, 32)).gather(-1, amax_idx) & 7
    assert (top >= 5).all()
    # fp8: x/s of the block max is in (224, 448], which rounds into [224, 448]
    r = nm.fp8_qdq_ue8m0(x)
    q = r.codes.view(torch.float8_e4m3fn).float().unflatten(-1, (-1, 32)).gather(-1, amax_idx).abs()
    assert ((q >= 224) & (q <= 448)).all()


def test_quantisers_validate_shape_dtype_and_finiteness() -> None:
    with pytest.raises(ValueError, match=r"multiple of the block size 16, got shape \(2, 24\)"):
        nm.fp4_qdq_e4m3(torch.zeros(2, 24, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"multiple of the block size 32, got shape \(48,\)"):
        nm.fp8_qdq_ue8m0(torch.zeros(48, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bf16"):
        nm.fp4_qdq_e8m0(torch.zeros(32, dtype=torch.float16))
    with pytest.raises(ValueError, match="non-finite"):
        nm.fp4_qdq_e8m0(torch.full((32,), math.inf, dtype=torch.bfloat16))


def test_quantisers_keep_leading_shape_and_dtypes() -> None:
    x = torch.randn(2, 3, 4, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    for fn, block in ((nm.fp4_qdq_e4m3, 16), (nm.fp4_qdq_e8m0, 32), (nm.fp8_qdq_ue8m0, 32)):
        r = fn(x)
        assert isinstance(r, nm.QuantResult)
        assert r.y.shape == x.shape and r.y.dtype == torch.bfloat16
        assert r.codes.shape == x.shape and r.codes.dtype == torch.uint8
        assert r.scale_bytes.shape == (2, 3, 4, 64 // block) and r.scale_bytes.dtype == torch.uint8
        assert r.scales.shape == (2, 3, 4, 64 // block) and r.scales.dtype == F32
        again = fn(x.float())  # fp32 input holding bf16 values: same result
        assert all(torch.equal(a, b) for a, b in zip(r, again))


def test_codes_and_scale_bytes_decode_back_to_y() -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
    r = nm.fp4_qdq_e4m3(x)
    s = r.scale_bytes.view(torch.float8_e4m3fn).float()
    assert torch.equal(s, r.scales)
    assert torch.equal((nm.e2m1_decode(r.codes) * s.repeat_interleave(16, -1)).bfloat16(), r.y)
    r = nm.fp4_qdq_e8m0(x)
    s = (2.0 ** (r.scale_bytes.double() - 127)).float()  # e8m0: 2^(byte - 127)
    assert torch.equal(s, r.scales)
    assert torch.equal((nm.e2m1_decode(r.codes) * s.repeat_interleave(32, -1)).bfloat16(), r.y)
    r = nm.fp8_qdq_ue8m0(x)
    s = (2.0 ** (r.scale_bytes.double() - 127)).float()
    assert torch.equal(s, r.scales)
    q = r.codes.view(torch.float8_e4m3fn).float()
    assert torch.equal((q * s.repeat_interleave(32, -1)).bfloat16(), r.y)


# ------------------------------------------------------------------------------------------
# Quantisers: property test against an independent slow formulation
# ------------------------------------------------------------------------------------------


def _f32(v: float) -> float:
    """Round a float64 to the nearest fp32 (C cast, round-to-nearest-even)."""
    return struct.unpack("f", struct.pack("f", v))[0]


def _e4m3_slow(a: float) -> float:
    mag = min(abs(a), 448.0)
    if mag == 0.0:
        return math.copysign(0.0, a)
    _, e = math.frexp(mag)  # mag in [2^(e-1), 2^e)
    quantum = 2.0 ** (max(e - 1, -6) - 3)  # 3 mantissa bits; subnormal spacing 2^-9
    return math.copysign(min(round(mag / quantum) * quantum, 448.0), a)


def _pow2_ceil_slow(p: float) -> float:
    m, e = math.frexp(p)
    return p if m == 0.5 else 2.0**e


def _slow_quant(values: list[float], kind: str) -> tuple[list[float], list[float]]:
    """(y, scales) of one row by the formulas of docs §6.1-6.2, one scalar at a time."""
    block = 16 if kind == "e4m3" else 32
    ys: list[float] = []
    scales: list[float] = []
    for start in range(0, len(values), block):
        blk = values[start : start + block]
        amax = max(abs(v) for v in blk)
        if kind == "e4m3":
            s = _e4m3_slow(_f32(max(amax, 0.01171875) / 6.0))
        elif kind == "e8m0":
            s = _pow2_ceil_slow(_f32(max(amax, 6 * 2.0**-126) * _f32(1 / 6)))
        else:
            s = _pow2_ceil_slow(_f32(max(amax, _f32(1e-4)) * _f32(1 / 448)))
        scales.append(s)
        for v in blk:
            if kind == "fp8":
                ys.append(_e4m3_slow(max(-448.0, min(448.0, v / s))) * s)
            else:
                ys.append(_e2m1_slow(max(-6.0, min(6.0, _f32(v / s)))) * s)
    return ys, scales


def _random_bf16(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(rows, cols, generator=gen) * 2.0 ** torch.randint(-30, 30, (rows, 1), generator=gen)
    # every finite bf16 bit pattern is possible here (subnormals, huge values, -0)
    raw = torch.randint(-(2**15), 2**15, (rows, cols), generator=gen, dtype=torch.int32).to(torch.int16)
    raw = raw.view(torch.bfloat16)
    raw = torch.where(torch.isfinite(raw), raw, torch.zeros_like(raw))
    # exact e2m1 midpoints relative to a power-of-two scale, and blocks with a single nonzero
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -2.5, 6.0, -0.0, 0.0] * (cols // 12 + 1))
    ties = ties[:cols].expand(rows // 4, cols) * 2.0 ** torch.randint(-10, 10, (rows // 4, 1), generator=gen)
    return torch.cat([normal.bfloat16(), raw, ties.bfloat16()])


@pytest.mark.parametrize("kind", ["e4m3", "e8m0", "fp8"])
def test_quantisers_match_slow_float64_formulation(kind: str) -> None:
    fn = {"e4m3": nm.fp4_qdq_e4m3, "e8m0": nm.fp4_qdq_e8m0, "fp8": nm.fp8_qdq_ue8m0}[kind]
    x = _random_bf16(24, 192, seed=10)  # 56 rows x (12 or 6) blocks
    r = fn(x)
    for row in range(x.shape[0]):
        ys, scales = _slow_quant(x[row].float().tolist(), kind)
        assert r.scales[row].tolist() == scales, f"row {row}"
        expected = torch.tensor(ys, dtype=torch.float64).to(torch.bfloat16)  # exact values (or inf)
        assert torch.equal(bits16(r.y[row]), bits16(expected)), f"row {row}"


def test_fp32_input_matches_slow_formulation() -> None:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(16, 64, generator=gen) * 2.0 ** torch.randint(-12, 12, (16, 1), generator=gen)
    for kind, fn in (("e4m3", nm.fp4_qdq_e4m3), ("e8m0", nm.fp4_qdq_e8m0), ("fp8", nm.fp8_qdq_ue8m0)):
        r = fn(x)
        for row in range(x.shape[0]):
            ys, scales = _slow_quant(x[row].tolist(), kind)
            assert r.scales[row].tolist() == scales
            assert torch.equal(bits16(r.y[row]), bits16(torch.tensor(ys, dtype=torch.float64).float().bfloat16()))


def test_bf16_reciprocal_product_equals_division_for_every_positive_bf16() -> None:
    # docs §6.1: for bf16 amax, amax * fp32(1/448) and amax / 448 give the same pow2 scale
    amax = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    a8 = amax.clamp_min(nm.FP8_AMAX_FLOOR)
    assert torch.equal(nm.pow2_ceil(a8 * nm.FP8_MAX_INV), nm.pow2_ceil(a8 / 448.0))
    a4 = amax.clamp_min(nm.FP4_E8M0_AMAX_FLOOR)
    assert torch.equal(nm.pow2_ceil(a4 * nm.FP4_MAX_INV), nm.pow2_ceil(a4 / 6.0))


def test_fp32_constants_of_appendix_b() -> None:
    assert nm.FP8_MAX_INV.item() == 0.0022321429569274187
    assert nm.FP4_MAX_INV.item() == 0.1666666716337204
    assert t32(nm.FP8_AMAX_FLOOR).item() == 9.999999747378752e-05
    assert nm.FP4_E4M3_AMAX_FLOOR == 0.01171875
    assert t32(nm.FP4_E8M0_AMAX_FLOOR).item() == 6 * 2.0**-126


# ------------------------------------------------------------------------------------------
# RMSNorm and linears
# ------------------------------------------------------------------------------------------


def test_rms_norm_by_hand_and_dtype() -> None:
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]], dtype=torch.bfloat16)  # mean square 6.25 -> rms 2.5
    w = torch.tensor([1.0, 2.0, 1.0, 1.0], dtype=torch.bfloat16)
    y = nm.rms_norm(x, w)
    assert y.dtype == torch.bfloat16
    assert y.float().tolist() == [[1.203125, 3.203125, 0.0, 0.0]]  # bf16(1.2), bf16(3.2)
    assert nm.rms_norm(torch.zeros(2, 4), torch.ones(4)).tolist() == [[0.0] * 4] * 2  # eps 1e-20


def test_rms_norm_matches_float64_within_one_bf16_rounding() -> None:
    gen = torch.Generator().manual_seed(6)
    x = (torch.randn(32, 512, generator=gen) * 3).bfloat16()
    w = torch.rand(512, generator=gen).bfloat16()
    y = nm.rms_norm(x, w).double()
    xd = x.double()
    ref = w.double() * xd / xd.square().mean(-1, keepdim=True).sqrt()
    assert ((y - ref).abs() <= ref.abs() * 2.0**-8 + 1e-30).all()
    with pytest.raises(ValueError, match="weight shape"):
        nm.rms_norm(x, w[:-1])


def test_linears() -> None:
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(3, 5, 16, generator=gen), torch.randn(8, 16, generator=gen)
    y = nm.linear_f32(x, w)
    assert y.shape == (3, 5, 8) and y.dtype == F32
    assert torch.allclose(y.double(), x.double() @ w.double().T, atol=1e-5)
    yb = nm.linear_bf16(x.bfloat16(), w.bfloat16())
    assert yb.dtype == torch.bfloat16
    assert torch.allclose(yb.double(), x.bfloat16().double() @ w.bfloat16().double().T, rtol=2**-7, atol=1e-2)
    with pytest.raises(ValueError, match="float32"):
        nm.linear_f32(x.bfloat16(), w)
    with pytest.raises(ValueError, match=r"\[out, in\]"):
        nm.linear_bf16(x.bfloat16(), w.T.bfloat16())
