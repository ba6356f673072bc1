"""Ports with one behaviour each of a public GPU library's quantiser, everything else the reference's.

Each class does what one library function does, written here from what that function computes (the
library and function are named on each), so that the diagnosis variants traced to those libraries
(harness/diagnosis/variants.py, docs/diagnosis.md) can be shown to name a port that has them:

- DeepGEMM `deep_gemm/utils/math.py`: `_quantize_to_fp4_e2m1` (midpoints to the lower magnitude, no
  sign on a zero code), `per_token_cast_to_fp4` (amax floored at 1e-4, scale amax / 6.0 rounded up to
  a power of two), `_dequantize_from_fp4_e2m1` (+0 at code 8);
- TensorRT-LLM `cpp/tensorrt_llm/kernels/fusedCatFp4.cu`: `MIN_AMAX` 1e-12, scale amax * fp32(1/6);
- FlashMLA `tests/quant.py`: `_cast_scale_inv_to_ue8m0` (the 1e-4 floor on amax / 448, not on amax).

A port with one behaviour keeps upstream's everything else (its sign rule, its block size), so it
has exactly one known bug; `DeepGemmE2M1` has both of DeepGEMM's e2m1 behaviours at once.
"""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import numerics as nx
from patching import patched

GRID = torch.tensor(nx.E2M1_GRID, dtype=torch.float32)
MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)  # between GRID's neighbours
FP4 = ("quant.e2m1", "quant.fp4_e4m3", "quant.fp4_e8m0")


def e2m1_index_below(v: torch.Tensor) -> torch.Tensor:
    """int64 index into GRID: how many midpoints lie strictly below |v| (|v| above 6 saturates). A value
    on a midpoint is counted below it: it takes the smaller magnitude (DeepGEMM's `torch.bucketize`
    with the default right=False, TensorRT-LLM's sum of `ax > midpoint`)."""
    return (v.abs().unsqueeze(-1) > MIDPOINTS).sum(dim=-1)


def e2m1_round_lower_midpoints(v: torch.Tensor) -> torch.Tensor:
    """e2m1 rounding with DeepGEMM's midpoint rule and upstream's sign rule (v's sign, -0 included)."""
    return torch.copysign(GRID[e2m1_index_below(v)], v)


def e2m1_codes_deepgemm(v: torch.Tensor) -> torch.Tensor:
    """uint8 codes as `_quantize_to_fp4_e2m1` writes them: the sign bit only where v < 0 and the index
    is not 0 (a negative value that rounds to zero, and -0, get code 0)."""
    index = e2m1_index_below(v)
    sign = (v < 0) & (index != 0)
    return (index | (sign.to(torch.int64) << 3)).to(torch.uint8)


