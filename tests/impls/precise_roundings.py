"""Correct forms that drop one internal rounding of the reference at a time (more precision never fails,
docs/verdicts.md "GPU arithmetic"); every output keeps its dtype and its final rounding.

| form | the reference's rounding it drops |
|---|---|
| `ExactHeadDots` | each index head's dot product q.k rounded to bf16 before its ReLU (indexer.py) |
| `ExactHeadProducts` | each head's ReLU'd dot times its weight rounded to bf16 before the head sum |
| `TiledFp32P` (attention_cores.py) | sparse attention's P rounded to bf16 before P.V |
| `ExactPooledRow` | the compressor's pooled latent (ratio 1: wkv's output) rounded to bf16 before its RMSNorm |
| `ExactZ` | attention's `z` (wo_a's fp32 accumulator) rounded to bf16 before wo_b (its act_quant, fp8) |

The index forms replace the reference's `indexer._scores_and_terms` (the scores; the term scales the
verdict needs come from the reference), so they run in `indexer`, `indexer.scores` and inside `attention`.
`ExactPooledRow` replaces `compressor.finish_row`: it runs in `compressor` and inside `attention`.
`ExactZ` replaces `attention.output_rank` and the `project` that takes its z: it runs inside `attention` only
(the `z` it returns is still bf16, the value wo_b read is not).
"""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.diagnosis.patching import replaced
from v41_conformance.reference.attention import output_rank_acc
from v41_conformance.reference.fp8_linear import project_unrounded
from v41_conformance.reference.numerics import rms_norm

TARGET = "v41_conformance.reference.indexer:_scores_and_terms"
ROW = "v41_conformance.reference.compressor:finish_row"
RANK = "v41_conformance.reference.attention:output_rank"
PROJECT = "v41_conformance.reference.attention:project"


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, round_dots: bool, round_products: bool):
    """bf16 [b, S, T]: sum over heads of w_h relu(q_h . k), the dot exact (float64) then fp32, each of the
    two intermediate bf16 roundings kept or dropped, the sum exact, one final rounding (-0 made +0)."""
    dots = torch.einsum("bshd,btd->bsht", q.double(), k.double()).float()
    s = (dots.to(torch.bfloat16).float() if round_dots else dots).relu()
    p = s * w.float()[..., None]
    p = p.to(torch.bfloat16).float() if round_products else p
    return p.double().sum(dim=2).float().to(torch.bfloat16) + 0.0


class _Dropped(ReferenceAdapter):
    round_dots = True
    round_products = True

    def run(self, component, inputs, params):
        def make(original):
            def scores_and_terms(q, k, w, with_terms):
                terms = original(q, k, w, True)[1] if with_terms else None
                return index_scores(q, k, w, self.round_dots, self.round_products), terms

            return scores_and_terms

        with replaced(TARGET, make):
            return super().run(component, inputs, params)


class ExactHeadDots(_Dropped):
    """Each head's dot product kept in fp32 into its ReLU and weight (one rounding fewer)."""

    round_dots = False


class ExactHeadProducts(_Dropped):
    """Each head's weighted term kept in fp32 into the head sum (one rounding fewer)."""

    round_products = False


class ExactPooledRow(ReferenceAdapter):
    """The compressor's fp32 pooled latent (ratio 1: the wkv accumulator) into RMSNorm unrounded, one cast to
    bf16 after it (the reference casts to bf16 first, then norms)."""

    def run(self, component, inputs, params):
        def finish_row(pooled, weights):
            return rms_norm(pooled.float(), weights.norm_w, weights.eps).to(torch.bfloat16)

        with replaced(ROW, lambda original: finish_row):
            return super().run(component, inputs, params)


class ExactZ(ReferenceAdapter):
    """wo_a's fp32 accumulator into wo_b unrounded (its act_quant with the fp8 checkpoint); the z it returns is
    still that accumulator rounded to bf16 once (the reference rounds z, then projects the rounded z)."""

    @staticmethod
    def wo_b(acc: torch.Tensor, weight) -> torch.Tensor:
        """bf16 out from z's fp32 accumulator (wrong_fp8.py's fused-kernel bugs replace it)."""
        return project_unrounded(acc, weight)

    def run(self, component, inputs, params):
        exact: dict[int, torch.Tensor] = {}  # id(the bf16 z returned) -> its fp32 accumulator

        def output_rank(o, wo_a, cfg):
            acc = output_rank_acc(o, wo_a, cfg)
            z = acc.to(torch.bfloat16)
            exact[id(z)] = acc
            return z

        def make_project(original):
            def project(x, weight):
                acc = exact.pop(id(x), None)
                return original(x, weight) if acc is None else self.wo_b(acc, weight)

            return project

        with replaced(RANK, lambda original: output_rank), replaced(PROJECT, make_project):
            return super().run(component, inputs, params)
