"""sparse_attn and attention implementations with one deliberate bug each (or none: PlainSoftmax).

Each is the reference with one thing changed, so a test can check that exactly the affected
outputs fail, at the step where the bug first matters. Module attributes of the reference are
swapped only for the duration of one call (the runner calls one case at a time).
"""

from __future__ import annotations


import torch

import v41_conformance.reference.attention as ref_attention
import v41_conformance.reference.sparse_attn as ref_sparse
from v41_conformance.adapters.reference import ReferenceAdapter
from patching import patched


class PlainSoftmax(ReferenceAdapter):
    """Correct, but one fp32 softmax over all lanes (no tiles, no bf16 P): must pass.

    With the fp8 checkpoint wo_b re-quantises the attention output per 32-block (act_quant), and
    the plain softmax's other rounding of o moves whole blocks by fp8 steps; it returns its
    intermediates (o, z, ...), so out is judged given its own z (docs/verdicts.md, "The chain")."""

    def run(self, component, inputs, params):
        if component == "sparse_attn":
            return {
                "o": ref_sparse.sparse_attn_plain(
                    inputs["q"], inputs["kv"], inputs["attn_sink"], inputs["topk_idxs"], float(params["softmax_scale"])
                )
            }
        if component == "attention":
            with patched(ref_attention, "sparse_attn", ref_sparse.sparse_attn_plain):
                return super().run(component, inputs, params)
        return super().run(component, inputs, params)


class SinkScaled(ReferenceAdapter):
    """The sink logit multiplied by softmax_scale like the scores (it is a raw logit)."""

    def run(self, component, inputs, params):
        if component == "sparse_attn":
            scale = float(params["softmax_scale"])
            return {
                "o": ref_sparse.sparse_attn(
                    inputs["q"], inputs["kv"], inputs["attn_sink"] * scale, inputs["topk_idxs"], scale
                )
            }
        return super().run(component, inputs, params)


class NaNOnAbsentRows(ReferenceAdapter):
    """Running max started at -inf (V4's kernel): a row or tile with every lane absent gives NaN."""

    def run(self, component, inputs, params):
        if component == "sparse_attn":
            with patched(ref_sparse, "M_INIT", float("-inf")):
                return super().run(component, inputs, params)
        return super().run(component, inputs, params)


class WrongOffset(ReferenceAdapter):
    """Compressed ids offset by the chunk length S (the prefill rule) at every step: right at
    prefill (window part = S rows), wrong from the first decode step (window part = win rows)."""

    def run(self, component, inputs, params):
        if component != "attention":
            return super().run(component, inputs, params)
        original = ref_attention.indexer_forward

        def shifted(x, qr, keys, start, ratio, weights, table, rope_dim, topk, offset, candidates=None):
            return original(x, qr, keys, start, ratio, weights, table, rope_dim, topk, x.shape[1], candidates)

        with patched(ref_attention, "indexer_forward", shifted):
            return super().run(component, inputs, params)


class OwnEmptyIndexKeys(ReferenceAdapter):
    """A Reindex layer (an index source without keys of its own) scores against its own, empty
    index-key cache instead of the keys published in the shared runtime."""

    def run(self, component, inputs, params):
        if component == "attention" and params["role"]["mode"] == "Reindex" and "rt.index_k" in inputs:
            inputs = {**inputs, "rt.index_k": torch.zeros_like(inputs["rt.index_k"])}
        return super().run(component, inputs, params)


class NoInverseRope(ReferenceAdapter):
    """Skips the inverse RoPE on the attention output's last rope dims."""

    def run(self, component, inputs, params):
        if component != "attention":
            return super().run(component, inputs, params)
        original = ref_attention.apply_rotary

        def rotary(x, table, rope_dim, inverse=False):
            return x.clone() if inverse else original(x, table, rope_dim)

        with patched(ref_attention, "apply_rotary", rotary):
            return super().run(component, inputs, params)


class OtherIndexKPolicy(ReferenceAdapter):
    """Runs the other §10.1 policy than the golden's (upstream <-> fixed)."""

    def run(self, component, inputs, params):
        if component == "attention":
            other = {"upstream": "fixed", "fixed": "upstream"}[params["index_k_policy"]]
            params = {**params, "index_k_policy": other}
        return super().run(component, inputs, params)


def _bf16_scale(q, kv, attn_sink, ids, softmax_scale):
    """The reference kernel with its softmax scale held in bf16 (an added rounding of a constant: 1 + 1.1e-4
    at head_dim 128 and 512, exact at 64 and 256)."""
    return ref_sparse.sparse_attn(q, kv, attn_sink, ids, float(torch.tensor(softmax_scale, dtype=torch.bfloat16)))


class ScaleBf16(ReferenceAdapter):
    """BUG: the softmax scale held in bf16, in sparse_attn and inside attention."""

    def run(self, component, inputs, params):
        if component == "sparse_attn":
            return {
                "o": _bf16_scale(
                    inputs["q"], inputs["kv"], inputs["attn_sink"], inputs["topk_idxs"], float(params["softmax_scale"])
                )
            }
        if component == "attention":
            with patched(ref_attention, "sparse_attn", _bf16_scale):
                return super().run(component, inputs, params)
        return super().run(component, inputs, params)
