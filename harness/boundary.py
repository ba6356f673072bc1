"""Rounding-boundary verdicts for quantised outputs (docs/verdicts.md, "Boundary flips").

A block quantiser is exact given its input, but on the attention path its input comes from
rounded arithmetic (GEMMs, RMSNorm, RoPE) that a correct implementation may round differently
within that arithmetic's own tolerance. Where the reference's value before quantisation sits next
to a rounding decision, such an implementation lands one representable step away. This module
tells those boundary flips apart from genuine mismatches. Pure functions, no I/O.

Per block of `block` elements (one scale):
- x: the reference's value before quantisation (the golden's `pre` tensor) and t its tolerance
  (`pre_tolerance`: `boundary_ulps` bf16 ulps of |x|, or of the RoPE pair's norm in the rotated
  tail, because a rotation spreads one input's rounding over both outputs of its pair, plus
  `boundary_atol_rel` of the block's amax for values near zero);
- the block's scale is a function of amax = max |x|; the admissible scales are the reference's
  and those reachable from amax in [max(|x| - t), max(|x| + t)];
- under a scale s an element's code is Q_s(x); the codes reachable from x +- t are the admissible
  ones.

An element that differs from the golden is a *boundary flip* when, under the reference's scale,
it is one step from Q_s(x) and reachable from x +- t (a zero whose sign differs counts when
|x| <= t). A block whose scale is one step from the reference's and reachable is a *scale flip*:
its elements are judged the same way under that scale ("they follow the scale"). A scale byte is
a flip when it is one step from the golden's and reachable. Anything else is a mismatch, and the
verdict names the first one with x, the boundary it would have had to cross and t.

Encodings of one quantiser's outputs: `values` (the bf16 dequantised tensor the reference writes
back), `codes` (uint8 per element: e2m1 4-bit codes or float8_e4m3fn bits), `packed` (e2m1 codes
two per byte, element 2i in the low nibble) and `scale_bytes` (uint8 per block: e8m0 exponent or
float8_e4m3fn bits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .reference import numerics as nx
from .ulps import rope_magnitude, ulp_of

ENCODINGS = ("values", "codes", "packed", "scale_bytes")


@dataclass(frozen=True)
class BlockFormat:
    """One of the three block quantisers of the V4.1 path (kernel.py; v41-reference §6.1-6.2)."""

    name: str
    block: int
    element: str  # "e4m3" (fp8 codes) or "e2m1" (fp4 codes)
    scale_rule: Callable[[torch.Tensor], torch.Tensor]  # fp32 amax [...] -> fp32 scale [...]
    scale_is_pow2: bool

    def scale(self, amax: torch.Tensor) -> torch.Tensor:
        return self.scale_rule(amax.float())

    def scale_bytes(self, s: torch.Tensor) -> torch.Tensor:
        if self.scale_is_pow2:
            return nx.e8m0_byte(s)
        return s.to(torch.float8_e4m3fn).view(torch.uint8)

    def scale_of_bytes(self, b: torch.Tensor) -> torch.Tensor:
        if self.scale_is_pow2:
            return nx.e8m0_value(b)
        return b.contiguous().view(torch.float8_e4m3fn).float()

    def codes(self, v: torch.Tensor) -> torch.Tensor:
        """fp32 scaled values -> uint8 codes (clamped, rounded to nearest even)."""
        if self.element == "e4m3":
            return v.clamp(-nx.E4M3_MAX, nx.E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        return nx.e2m1_encode(nx.e2m1_round(v.clamp(-nx.E2M1_MAX, nx.E2M1_MAX)))

    def value(self, codes: torch.Tensor) -> torch.Tensor:
        if self.element == "e4m3":
            return codes.contiguous().view(torch.float8_e4m3fn).float()
        return nx.e2m1_decode(codes)

    def ordinal(self, codes: torch.Tensor) -> torch.Tensor:
        """Signed position on the grid (adjacent values differ by 1; both zeros are 0)."""
        c = codes.to(torch.int64)
        magnitude, sign = (c & 0x7F, c >> 7) if self.element == "e4m3" else (c & 0x7, (c >> 3) & 1)
        return torch.where(sign.bool(), -magnitude, magnitude)

    @property
    def step_name(self) -> str:
        return "e4m3 step" if self.element == "e4m3" else "e2m1 step"


def _pow2_scale(inv: torch.Tensor, floor: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda amax: nx.pow2_ceil(amax.clamp_min(floor) * inv)


def _e4m3_scale(amax: torch.Tensor) -> torch.Tensor:
    s = (amax.clamp_min(nx.FP4_E4M3_AMAX_FLOOR) / nx.E2M1_MAX).clamp(-nx.E4M3_MAX, nx.E4M3_MAX)
    return s.to(torch.float8_e4m3fn).float()


FORMATS = {
    "fp8_ue8m0": BlockFormat("fp8_ue8m0", 32, "e4m3", _pow2_scale(nx.FP8_MAX_INV, nx.FP8_AMAX_FLOOR), True),
    "fp4_e8m0": BlockFormat("fp4_e8m0", 32, "e2m1", _pow2_scale(nx.FP4_MAX_INV, nx.FP4_E8M0_AMAX_FLOOR), True),
    "fp4_e4m3": BlockFormat("fp4_e4m3", 16, "e2m1", _e4m3_scale, False),
}


def pre_tolerance(pre: torch.Tensor, ulps: float, tail: int = 0, atol_rel: float = 0.0, block: int = 1) -> torch.Tensor:
    """float64 [..., D]: `ulps` bf16 ulps of |x| (in the last `tail` channels, RoPE pairs (2i, 2i+1),
    of the pair's norm, which a rotation preserves), plus `atol_rel` times the amax of the element's
    quantisation block: a GEMM output near zero moves with its inputs' rounding, not its own."""
    tol = ulps * ulp_of(rope_magnitude(pre, tail), torch.bfloat16)
    if atol_rel:
        amax = pre.double().abs().unflatten(-1, (-1, block)).amax(-1, keepdim=True)
        tol = tol + atol_rel * amax.expand(*amax.shape[:-1], block).flatten(-2)
    return tol


@dataclass(frozen=True)
class QuantVerdict:
    """Counts over one output and the first flip and first mismatch, spelled out."""

    numel: int  # elements (scale bytes for `scale_bytes`)
    differ: int
    flips: int  # differing elements (or bytes) accepted as boundary flips, scale-flip blocks included
    scale_flips: int  # blocks judged under a flipped scale
    mismatched: int
    first_flip: str = ""
    first_mismatch: str = ""
    signed_zeros: int = 0  # elements whose only difference is the sign of a zero (not in differ)

    def describe(self) -> str:
        lines = [
            f"{self.differ} of {self.numel} differ: {self.flips} boundary flip(s)"
            + (f" ({self.scale_flips} block(s) follow a flipped scale)" if self.scale_flips else "")
            + f", {self.mismatched} mismatch(es)"
            + (f"; {self.signed_zeros} more differ only in the sign of a zero" if self.signed_zeros else "")
        ]
        if self.first_flip:
            lines.append(f"first boundary flip: {self.first_flip}")
        if self.first_mismatch:
            lines.append(f"first mismatch: {self.first_mismatch}")
        return "\n".join(lines)


def classify_quantised(
    expected: torch.Tensor, actual: torch.Tensor, pre: torch.Tensor, tol: torch.Tensor, fmt: BlockFormat, encoding: str
) -> QuantVerdict:
    """Judge one quantised output (same dtype and shape on both sides; see the module docstring).

    pre: [..., D] the reference's values before quantisation; tol: float64 [..., D] their
    tolerance. Raises ValueError when `pre` does not reproduce `expected` (a broken golden).
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; one of {ENCODINGS}")
    x = pre.float().unflatten(-1, (-1, fmt.block))  # [..., nb, block]
    t = tol.double().unflatten(-1, (-1, fmt.block))
    s_ref = fmt.scale(x.abs().amax(-1))  # [..., nb]
    s_lo = fmt.scale((x.double().abs() - t).clamp_min(0).amax(-1).float())
    s_hi = fmt.scale((x.double().abs() + t).amax(-1).float())
    if encoding == "scale_bytes":
        return _classify_scales(expected, actual, fmt, s_ref, s_lo, s_hi, x)
    return _classify_elements(expected, actual, fmt, encoding, x, t, s_ref, s_lo, s_hi)


def _classify_scales(expected, actual, fmt, s_ref, s_lo, s_hi, x) -> QuantVerdict:
    if not torch.equal(fmt.scale_bytes(s_ref), expected):
        raise ValueError("the golden's pre-quantisation values do not reproduce its scale bytes")
    e, a = expected.to(torch.int64), actual.to(torch.int64)
    lo, hi = fmt.scale_bytes(s_lo).to(torch.int64), fmt.scale_bytes(s_hi).to(torch.int64)
    differ = e != a
    flip = differ & ((a - e).abs() == 1) & (lo <= a) & (a <= hi)
    bad = differ & ~flip

    def describe(where: torch.Tensor) -> str:
        i = tuple(int(v) for v in where.nonzero()[0])
        return (
            f"block {list(i)}: scale {_g(fmt.scale_of_bytes(actual[i]))} (byte {int(a[i])}), expected "
            f"{_g(s_ref[i])} (byte {int(e[i])}); amax {_g(x[i].abs().max())} reaches scales "
            f"{_g(s_lo[i])}..{_g(s_hi[i])} within its tolerance"
        )

    return QuantVerdict(
        e.numel(),
        int(differ.sum()),
        int(flip.sum()),
        0,
        int(bad.sum()),
        describe(flip) if flip.any() else "",
        describe(bad) if bad.any() else "",
    )


def _codes_of(
    encoded: torch.Tensor, fmt: BlockFormat, encoding: str, s: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [..., nb, block], representable bool) of an output under block scales s."""
    if encoding == "packed":
        b = encoded.to(torch.uint8)
        codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
        codes = codes.unflatten(-1, (-1, fmt.block))
        return codes, torch.ones_like(codes, dtype=torch.bool)
    if encoding == "codes":
        codes = encoded.to(torch.uint8).unflatten(-1, (-1, fmt.block))
        ok = codes <= 15 if fmt.element == "e2m1" else (codes & 0x7F) != 0x7F  # NaN is no code
        return torch.where(ok, codes, 0), ok
    y = encoded.float().unflatten(-1, (-1, fmt.block))  # values: y = q * s exactly
    codes = fmt.codes(y / s.unsqueeze(-1))
    back = (fmt.value(codes) * s.unsqueeze(-1)).to(encoded.dtype).float()
    ok = (back == y) & (torch.signbit(back) == torch.signbit(y))
    return codes, ok


def _judge_under(scale: torch.Tensor, actual, fmt, encoding, x, t):
    """Per element under block scales `scale`: (reference codes, actual codes, follows, flip, signed
    zero: both codes a zero, of different signs; never a flip, whatever the value before rounding)."""
    s = scale.unsqueeze(-1)
    ref = fmt.codes(x / s)
    lo = fmt.ordinal(fmt.codes(((x.double() - t) / s.double()).float()))
    hi = fmt.ordinal(fmt.codes(((x.double() + t) / s.double()).float()))
    got, representable = _codes_of(actual, fmt, encoding, scale)
    o_ref, o_got = fmt.ordinal(ref), fmt.ordinal(got)
    follows = representable & (got == ref)
    step = representable & ((o_got - o_ref).abs() == 1) & (lo <= o_got) & (o_got <= hi)
    signed = representable & (o_got == 0) & (o_ref == 0) & (got != ref)
    return ref, got, follows, step & ~signed, signed


def _classify_elements(expected, actual, fmt, encoding, x, t, s_ref, s_lo, s_hi) -> QuantVerdict:
    ref, got, follows, flip, signed = _judge_under(s_ref, actual, fmt, encoding, x, t)
    want, _ = _codes_of(expected, fmt, encoding, s_ref)
    if not torch.equal(want, ref):
        raise ValueError("the golden's pre-quantisation values do not reproduce its quantised output")
    differ = ~follows & ~signed  # [..., nb, block] relative to the golden; signed zeros counted apart
    ref_ok = (follows | flip | signed).all(-1)  # [..., nb]
    alt_ok = torch.zeros_like(ref_ok)
    ref_bytes = fmt.scale_bytes(s_ref).to(torch.int64)
    for s_alt in (s_lo, s_hi):
        adjacent = (fmt.scale_bytes(s_alt).to(torch.int64) - ref_bytes).abs() == 1
        _, _, f_alt, x_alt, z_alt = _judge_under(s_alt, actual, fmt, encoding, x, t)
        alt_ok |= adjacent & (f_alt | x_alt | z_alt).all(-1)
    scale_flip = ~ref_ok & alt_ok
    block_ok = (ref_ok | scale_flip).unsqueeze(-1)
    accepted = differ & (block_ok | flip)
    bad = differ & ~accepted  # a block that is not ok holds at least one such element

    def describe(where: torch.Tensor) -> str:
        i = tuple(int(v) for v in where.nonzero()[0])
        return _describe_element(i, fmt, encoding, x, t, s_ref, ref, got, actual, bool(scale_flip[i[:-1]]))

    return QuantVerdict(
        int(differ.numel()),
        int(differ.sum()),
        int(accepted.sum()),
        int(scale_flip.sum()),
        int(bad.sum()),
        describe(accepted) if accepted.any() else "",
        describe(bad) if bad.any() else "",
        int(signed.sum()),
    )


def _describe_element(i, fmt, encoding, x, t, s_ref, ref, got, actual, under_flipped_scale: bool) -> str:
    flat = list(i[:-2]) + [i[-2] * fmt.block + i[-1]]
    s = s_ref[i[:-1]]
    e_val, a_val = fmt.value(ref[i]) * s, fmt.value(got[i]) * s
    steps = int((fmt.ordinal(got[i]) - fmt.ordinal(ref[i])).abs())
    head = f"element {flat}: actual {_g(a_val)}, expected {_g(e_val)}"
    if encoding == "values":
        head = f"element {flat}: actual {_g(actual.unflatten(-1, (-1, fmt.block))[i])}, expected {_g(e_val)}"
    if under_flipped_scale:
        return f"{head}; its block's scale flipped from {_g(s)} at a rounding boundary, and it follows"
    boundary = (e_val + a_val) / 2
    return (
        f"{head} ({steps} {fmt.step_name}{'s' if steps != 1 else ''} under scale {_g(s)}); the reference's value "
        f"before rounding {_g(x[i])} lies {_g((x[i].double() - boundary).abs())} from the boundary "
        f"{_g(boundary)}; its tolerance is {_g(t[i])}"
    )


def _g(v) -> str:
    return f"{float(v):.6g}"


def admissible_variants(x: torch.Tensor, tol: torch.Tensor, fmt: BlockFormat) -> list[tuple[str, torch.Tensor]]:
    """Every single boundary flip a correct implementation may make quantising one row.

    x: [D] the reference's values before quantisation, tol float64 [D] their tolerance. Returns
    (what, y) pairs, y the bf16 [D] dequantised row with that one flip: an element one step
    across its boundary, or a whole block under an adjacent admissible scale. Used to explain
    values computed from a quantised intermediate that is not an output (the indexer's query).
    """
    xb, tb = x.float().unflatten(-1, (-1, fmt.block)), tol.double().unflatten(-1, (-1, fmt.block))
    s_ref = fmt.scale(xb.abs().amax(-1))
    base = quantise(xb, s_ref, fmt)
    out = []
    lo = fmt.codes(((xb.double() - tb) / s_ref.double().unsqueeze(-1)).float())
    hi = fmt.codes(((xb.double() + tb) / s_ref.double().unsqueeze(-1)).float())
    ref = fmt.codes(xb / s_ref.unsqueeze(-1))
    for codes in (lo, hi):
        for blk, i in (codes != ref).nonzero().tolist():
            y = base.clone()
            y[blk, i] = (fmt.value(codes[blk, i]) * s_ref[blk]).to(torch.bfloat16)
            out.append((f"element {blk * fmt.block + i} one {fmt.step_name}", y.flatten()))
    for bound in (xb.double().abs() - tb).clamp_min(0), xb.double().abs() + tb:
        s_alt = fmt.scale(bound.amax(-1).float())
        adjacent = (fmt.scale_bytes(s_alt).to(torch.int64) - fmt.scale_bytes(s_ref).to(torch.int64)).abs() == 1
        for blk in adjacent.nonzero().flatten().tolist():
            y = base.clone()
            y[blk] = quantise(xb[blk : blk + 1], s_alt[blk : blk + 1], fmt)[0]
            out.append((f"block {blk} under the adjacent scale {_g(s_alt[blk])}", y.flatten()))
    return out


def quantise(xb: torch.Tensor, s: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """bf16 [..., nb, block]: fp32 blocks quantised under the given block scales [..., nb]."""
    return (fmt.value(fmt.codes(xb / s.unsqueeze(-1))) * s.unsqueeze(-1)).to(torch.bfloat16)
