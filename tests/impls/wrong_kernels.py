"""Kernel ports with one classic bug each, on upstream's arithmetic (`gate_upstream.UpstreamTorch`),
returning its intermediates: each must fail at the stage that holds its bug, on both tiers, and fail
without its intermediates too (a rederived golden never absorbs a bug; tests/test_chain.py).

| class | bug | the stage that holds it |
|---|---|---|
| `SinkLeftOut` | sparse attention without the sink in the denominator | o |
| `NormBf16BeforeWeight` | RMSNorm rounds x * rsqrt to bf16 before the weight multiply | qr |
| `ScoresWithoutRelu` | index scores summed over heads without the ReLU | index_scores |
| `WindowNewestFirst` | window lanes newest first | window_ids |
| `OutputScaled` | the layer output scaled by 1 + 2^-6 | out |
| `Fp8Block64` | fp8 quantisation (act_quant, window rows) in blocks of 64 | window_rows |
| `Bf16KvScale` | the compressed KV's fp4 scale kept in bf16, not rounded to e4m3 | compress_rows |
| `RopeOnFirstDims` | RoPE on the first rope_head_dim channels, not the last | kv |
| `WoBRowScales` | wo_b's weight scales read per row (the first K tile's) instead of per tile | out |
"""

from __future__ import annotations

import torch

import upstream_attention as ua
import upstream_ops as up
from gate import bare
from gate_upstream import UpstreamTorch
from patching import patched

NINF = float("-inf")
ORIGINAL = {
    name: getattr(up, name)
    for name in ("sparse_attn", "rms_norm", "index_scores", "act_quant", "fp4_act_quant_e4m3", "apply_rotary_emb")
}


class Mutant(UpstreamTorch):
    """UpstreamTorch with `up.<target>` replaced by `replacement` during attention calls."""

    target: str = ""

    @staticmethod
    def replacement(*args, **kwargs):
        raise NotImplementedError

    def run(self, component, inputs, params):
        if component != "attention" or not self.target:
            return super().run(component, inputs, params)
        with patched(up, self.target, self.replacement):
            return super().run(component, inputs, params)


class SinkLeftOut(Mutant):
    target = "sparse_attn"
    replacement = staticmethod(
        lambda q, kv, sink, ids, scale: ORIGINAL["sparse_attn"](q, kv, torch.full_like(sink, NINF), ids, scale)
    )


def _norm_bf16_first(x, weight, eps):
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    return (weight * normed).to(x.dtype)


class NormBf16BeforeWeight(Mutant):
    target = "rms_norm"
    replacement = staticmethod(_norm_bf16_first)


class ScoresWithoutRelu(Mutant):
    target = "index_scores"
    replacement = staticmethod(lambda q, k, w: (torch.einsum("bshd,btd->bsht", q, k) * w.unsqueeze(-1)).sum(dim=2))


def _act_quant_64(x, block: int = up.FP8_BLOCK):
    """act_quant with one scale per 64 channels; the scales stored per 32 (each twice), as a kernel
    that reads the checkpoint's layout but quantised its activations in 64-wide blocks would."""
    q = ORIGINAL["act_quant"](x, 64)
    return up.Quantised(q.y, q.codes, q.scale_bytes.repeat_interleave(2, dim=-1))


class Fp8Block64(Mutant):
    target = "act_quant"
    replacement = staticmethod(_act_quant_64)
    handlers = {
        **UpstreamTorch.handlers,
        "quant.fp8_ue8m0": lambda inputs, params: _act_quant_64(inputs["x"])._asdict(),
    }


def _fp4_bf16_scale(x, block: int = up.FP4_KV_BLOCK):
    xb = x.float().unflatten(-1, (-1, block))
    amax = xb.abs().amax(-1).clamp_min(up.E2M1_MAX * 2.0**-9)
    scale = (amax / up.E2M1_MAX).to(torch.bfloat16).float()  # the bug: e4m3 rounding skipped
    y, codes = up._fp4_round_trip(xb, scale)
    return up.Quantised(y, codes, scale.to(torch.float8_e4m3fn).view(torch.uint8))


class Bf16KvScale(Mutant):
    target = "fp4_act_quant_e4m3"
    replacement = staticmethod(_fp4_bf16_scale)


def _rope_first_dims(x, freqs_cis, inverse=False):
    rope = 2 * freqs_cis.shape[-1]
    flipped = torch.cat([x[..., rope:], x[..., :rope]], dim=-1)  # the first channels to the tail and back
    rotated = ORIGINAL["apply_rotary_emb"](flipped, freqs_cis, inverse)
    return torch.cat([rotated[..., -rope:], rotated[..., :-rope]], dim=-1)


class RopeOnFirstDims(Mutant):
    target = "apply_rotary_emb"
    replacement = staticmethod(_rope_first_dims)


class WindowNewestFirst(UpstreamTorch):
    def run(self, component, inputs, params):
        if component != "attention":
            return super().run(component, inputs, params)

        def newest_first(ring, kv, start):
            part, ids, new_ring = ORIGINAL_WINDOW(ring, kv, start)
            return part, ids.flip(-1).contiguous(), new_ring

        with patched(ua, "window_part", newest_first):
            return super().run(component, inputs, params)


ORIGINAL_WINDOW = ua.window_part


class OutputScaled(UpstreamTorch):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "attention":
            out["out"] = (out["out"].float() * (1 + 2.0**-6)).to(torch.bfloat16)
        return out


class WoBRowScales(UpstreamTorch):
    """Each output row of wo_b takes its first K tile's scale for every K tile."""

    def run(self, component, inputs, params):
        if component == "attention" and "wo_b.scale" in inputs:
            scale = inputs["wo_b.scale"]
            inputs = {**inputs, "wo_b.scale": scale[:, :1].expand_as(scale).contiguous()}
        return super().run(component, inputs, params)


MUTANTS = {  # class -> the stage that holds its bug
    SinkLeftOut: "o",
    NormBf16BeforeWeight: "qr",
    ScoresWithoutRelu: "index_scores",
    WindowNewestFirst: "window_ids",
    OutputScaled: "out",
    Fp8Block64: "window_rows",
    Bf16KvScale: "compress_rows",
    RopeOnFirstDims: "kv",
    WoBRowScales: "out",
}
# With fp8 weights, qr and kv come from fp8 GEMMs whose 14-bit accumulation may flip as many bf16 roundings
# as the norm's extra one (the accumulator model, docs/verdicts.md "GPU arithmetic"): the RMSNorm bug shows
# first where the GEMM before the norm is bf16, the compressor's latent.
FP8_STAGES = {NormBf16BeforeWeight: "latent"}
BARE = {cls: bare(cls) for cls in MUTANTS}
