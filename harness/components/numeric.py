"""Numeric components: the e2m1 rounding, the three fake-quantisers, linear.f32 and norm.rms.

Upstream: kernel.py `fp4_act_quant` (K41:116-199), `act_quant` (K41:41-113), model.py RMSNorm
(M:281-293) and the fp32 compressor projections (M:439-485). See docs/v41-reference.md §3.3, §6.
"""

from __future__ import annotations

import torch

from ..errors import CaseSpecError
from ..accumulation import fp8_terms
from ..policy import ZERO_CODES
from ..reference import fp8_linear as fp8
from ..reference import numerics as nx
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from .build import dtype_of, need, normal, tile_to, uniform
from ..reference.numerics import randn

E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


# --- quant.e2m1 ----------------------------------------------------------------------------


def _e2m1_inputs(params, build, gen):
    kind = build.get("kind", "uniform")
    if kind == "midpoints":
        values = [0.0, -0.0, 6.0, -6.0, *nx.E2M1_GRID]
        for m in E2M1_MIDPOINTS:
            below = torch.nextafter(torch.tensor(m), torch.tensor(0.0)).item()
            above = torch.nextafter(torch.tensor(m), torch.tensor(7.0)).item()
            values += [m, -m, below, -below, above, -above]
        return {"v": torch.tensor(values, dtype=torch.float32)}
    if kind == "uniform":
        return {"v": uniform(gen, need(build, "shape", "quant.e2m1"), -6.0, 6.0)}
    if kind == "bf16":
        return {"v": uniform(gen, need(build, "shape", "quant.e2m1"), -6.0, 6.0).to(torch.bfloat16).float()}
    raise CaseSpecError(f"quant.e2m1: unknown build kind {kind!r} (midpoints, uniform, bf16)")


def _e2m1_reference(inputs, params):
    codes = nx.e2m1_encode(nx.e2m1_round(inputs["v"]))  # looked up at call time, like the quantisers below
    return {"codes": codes, "y": nx.e2m1_decode(codes)}  # the grid value back, -0 at code 8


register(
    Component(
        name="quant.e2m1",
        summary="round fp32 values in [-6, 6] onto the e2m1 grid, ties to the even code, sign and -0 kept",
        upstream="K41:116-199 (T.Cast to FP4)",
        inputs=(T("v", "f32", "...", "values in [-6, 6] (or beyond: they saturate)"),),
        outputs=(
            OutputSpec(
                "codes",
                "exact",
                "e2m1 codes: bit 3 sign, bits 0-2 magnitude index",
                "uint8",
                "...",
                zero_codes=ZERO_CODES["e2m1"],
            ),
            OutputSpec("y", "exact", "the grid values (sign kept, -0 included)", "f32", "..."),
        ),
        dims={"...": "any shape"},
        build=_e2m1_inputs,
        reference=_e2m1_reference,
        floor=3,
    )
)


# --- the three block quantisers -------------------------------------------------------------


