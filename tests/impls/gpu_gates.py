"""The GPU-arithmetic gates of gpu_arith.py hosted on the reference instead of upstream's torch ops, so
they run every schedule the harness defines (chunked prefill, multi-token decode, rollbacks), where
UpstreamTorch declines the ones upstream never runs. Each model of a gate replaces the one reference
function that computes the same step (docs/verdicts.md, "GPU arithmetic"):

| model | reference function it replaces |
|---|---|
| fp8_accumulate (an fp8 GEMM's block sums and their promotion) | fp8_linear.fp8_gemm |
| bf16_matmul (a bf16 GEMM on tensor cores) | numerics._accumulate of bf16 operands; attention.output_rank |
| index_logits (the MQA logits) | indexer._scores_and_terms |
| softmax (sparse attention's online softmax) | sparse_attn.sparse_attn |
| norm (RMSNorm's sum of squares and rsqrt) | numerics.rms_norm |
| group_exp (the compressor's group softmax) | compressor.pool_group |

`GATES` and `MUTANTS` mirror gpu_arith's. Run one: `conformance run --impl tests/impls/gpu_gates.py:AllGpu`.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

import gpu_arith as ga
import upstream_ops as up
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.diagnosis.patching import replaced

REF = "v41_conformance.reference"


def _fp8_gemm(model):
    def make(original):
        def fp8_gemm(x_codes, x_scales, weight):
            bytes_ = ((x_scales.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
            q = up.Quantised(None, x_codes.reshape(-1, x_codes.shape[-1]), bytes_.reshape(-1, bytes_.shape[-1]))
            acc = model(ga.fp8_operands(q, weight.codes, weight.scale_bytes))
            return acc.float().reshape(*x_codes.shape[:-1], weight.shape[0])

        return fp8_gemm

    return make


def _bf16_accumulate(model):
    def make(original):
        def accumulate(x, w):
            if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
                return original(x, w)
            return model(x.reshape(-1, x.shape[-1]), w).float().reshape(*x.shape[:-1], w.shape[0])

        return accumulate

    return make


def _output_rank(model):
    def make(original):
        def output_rank(o, wo_a, cfg):
            lead = o.shape[:-2]
            groups = o.reshape(-1, cfg.o_groups, o.shape[-2] * o.shape[-1] // cfg.o_groups)
            w = wo_a.view(cfg.o_groups, cfg.o_lora_rank, -1)
            z = [model(groups[:, g].contiguous(), w[g]) for g in range(cfg.o_groups)]
            return torch.stack(z, 1).to(torch.bfloat16).reshape(*lead, -1)

        return output_rank

    return make


def _scores(model):
    def make(original):
        def scores_and_terms(q, k, w, with_terms):
            terms = original(q, k, w, True)[1] if with_terms else None
            return model(q, k, w) + 0.0, terms

        return scores_and_terms

    return make


def _sparse_attn(arith):
    return lambda original: lambda q, kv, sink, ids, scale: ga.sparse_attention(q, kv, sink, ids, scale, arith)


def _pool_group(exp):
    def make(original):
        def pool_group(group):
            pooled = ga.pool_groups_with(exp)(group[:, :, 1], group[:, :, 0], 1)
            return pooled.float()

        return pool_group

    return make


def reference_patches(gate: type) -> dict[str, object]:
    """reference target -> a maker of its replacement, for every model `gate` (a gpu_arith gate) uses."""
    swap: dict[str, object] = {}
    if gate.fp8_accumulate is not None:
        swap[f"{REF}.fp8_linear:fp8_gemm"] = _fp8_gemm(gate.fp8_accumulate)
    if gate.bf16_matmul is not None:
        swap[f"{REF}.numerics:_accumulate"] = _bf16_accumulate(gate.bf16_matmul)
        swap[f"{REF}.attention:output_rank"] = _output_rank(gate.bf16_matmul)
    if gate.index_logits is not None:
        swap[f"{REF}.indexer:_scores_and_terms"] = _scores(gate.index_logits)
    if gate.softmax is not None:
        swap[f"{REF}.sparse_attn:sparse_attn"] = _sparse_attn(gate.softmax)
    if gate.norm is not None:
        swap[f"{REF}.numerics:rms_norm"] = lambda original, norm=gate.norm: norm.rms_norm
    if gate.group_exp is not None:
        swap[f"{REF}.compressor:pool_group"] = _pool_group(gate.group_exp)
    return swap


def on_reference(gate: type) -> type:
    """`gate` (a gpu_arith gate or mutant) with its models in the reference's place."""

    class OnReference(ReferenceAdapter):
        models = gate

        def run(self, component, inputs, params):
            with ExitStack() as stack:
                for target, make in reference_patches(gate).items():
                    stack.enter_context(replaced(target, make))
                return super().run(component, inputs, params)

    OnReference.__name__ = OnReference.__qualname__ = gate.__name__
    OnReference.__doc__ = f"{gate.__doc__} (on the reference: every schedule)"
    return OnReference


GATES = {name: on_reference(cls) for name, cls in ga.GATES.items()}
MUTANTS = {
    name: on_reference(spec.cls)
    for name, spec in ga.MUTANTS.items()
    if name in ("Fp8Tc14NoPromotion", "Fp8BlockSumsBf16", "Bf16GemmBf16Accumulator", "IndexLogitsHeadSumBf16")
}
globals().update(GATES)
globals().update(MUTANTS)