def e2m1_decode_deepgemm(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values as `_dequantize_from_fp4_e2m1` reads codes: negated only where the sign bit is set
    and the magnitude index is not 0, so code 8 reads back +0."""
    index = (codes & 0x7).long()
    negative = ((codes & 0x8) != 0) & (index != 0)
    return torch.where(negative, -GRID[index], GRID[index])


def pow2_up(s: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 s) of positive fp32 scales, in float64 (exact here: s is a normal fp32 value)."""
    return torch.exp2(torch.ceil(torch.log2(s.double()))).float()


def fp4_pow2(x: torch.Tensor, floor: float, divide: bool, block: int = 32) -> nx.QuantResult:
    """fp4 with power-of-two scales: amax floored at `floor`, then amax / 6.0 (`divide`, DeepGEMM) or
    amax * fp32(1/6) (TensorRT-LLM), rounded up to a power of two; e2m1 and its sign as upstream."""
    xg = x.float().unflatten(-1, (-1, block))
    amax = xg.abs().amax(dim=-1).clamp_min(floor)
    s = pow2_up(amax / 6.0 if divide else amax * torch.tensor(1.0 / 6.0, dtype=torch.float32))
    q = nx.e2m1_round((xg / s.unsqueeze(-1)).clamp(-6.0, 6.0))
    y = (q * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    scale_bytes = (torch.log2(s.double()).round().to(torch.int64) + 127).to(torch.uint8)
    return nx.QuantResult(y, nx.e2m1_encode(q).flatten(-2), scale_bytes, s)


def fp8_scale_floored(x: torch.Tensor, block: int = 32) -> nx.QuantResult:
    """fp8 as FlashMLA's `quantize_k_cache` scales a tile: amax / 448 in fp32, floored at 1e-4, then
    torch.pow(2, ceil(log2(.))); x / s cast to e4m3 (no clamp: |x / s| <= 448 here). Upstream's block
    of 32 is kept (FlashMLA's tile of 64 is `fp8-blocks-64`, another variant)."""
    xg = x.float().unflatten(-1, (-1, block))
    s = torch.pow(2.0, torch.ceil(torch.log2((xg.abs().amax(dim=-1) / 448.0).clamp_min(1e-4))))
    q8 = (xg / s.unsqueeze(-1)).to(torch.float8_e4m3fn)
    y = (q8.float() * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    scale_bytes = (torch.log2(s.double()).round().to(torch.int64) + 127).to(torch.uint8)
    return nx.QuantResult(y, q8.view(torch.uint8).flatten(-2), scale_bytes, s)


def outputs(q: nx.QuantResult) -> dict[str, torch.Tensor]:
    return {"y": q.y, "codes": q.codes, "scale_bytes": q.scale_bytes}


class DeepGemmTiesTowardZero(ReferenceAdapter):
    """quant.e2m1 and both fp4 quantisers with DeepGEMM's midpoint rule (0.75 -> 0.5, 1.75 -> 1.5,
    3.5 -> 3), upstream's sign of zero."""

    def run(self, component, inputs, params):
        if component not in FP4:
            return super().run(component, inputs, params)
        with patched(nx, "e2m1_round", e2m1_round_lower_midpoints):
            return super().run(component, inputs, params)


class DeepGemmE2M1(ReferenceAdapter):
    """quant.e2m1 exactly as DeepGEMM rounds and reads back e2m1: its midpoint rule, no sign on a zero
    code, and its dequantisation table (two known bugs: ties toward zero and the lost -0)."""

    def run(self, component, inputs, params):
        if component != "quant.e2m1":
            return super().run(component, inputs, params)
        codes = e2m1_codes_deepgemm(inputs["v"])
        return {"codes": codes, "y": e2m1_decode_deepgemm(codes)}


class DeepGemmDequantTable(ReferenceAdapter):
    """Upstream's codes (code 8 kept for a negative value that rounds to zero), dequantised through
    DeepGEMM's table, which reads code 8 as +0: the fp4 values differ only in the sign of a zero."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "quant.e2m1":
            return {**out, "y": e2m1_decode_deepgemm(out["codes"])}
        if component not in ("quant.fp4_e4m3", "quant.fp4_e8m0"):
            return out
        if component == "quant.fp4_e8m0":
            scales = (out["scale_bytes"].to(torch.int32) << 23).view(torch.float32)  # 2^(byte - 127)
        else:
            scales = out["scale_bytes"].view(torch.float8_e4m3fn).float()
        values = e2m1_decode_deepgemm(out["codes"]).unflatten(-1, (scales.shape[-1], -1))
        return {**out, "y": (values * scales.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)}


class DeepGemmAmaxFloor(ReferenceAdapter):
    """quant.fp4_e8m0 with `per_token_cast_to_fp4`'s scale: amax floored at 1e-4, amax / 6.0 rounded up
    to a power of two (upstream's e2m1 rounding and sign)."""

    def run(self, component, inputs, params):
        if component != "quant.fp4_e8m0":
            return super().run(component, inputs, params)
        return outputs(fp4_pow2(inputs["x"], 1e-4, divide=True))


class TrtllmAmaxFloor(ReferenceAdapter):
    """quant.fp4_e8m0 with `fusedCatFp4Kernel`'s scale: amax floored at 1e-12, amax * fp32(1/6) rounded
    up to a power of two (upstream's e2m1 rounding and sign)."""

    def run(self, component, inputs, params):
        if component != "quant.fp4_e8m0":
            return super().run(component, inputs, params)
        return outputs(fp4_pow2(inputs["x"], 1e-12, divide=False))


class FlashMlaScaleFloor(ReferenceAdapter):
    """quant.fp8_ue8m0 with FlashMLA's `quantize_k_cache` scale (the 1e-4 floor on amax / 448)."""

    def run(self, component, inputs, params):
        if component != "quant.fp8_ue8m0":
            return super().run(component, inputs, params)
        return outputs(fp8_scale_floored(inputs["x"]))


class SglangCompressedKvBlocks32(ReferenceAdapter):
    """The compressed-KV quantiser as an sglang fork writes it: fp4 in blocks of 32 with power-of-two
    scales (the indexer's format), where upstream uses blocks of 16 with e4m3 scales. `scale_bytes`
    then has half the blocks: another shape, a protocol error that the diagnosis still names."""

    def run(self, component, inputs, params):
        if component != "quant.fp4_e4m3":
            return super().run(component, inputs, params)
        return outputs(fp4_pow2(inputs["x"], 6.0 * 2.0**-126, divide=False))


class ScalesPerRow(ReferenceAdapter):
    """The compressed-KV quantiser's scales returned one per row (a layout no known bug produces): the
    protocol error it is, with no name."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "quant.fp4_e4m3":
            out["scale_bytes"] = out["scale_bytes"].amax(dim=-1, keepdim=True)
        return out
