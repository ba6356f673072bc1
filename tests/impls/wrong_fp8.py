"""linear.fp8 implementations with one deliberate bug each (tests/test_fp8.py)."""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import fp8_linear as fp8
from v41_conformance.reference import numerics as nx
from gate import bare
from patching import patched


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