def _quant_inputs(block: int, top: float, component: str):
    """Builder for a block quantiser whose block maximum maps to `top` when the scale is 1."""

    def build_inputs(params, build, gen):
        kind = build.get("kind", "normal")
        shape = list(need(build, "shape", component))
        if shape[-1] % block:
            raise CaseSpecError(f"{component}: last dim {shape[-1]} is not a multiple of the block {block}")
        if kind == "normal":
            x = normal(gen, shape, 1.0, torch.float32)
            rows = torch.tensor([float(s) for s in build.get("row_scales", [1.0])], dtype=torch.float32)
            x = x * rows.repeat(-(-shape[0] // len(rows)))[: shape[0]].reshape(-1, *([1] * (len(shape) - 1)))
            return {"x": x.to(torch.bfloat16)}
        if kind == "log_uniform":
            mag = torch.exp2(
                uniform(gen, shape, float(build.get("low_exp", -20)), float(build.get("high_exp", 10))).double()
            ).float()
            sign = torch.where(torch.rand(tuple(shape), generator=gen) < 0.5, -1.0, 1.0)
            return {"x": (mag * sign).to(torch.bfloat16)}
        if kind == "zero_blocks":
            x = normal(gen, shape, 1.0, torch.float32)
            blocks = x.reshape(*shape[:-1], shape[-1] // block, block)
            blocks[..., ::2, :] = 0.0  # every other block all zero (a -0 block among them)
            blocks[..., 0, :1] = -0.0
            return {"x": blocks.reshape(shape).to(torch.bfloat16)}
        if kind == "boundary":
            values = [float(v) for v in need(build, "values", component)]
            rows = tile_to(values, [shape[0], shape[-1]])
            rows.view(-1, block)[:, 0] = top  # pin each block's max so its scale is exactly 1
            return {"x": rows.reshape(shape).to(torch.bfloat16)}
        if kind == "scaled":  # whole blocks at a given amax (subnormal scales, saturation)
            amaxes = [float(a) for a in need(build, "amax", component)]
            x = uniform(gen, shape, -1.0, 1.0)
            blocks = x.reshape(-1, block)
            blocks[:, 0] = 1.0
            amax = tile_to(amaxes, [blocks.shape[0], 1])
            return {"x": (blocks * amax).reshape(shape).to(torch.bfloat16)}
        raise CaseSpecError(
            f"{component}: unknown build kind {kind!r} (normal, log_uniform, zero_blocks, boundary, scaled)"
        )

    return build_inputs


def _quant_reference(function: str):
    """The reference of one quantiser, looked up in `numerics` at call time, so that replacing
    `v41_conformance.reference.numerics.<function>` (an experiment, a test) reaches this component as it
    reaches kv.finish and attention."""

    def reference(inputs, params):
        result = getattr(nx, function)(inputs["x"])
        return {"y": result.y, "codes": result.codes, "scale_bytes": result.scale_bytes}

    return reference


def quant_outputs(element: str) -> tuple[OutputSpec, ...]:
    """A quantiser's outputs; its codes are e2m1 (fp4) or e4m3 (fp8), each with its two zero codes."""
    return (
        OutputSpec("y", "exact", "dequantised values, as the reference writes them back in place", "bf16", "... D"),
        OutputSpec(
            "codes",
            "exact",
            "per element: e2m1 code (fp4: bit 3 sign, bits 0-2 index) or float8_e4m3fn bits (fp8)",
            "uint8",
            "... D",
            zero_codes=ZERO_CODES[element],
        ),
        OutputSpec(
            "scale_bytes",
            "exact",
            "per block: float8_e4m3fn bits (fp4_e4m3) or e8m0 biased exponent 2^(byte-127)",
            "uint8",
            "... D/block",
        ),
    )


QUANT_DIMS = {"...": "any leading dims", "D": "a multiple of the block", "D/block": "blocks per row"}

# name, summary, upstream lines, block, the block max that gives scale 1, reference quantiser in numerics
QUANTISERS = (
    (
        "quant.fp4_e4m3",
        "fp4 QDQ, block 16, e4m3 scales e4m3(amax/6), amax floor 6*2^-9 (compressed KV)",
        "K41:158-161, 165-170; M:760",
        16,
        6.0,
        "fp4_qdq_e4m3",
    ),
    (
        "quant.fp4_e8m0",
        "fp4 QDQ, block 32, power-of-two scales ceil2(amax*fp32(1/6)), floor 6*2^-126 (indexer q, k)",
        "K41:163-170; M:546, M:552",
        32,
        6.0,
        "fp4_qdq_e8m0",
    ),
    (
        "quant.fp8_ue8m0",
        "fp8 e4m3 QDQ, block 32, power-of-two scales ceil2(amax*fp32(1/448)), amax floor 1e-4 (window KV)",
        "K41:41-113; M:700-720",
        32,
        448.0,
        "fp8_qdq_ue8m0",
    ),
)
for _name, _summary, _upstream, _block, _top, _function in QUANTISERS:
    register(
        Component(
            name=_name,
            summary=_summary,
            upstream=_upstream,
            inputs=(T("x", "bf16", "... D", f"blocks of {_block} along the last dim"),),
            outputs=quant_outputs("e4m3" if _name.startswith("quant.fp8") else "e2m1"),
            dims={**QUANT_DIMS, "block": str(_block)},
            build=_quant_inputs(_block, _top, _name),
            reference=_quant_reference(_function),
            floor=4,
        )
    )


# --- linear.f32 and norm.rms ----------------------------------------------------------------


def _linear_inputs(params, build, gen):
    m, k, n = (int(v) for v in need(build, "mkn", "linear.f32"))
    scale = float(build.get("w_scale", k**-0.5))
    x = normal(gen, [m, k], float(build.get("x_scale", 1.0)), torch.float32)
    w = normal(gen, [n, k], scale, torch.float32)
    if build.get("bf16_valued", True):  # as the compressor: bf16 activations and checkpoint weights
        x, w = x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float()
    return {"x": x, "w": w}


register(
    Component(
        name="linear.f32",
        summary="fp32 x @ w.T (the ratio-2 compressor's wkv and wgate on the fp32 input)",
        upstream="M:439-485 (Compressor wkv/wgate, fp32)",
        inputs=(T("x", "f32", "m k"), T("w", "f32", "n k", "the weight, [out, in]")),
        outputs=(OutputSpec("y", "f32", "x @ w.T", "f32", "m n"),),
        dims={"m": "rows", "k": "input features", "n": "output features"},
        build=_linear_inputs,
        reference=lambda inputs, params: {"y": nx.linear_f32(inputs["x"], inputs["w"])},
        floor=3,
    )
)


def _norm_inputs(params, build, gen):
    shape = list(need(build, "shape", "norm.rms"))
    dtype = dtype_of(build.get("dtype", "bf16"))
    x = normal(gen, shape, 1.0, torch.float32)
    scales = [float(s) for s in build.get("row_scales", [1.0])]
    x = x * tile_to(scales, [shape[0], 1])
    if build.get("zero_row", False):
        x[0] = 0.0
    weight = (1.0 + 0.25 * randn(shape[-1], generator=gen)).to(torch.bfloat16)
    return {"x": x.to(dtype), "weight": weight}


register(
    Component(
        name="norm.rms",
        summary="RMSNorm: fp32 inside, weight promoted, one cast back to the input dtype; eps 1e-20",
        upstream="M:281-293",
        inputs=(T("x", "bf16|f32", "m d"), T("weight", "bf16", "d", "promoted to fp32 inside")),
        outputs=(OutputSpec("y", "bf16", "y = weight * x / rms(x), one cast back to x's dtype", "as x", "m d"),),
        params=(P("eps", "float", "added to the mean square", required=False, default=1e-20),),
        dims={"m": "rows", "d": "features"},
        build=_norm_inputs,
        reference=lambda inputs, params: {
            "y": nx.rms_norm(inputs["x"], inputs["weight"], float(params.get("eps", 1e-20)))
        },
        floor=3,
    )
)


# --- linear.fp8 -----------------------------------------------------------------------------


def _fp8_linear_inputs(params, build, gen):
    m, k, n = (int(v) for v in need(build, "mkn", "linear.fp8"))
    if k % fp8.BLOCK:
        raise CaseSpecError(f"linear.fp8: K = {k} is not a multiple of the block {fp8.BLOCK}")
    kind = build.get("kind", "normal")
    x = randn((m, k), generator=gen) * float(build.get("x_scale", 1.0))  # float64
    blocks = x.view(m, k // fp8.BLOCK, fp8.BLOCK)
    if kind == "zero_tiny":  # all-zero blocks (one of them -0), and blocks far below the amax floor
        blocks[:, 0::3] = 0.0
        blocks[0, 0, 0] = -0.0
        blocks[:, 1::3] *= 1e-7
    elif kind == "saturating":  # block maxima exactly 448 * 2^j: the largest code, 0x7e
        blocks /= blocks.abs().amax(-1, keepdim=True)
        blocks *= 448.0 * 2.0 ** torch.randint(-8, 8, (m, k // fp8.BLOCK, 1), generator=gen).double()
    elif kind != "normal":
        raise CaseSpecError(f"linear.fp8: unknown build kind {kind!r} (normal, zero_tiny, saturating)")
    w = randn((n, k), generator=gen) * float(build.get("w_scale", k**-0.5))
    if kind == "saturating":
        w[:, ::7] *= 64.0  # tiles whose maxima dwarf their other values
    weight = fp8.quantise_weight(w)
    return {"x": x.to(torch.bfloat16), "weight": weight.codes, "weight_scale": weight.scale_bytes}


def _fp8_linear_reference(inputs, params):
    result = fp8.linear_fp8(inputs["x"], fp8.Fp8Weight(inputs["weight"], inputs["weight_scale"]))
    return {"y": result.y, "x_codes": result.x_codes, "x_scale_bytes": result.x_scale_bytes}


register(
    Component(
        name="linear.fp8",
        summary="fp8 Linear: act_quant(x, 32, ue8m0), then per K block of 32 the fp8 products summed in fp32, "
        "times both scales, accumulated in fp32; bf16 out",
        upstream="M:181-207 (linear), K41:41-113 (act_quant), K41:202-293 (fp8_gemm); §6.4",
        inputs=(
            T("x", "bf16", "M K"),
            T("weight", "uint8", "N K", "float8_e4m3fn bit patterns"),
            T("weight_scale", "uint8", "N/32 K/32", "e8m0 tile scales 2^(byte-127), one per 32 x 32 tile"),
        ),
        outputs=(
            OutputSpec(
                "y", "bf16", "act_quant(x) @ dequantised weight.T, per K block in fp32", "bf16", "M N", accumulates=True
            ),
            OutputSpec(
                "x_codes",
                "exact",
                "the input's e4m3 codes after act_quant (block 32)",
                "uint8",
                "M K",
                zero_codes=ZERO_CODES["e4m3"],
            ),
            OutputSpec("x_scale_bytes", "exact", "the input's e8m0 block scales", "uint8", "M K/32"),
        ),
        dims={
            "M": "rows",
            "K": "input features, a multiple of 32",
            "N": "output features (any; a partial last tile row)",
            "N/32": "ceil(N / 32) tile rows",
            "K/32": "tiles along K",
        },
        build=_fp8_linear_inputs,
        reference=_fp8_linear_reference,
        judge_context=lambda inputs, params: fp8_terms(
            inputs["x"], fp8.Fp8Weight(inputs["weight"], inputs["weight_scale"])
        ).context("y"),
        floor=4,
        notes="x bf16 [M, K]; weight uint8 [N, K] float8_e4m3fn bit patterns; weight_scale uint8 [ceil(N/32), K/32] "
        "e8m0 tile scales (2^(byte-127)), one per 32 x 32 tile (the last row block of a ragged N is partial).",
    )
)
