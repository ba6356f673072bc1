"""Bit-level numerics of the DeepSeek-V4.1 reference: roundings, the three fake-quantisers,
RMSNorm and the two plain linears.

Everything here is a pure function of tensors on the CPU. Upstream anchors
(`docs/v41-reference.md`; `M:` = `inference/model.py`, `K41:` = `inference/kernel.py`):

- `pow2_ceil`: the power-of-two scale rounding done on IEEE bits (K41:22-38).
- `fp8_qdq_ue8m0`: `act_quant(x, 32, "ue8m0", inplace=True)` (K41:41-113, doc §6.1).
- `fp4_qdq_e8m0` / `fp4_qdq_e4m3`: `fp4_act_quant` with E8M0 scales (block 32) and with
  E4M3 scales (block 16) (K41:116-199, E4M3 branch K41:158-161, E8M0 K41:163-164, doc §6.2).
- `rms_norm`: `RMSNorm.forward` (M:281-293, doc §3.3).
- `linear_f32` / `linear_bf16`: `F.linear` as `linear()` uses it without quantised weights (M:181-207).

Override point: every component and reference module looks the quantisers (and `e2m1_round`,
`e2m1_decode`) up in this module when it calls them, so replacing
`v41_conformance.reference.numerics.fp4_qdq_e4m3` (an experiment, a test's deliberate bug) reaches
`quant.*`, `kv.finish`, `indexer` and `attention` alike.

The kernels are fake-quantisers: they quantise and immediately dequantise back into bf16. The
functions below also return what a deployment would store (e2m1 / e4m3 codes and the scale
bytes), so an implementation can be checked on codes and scales exactly.

Scale-rounding domain (`pow2_ceil`): the bit trick is a true power-of-two ceiling only for
positive normal fp32 inputs. On +0 it would give 0 (a zero scale, so x / s = NaN or inf), on a
subnormal it would give 2^-126 (not a ceiling), and it ignores the sign. The amax floors keep
every product normal: fp8 floors amax at fp32(1e-4) so amax * fp32(1/448) >= 2.2e-7 and the
scale is >= 2^-22; fp4/E8M0 floors amax at 6 * 2^-126 so amax * fp32(1/6) rounds to exactly
2^-126 at the floor. `pow2_ceil` therefore refuses inputs outside [2^-126, 2^127] instead of
reproducing the meaningless values.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from v41_conformance.ulps import ulp_of

E2M1_MAX = 6.0
E4M3_MAX = 448.0
# The kernels multiply by fp32 reciprocals of the format maxima (K41:47, K41:138).
FP8_MAX_INV = torch.tensor(1.0 / 448.0, dtype=torch.float32)  # 0.0022321429569274187
FP4_MAX_INV = torch.tensor(1.0 / 6.0, dtype=torch.float32)  # 0.1666666716337204
# amax floors (K41:76-77, K41:158-161, K41:163-164); all three are exact in fp32 except 1e-4.
FP8_AMAX_FLOOR = 1e-4  # becomes fp32 9.999999747378752e-05 when clamping an fp32 tensor
FP4_E4M3_AMAX_FLOOR = 6.0 * 2.0**-9  # 0.01171875: scale floor e4m3(2^-9), the smallest subnormal
FP4_E8M0_AMAX_FLOOR = 6.0 * 2.0**-126  # scale floor 2^-126
# e2m1 magnitudes by 3-bit code; a 4-bit code adds the sign in bit 3.
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

_MANTISSA_MASK = (1 << 23) - 1
_MIN_NORMAL_F32 = 2.0**-126


class QuantResult(NamedTuple):
    """What one fake-quantiser call produces (`...` = the input's leading dims, D its last dim).

    y:           bf16 [..., D], the dequantised values the reference writes back in place.
    codes:       uint8 [..., D], e2m1 4-bit codes (fp4 paths) or float8_e4m3fn bit patterns (fp8).
    scale_bytes: uint8 [..., D // block], e8m0 biased exponents or float8_e4m3fn bit patterns.
    scales:      fp32 [..., D // block], the scale values those bytes encode.
    """

    y: torch.Tensor
    codes: torch.Tensor
    scale_bytes: torch.Tensor
    scales: torch.Tensor


# ---------------------------------------------------------------------------------------------
# Roundings
# ---------------------------------------------------------------------------------------------


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round `x` to bfloat16, nearest-even, in one rounding.

    torch's float64 -> bf16 cast rounds through fp32 first (a double rounding:
    1 + 2^-8 + 2^-30 becomes 1.0, not 1 + 2^-7). For float64 input this rounds to fp32 with
    round-to-odd first (truncate toward zero, set the last bit when inexact), which makes the
    following RNE to bf16 exact because fp32 carries more than 8 + 2 significand bits.

    Example: to_bf16(torch.tensor([1.00390625])) -> tensor([1.], dtype=torch.bfloat16)
    """
    if x.dtype != torch.float64:
        return x.to(torch.bfloat16)
    f = x.to(torch.float32)  # RNE; may round away from zero
    away = f.double().abs() > x.abs()
    f = torch.where(away, torch.nextafter(f, torch.zeros_like(f)), f)  # truncate toward zero
    inexact = f.double() != x
    bits = f.view(torch.int32) | inexact.to(torch.int32)  # round-to-odd
    f = torch.where(torch.isnan(x), f, bits.view(torch.float32))
    return f.to(torch.bfloat16)


def pow2_ceil(y: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(y)) for fp32 `y`, computed on the IEEE bits as K41:22-38 does.

    exponent = ((bits >> 23) & 0xFF) - 127, plus 1 if any of the 23 mantissa bits is set; the
    result is the float with that exponent and a zero mantissa. Exact powers of two map to
    themselves, anything above 2^e (by even one ulp) to 2^(e+1).

    Only positive normal inputs in [2^-126, 2^127] are accepted (module docstring: zero and
    subnormals give no ceiling); the quantisers' amax floors guarantee this.

    Example: pow2_ceil(torch.tensor([1.0, 1.0000001, 0.3])) -> tensor([1., 2., 0.5])
    """
    if y.dtype != torch.float32:
        raise ValueError(f"pow2_ceil takes fp32 input (the kernel's product), got {y.dtype}; cast with .float() first")
    bad = ~((y >= _MIN_NORMAL_F32) & (y <= 2.0**127))
    if bool(bad.any()):
        first = y[bad].flatten()[0].item()
        raise ValueError(
            f"pow2_ceil needs positive normal fp32 inputs in [2^-126, 2^127]; got {first!r} "
            f"({int(bad.sum())} of {y.numel()} elements out of range). Floor amax before scaling "
            "(fp8: 1e-4, fp4 E8M0: 6*2^-126)."
        )
    bits = y.contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    exponent = exponent + ((bits & _MANTISSA_MASK) != 0).to(torch.int32)
    return ((exponent + 127) << 23).view(torch.float32)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest float8_e4m3fn value (RNE, subnormals down to 2^-9) -> fp32.

    Clamps to +-448 before the cast: CUDA's satfinite conversion saturates, and torch versions
    disagree on overflow (NaN vs saturation), so the clamp keeps this version-proof.
    """
    if x.dtype != torch.float32:
        raise ValueError(f"e4m3_round takes fp32 input, got {x.dtype}")
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 `v` to the signed e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code.

    e2m1 is a float format, so on each binade the grid is evenly spaced: step 0.5 below 2,
    1 on [2, 4), 2 on [4, 6]. Dividing by the step (exact: a power of two) and rounding half to
    even (torch.round) is nearest-even on the code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2,
    3.5->4, 5->4, above 5 -> 6. Magnitudes above 6 saturate to 6 (callers clamp first anyway).
    The sign is kept, including on zero: -0.1 -> -0.0.
    """
    if v.dtype != torch.float32:
        raise ValueError(f"e2m1_round takes fp32 input, got {v.dtype}")
    mag = v.abs().clamp(max=E2M1_MAX)
    step = torch.full_like(mag, 2.0)  # grid spacing of the binade: [4, 6]
    step = torch.where(mag < 4.0, 1.0, step)  # [2, 4)
    step = torch.where(mag < 2.0, 0.5, step)  # [0, 2)
    rounded = (torch.round(mag / step) * step).clamp(max=E2M1_MAX)
    return torch.copysign(rounded, v)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 values on the signed e2m1 grid -> uint8 codes (bit 3 = sign, bits 0-2 = index).

    Raises ValueError when a value is not on the grid (round with `e2m1_round` first).
    """
    if v.dtype != torch.float32:
        raise ValueError(f"e2m1_encode takes fp32 input, got {v.dtype}")
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32)
    mag = v.abs()
    index = torch.searchsorted(grid, mag.contiguous())  # exact match -> its index
    on_grid = (index < len(E2M1_GRID)) & (grid[index.clamp(max=len(E2M1_GRID) - 1)] == mag)
    if not bool(on_grid.all()):
        first = v[~on_grid].flatten()[0].item()
        raise ValueError(f"e2m1_encode: {first!r} is not an e2m1 value {E2M1_GRID}; apply e2m1_round first")
    return index.to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (0..15) -> fp32 values; code 8 decodes to -0.0."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"e2m1_decode takes uint8 codes, got {codes.dtype}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"e2m1 codes are 4-bit (0..15), got {int(codes.max())}")
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32)
    table = torch.cat([grid, -grid])  # [16]; index 8 is -0.0
    return table[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 4-bit codes [..., D] -> uint8 bytes [..., D/2], element 2i in the low nibble."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"pack_nibbles takes uint8 codes, got {codes.dtype}")
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last dim, got shape {tuple(codes.shape)}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"pack_nibbles takes 4-bit codes (0..15), got {int(codes.max())}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


# ---------------------------------------------------------------------------------------------
# Fake-quantisers (K41:41-199)
# ---------------------------------------------------------------------------------------------


def _blocks(x: torch.Tensor, block: int, name: str) -> torch.Tensor:
    """Check `x` and return its fp32 values grouped as [..., D // block, block]."""
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{name} takes bf16 (or fp32) input, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(f"{name}: last dim must be a multiple of the block size {block}, got shape {tuple(x.shape)}")
    xf = x.float()
    if not bool(torch.isfinite(xf).all()):
        n_bad = int((~torch.isfinite(xf)).sum())
        raise ValueError(f"{name}: input has {n_bad} non-finite values; the kernels assume finite activations")
    return xf.unflatten(-1, (-1, block))  # [..., D/block, block]


def _fp4_codes_and_y(xg: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared fp4 tail (K41:165-170): v = clamp(x / s, -6, 6), e2m1, y = bf16(e2m1 * s).

    y is dequantised from the codes (`e2m1_decode`, which gives back e2m1's value bit for bit, -0
    included), so the dequantisation table is one override point of its own."""
    v = (xg / s.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)  # [..., nb, block] fp32
    codes = e2m1_encode(e2m1_round(v))
    y = (e2m1_decode(codes) * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)  # exact: <= 2 bits x <= 4 bits
    return codes.flatten(-2), y


def fp4_qdq_e4m3(x: torch.Tensor, block: int = 16) -> QuantResult:
    """fp4 e2m1 fake-quant with float8_e4m3fn scales, block 16 (compressed KV, K41:158-161).

    Per block: amax = max(max|x|, 6 * 2^-9); s = fp32(e4m3(amax / 6.0)) with a true fp32
    division (so s is not a power of two; its minimum is the e4m3 subnormal 2^-9);
    v = clamp(x / s, -6, 6); y = bf16(e2m1(v) * s). scale_bytes are the e4m3fn bit patterns.
    """
    xg = _blocks(x, block, "fp4_qdq_e4m3")
    amax = xg.abs().amax(dim=-1).clamp_min(FP4_E4M3_AMAX_FLOOR)  # [..., nb]
    s8 = (amax / E2M1_MAX).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    s = s8.to(torch.float32)
    codes, y = _fp4_codes_and_y(xg, s)
    return QuantResult(y, codes, s8.view(torch.uint8), s)


def fp4_qdq_e8m0(x: torch.Tensor, block: int = 32) -> QuantResult:
    """fp4 e2m1 fake-quant with power-of-two (e8m0) scales, block 32 (indexer q/k, K41:163-164).

    Per block: amax = max(max|x|, 6 * 2^-126); s = pow2_ceil(amax * fp32(1/6));
    v = clamp(x / s, -6, 6); y = bf16(e2m1(v) * s). scale_bytes = biased exponent (2^(b-127)).
    """
    xg = _blocks(x, block, "fp4_qdq_e8m0")
    amax = xg.abs().amax(dim=-1).clamp_min(FP4_E8M0_AMAX_FLOOR)  # [..., nb]
    s = pow2_ceil(amax * FP4_MAX_INV)
    codes, y = _fp4_codes_and_y(xg, s)
    return QuantResult(y, codes, e8m0_byte(s), s)


def fp8_qdq_ue8m0(x: torch.Tensor, block: int = 32) -> QuantResult:
    """fp8 e4m3 fake-quant with power-of-two scales: act_quant(x, 32, "ue8m0") (K41:41-113).

    Per block: amax = max(max|x|, fp32(1e-4)); s = pow2_ceil(amax * fp32(1/448)) (>= 2^-22);
    q = e4m3(clamp(x / s, -448, 448)) RNE (x / s is exact); y = bf16(q * s) (exact).
    codes are the float8_e4m3fn bit patterns; scale_bytes the e8m0 biased exponents.
    """
    xg = _blocks(x, block, "fp8_qdq_ue8m0")
    amax = xg.abs().amax(dim=-1).clamp_min(FP8_AMAX_FLOOR)  # [..., nb]
    s = pow2_ceil(amax * FP8_MAX_INV)
    q8 = (xg / s.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    y = (q8.to(torch.float32) * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    return QuantResult(y, q8.view(torch.uint8).flatten(-2), e8m0_byte(s), s)


def e8m0_value(scale_bytes: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 bytes -> fp32 powers of two 2^(byte - 127) (bytes 1..254)."""
    return (scale_bytes.to(torch.int32) << 23).view(torch.float32)


def e8m0_byte(s: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales -> e8m0 bytes (the fp32 exponent field; value 2^(byte-127))."""
    return ((s.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


# ---------------------------------------------------------------------------------------------
# RMSNorm and linears
# ---------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-20) -> torch.Tensor:
    """RMSNorm as M:281-293: fp32 inside, the weight promoted to fp32, one cast back to x.dtype.

    y = (weight.float() * (xf * rsqrt(mean(xf^2, -1) + eps))).to(x.dtype), xf = x.float().
    x [..., D], weight [D].
    """
    if weight.shape != (x.shape[-1],):
        raise ValueError(
            f"rms_norm: weight shape {tuple(weight.shape)} does not match the last dim of x {tuple(x.shape)}"
        )
    xf = x.float()
    # Portable: the mean of squares and the reciprocal square root in float64 (exact products,
    # correctly rounded sqrt and division), one rounding to fp32; the products stay in fp32 as
    # upstream. A vectorised fp32 mean or rsqrt would depend on the CPU's vector width.
    var = xf.double().square().mean(-1, keepdim=True)  # [..., 1]
    inv = (1.0 / torch.sqrt(var + eps)).float()
    return (weight.float() * (xf * inv)).to(x.dtype)


def randn(*size, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal samples that are the same on every CPU.

    torch's fp32 `randn` uses a vectorised Box-Muller whose last bits depend on the instruction
    set; the float64 path does not, so draw in float64 and round once.
    """
    return torch.randn(*size, generator=generator, dtype=torch.float64).to(dtype)


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """exp of fp32 values, computed in float64 and rounded once to fp32.

    torch's vectorised fp32 exp differs in the last bit between CPU instruction sets; the float64
    result rounded to fp32 is the correctly rounded value on every machine (barring a float64 result
    within one float64 ulp of an fp32 rounding boundary), so goldens do not depend on the CPU.
    """
    return torch.exp(x.double()).float()


def sum_f32(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum of fp32 values over `dim`, accumulated in float64, rounded once (order-independent)."""
    return x.double().sum(dim=dim).float()


def einsum_f32(equation: str, *operands: torch.Tensor) -> torch.Tensor:
    """fp32 einsum with an ideal accumulator: float64 products and sums, one rounding to fp32."""
    return torch.einsum(equation, *(o.double() for o in operands)).float()


def _accumulate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T summed in float64, rounded once to fp32: an ideal fp32 accumulator.

    Upstream's GEMMs accumulate in fp32 in whatever order the BLAS picks (CPU vector width,
    thread count and matrix shape all change it). Goldens must not depend on the machine that
    wrote them, so the reference accumulates the exact products (bf16 x bf16 and fp32 x fp32
    products are exact in float64) in float64 and rounds to fp32 at the end; an implementation's
    own fp32 order then differs from the golden by accumulation error only, which the tolerance
    of every GEMM-fed output is calibrated to absorb.
    """
    return F.linear(x.double(), w.double()).float()


def linear_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 x [..., in] @ w[out, in].T -> fp32 [..., out] (ratio-2 compressor wkv/wgate)."""
    _check_linear(x, w, torch.float32, "linear_f32")
    return _accumulate(x, w)


def linear_bf16(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """bf16 linear: x [..., in] @ w[out, in].T, fp32 accumulation, one rounding to bf16."""
    return linear_bf16_acc(x, w).to(torch.bfloat16)


def linear_bf16_acc(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`linear_bf16`'s fp32 accumulator, before its rounding to bf16."""
    _check_linear(x, w, torch.bfloat16, "linear_bf16")
    return _accumulate(x, w)


def _check_linear(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype, name: str) -> None:
    if x.dtype != dtype or w.dtype != dtype:
        raise ValueError(f"{name} takes {dtype} x and w, got x {x.dtype}, w {w.dtype}")
    if w.ndim != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(
            f"{name}: w must be [out, in] with in == x.shape[-1]; got x {tuple(x.shape)}, w {tuple(w.shape)}"
        )


def exact_rms_norm(
    pre: torch.Tensor, norm_w: torch.Tensor, eps: float, slack: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm in float64 of float64 values `pre` [..., hd] (a GEMM's exact output, a pooled latent), and
    the bound on what the reference's bf16 cast of them before its norm moves each output: with p' = p + d (|d_i| <= h_i, half a bf16 ulp of
    p_i, plus `slack`, what an implementation's accumulation may move p_i), y_i = w_i p_i / r moves by at
    most |w_i| h_i / r + |y_i| (sum |p_i| h_i / sum p_i^2) to first order, the second term the norm's
    scale r moving with every element. Second-order terms are at most 2^-8 of that (|d_i| <= 2^-8 |p_i| for
    the cast; the slack, which may exceed a cancelling |p_i|, is far below the row's rms): the bound carries
    2^-6 more."""
    w = norm_w.double()
    square = pre.square().mean(-1, keepdim=True)
    r = torch.sqrt(square + eps)
    exact = w * pre / r
    h = ulp_of(pre, torch.bfloat16) / 2 + (0.0 if slack is None else slack)
    moved = (pre.abs() * h).sum(-1, keepdim=True) / pre.square().sum(-1, keepdim=True).clamp_min(1e-300)
    return exact, (w.abs() * h / r + exact.abs() * moved) * (1 + 2.0**-6)
