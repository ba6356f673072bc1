"""linear.fp8 implementations with one deliberate bug each (tests/test_fp8.py)."""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import fp8_linear as fp8
from v41_conformance.reference import numerics as nx
from gate import bare
from patching import patched
import precise_roundings


class PerRowScales(ReferenceAdapter):
    """Weight scales looked up per output row (row n uses scale row n mod rows), not per 32-row tile."""

    def run(self, component, inputs, params):
        if component != "linear.fp8":
            return super().run(component, inputs, params)
        scales = inputs["weight_scale"]
        n = inputs["weight"].shape[0]
        per_row = scales[torch.arange(n) % scales.shape[0]]  # [N, K/32]: one row of scales per row

        def dequantise(weight):
            return fp8.e4m3_value(weight.codes) * nx.e8m0_value(per_row).repeat_interleave(fp8.BLOCK, 1)

        q = nx.fp8_qdq_ue8m0(inputs["x"])
        w = dequantise(fp8.Fp8Weight(inputs["weight"], scales))
        return {
            "y": (q.y.double() @ w.double().T).to(torch.bfloat16),
            "x_codes": q.codes,
            "x_scale_bytes": q.scale_bytes,
        }


class Block128(ReferenceAdapter):
    """Activations quantised in blocks of 128 (V3's block size) instead of 32."""

    def run(self, component, inputs, params):
        if component != "linear.fp8":
            return super().run(component, inputs, params)
        original = nx.fp8_qdq_ue8m0
        with patched(nx, "fp8_qdq_ue8m0", lambda x, block=32: original(x, 128)):
            q = nx.fp8_qdq_ue8m0(inputs["x"])
        w = fp8.dequantise_weight(fp8.Fp8Weight(inputs["weight"], inputs["weight_scale"]))
        return {
            "y": (q.y.double() @ w.double().T).to(torch.bfloat16),
            "x_codes": q.codes,
            "x_scale_bytes": q.scale_bytes.repeat_interleave(4, -1),
        }


class Unquantised(ReferenceAdapter):
    """The bf16 input multiplied as it is: act_quant skipped (its codes still returned)."""

    def run(self, component, inputs, params):
        if component != "linear.fp8":
            return super().run(component, inputs, params)
        out = super().run(component, inputs, params)
        w = fp8.dequantise_weight(fp8.Fp8Weight(inputs["weight"], inputs["weight_scale"]))
        out["y"] = (inputs["x"].double() @ w.double().T).to(torch.bfloat16)
        return out


class AttentionSkipsActQuant(ReferenceAdapter):
    """attention with the fp8 checkpoint, but its fp8 Linears multiply the bf16 input unquantised."""

    def run(self, component, inputs, params):
        def unquantised(x, weight):
            q = nx.fp8_qdq_ue8m0(x)
            y = (x.double() @ fp8.dequantise_weight(weight).double().T).to(torch.bfloat16)
            return fp8.Fp8LinearResult(y, q.codes, q.scale_bytes)

        with patched(fp8, "linear_fp8", unquantised):
            return super().run(component, inputs, params)


BareAttentionSkipsActQuant = bare(AttentionSkipsActQuant)


class _FusedZ(precise_roundings.ExactZ):
    """attention whose wo_b quantises wo_a's fp32 accumulator itself (as ExactZ, a correct fused kernel), with
    one bug in that quantisation (`quantise`: fp32 [..., K] -> its dequantised fp8 values)."""

    @classmethod
    def wo_b(cls, acc, weight):
        if not isinstance(weight, fp8.Fp8Weight):
            return precise_roundings.ExactZ.wo_b(acc, weight)
        x = cls.quantise(acc.float().unflatten(-1, (-1, fp8.BLOCK))).flatten(-2)
        return (x.double() @ fp8.dequantise_weight(weight).double().T).to(torch.bfloat16)


class FusedZFloatScales(_FusedZ):
    """Each block's scale amax / 448 as an fp32 number, not rounded up to a power of two (DeepGEMM's
    `per_token_cast_to_fp8` without `use_ue8m0`; upstream's act_quant takes ue8m0 scales)."""

    @staticmethod
    def quantise(blocks):
        s = blocks.abs().amax(-1, keepdim=True).clamp_min(nx.FP8_AMAX_FLOOR) / nx.E4M3_MAX
        return (blocks / s).clamp(-nx.E4M3_MAX, nx.E4M3_MAX).to(torch.float8_e4m3fn).float() * s


class FusedZTowardZero(_FusedZ):
    """Each scaled value cut to e4m3's 3 mantissa bits toward zero (a conversion in round-toward-zero
    mode) where upstream rounds to nearest even."""

    @staticmethod
    def quantise(blocks):
        s = nx.pow2_ceil(blocks.abs().amax(-1, keepdim=True).clamp_min(nx.FP8_AMAX_FLOOR) / nx.E4M3_MAX)
        cut = ((blocks / s).view(torch.int32) & ~((1 << 20) - 1)).view(torch.float32)
        return cut.clamp(-nx.E4M3_MAX, nx.E4M3_MAX).to(torch.float8_e4m3fn).float() * s
