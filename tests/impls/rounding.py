"""Correct implementations that round differently from the reference, for the verdict tests.

`NearTieScores` is the indexer of a port whose bf16 index scores come out one ulp apart from the
reference's (another accumulation order, as on a GPU): wherever the k-th and (k+1)-th visible
scores of a query are at most one bf16 ulp apart (and not equal), its scores have the two values
exchanged, so its scores stay within their 1-ulp tolerance and its top-k picks the other id. Its
ids are judged given its own scores, so it passes (docs/verdicts.md, "The chain");
`NearTieSelection` reports the reference's scores instead, so the same ids are near ties
(docs/index-verdicts.md).
"""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import indexer as ix
from v41_conformance.ulps import ulp_of
from patching import patched


def swap_near_boundary(scores: torch.Tensor, lens: torch.Tensor, k: int) -> torch.Tensor:
    """scores bf16 [b, S, T] with the k-th and (k+1)-th visible values of each query exchanged
    where they differ by at most one bf16 ulp (lens int64 [S]: visible rows per query)."""
    out = scores.clone()
    visible = torch.arange(scores.shape[-1]) < lens[:, None]  # [S, T]
    for b in range(scores.shape[0]):
        for t in range(scores.shape[1]):
            row = scores[b, t].float().masked_fill(~visible[t], float("-inf"))
            if int(visible[t].sum()) <= k:
                continue
            values, ids = torch.sort(row, descending=True, stable=True)
            kth, nxt = values[k - 1], values[k]
            if 0 < float(kth - nxt) <= float(ulp_of(kth, torch.bfloat16)):
                out[b, t, ids[k - 1]], out[b, t, ids[k]] = scores[b, t, ids[k]], scores[b, t, ids[k - 1]]
    return out


class NearTieScores(ReferenceAdapter):
    """Scores one ulp apart at the k-th place, and the top-k of those scores: a correct port (its
    selection is exactly the reference's selection of its own scores, which are within tolerance)."""

    def run(self, component, inputs, params):
        if component != "indexer":
            return super().run(component, inputs, params)
        lens = ix.query_compress_lens(int(params["start"]), inputs["x"].shape[1], int(params["ratio"]))
        exact = ix.index_scores

        def one_ulp_apart(q, k, w):
            return swap_near_boundary(exact(q, k, w), lens, int(params["index_topk"]))

        with patched(ix, "index_scores", one_ulp_apart):
            return super().run(component, inputs, params)


class NearTieSelection(NearTieScores):
    """Returns the reference's scores but selects from scores one ulp apart at the k-th place (a
    kernel whose selection ranks other values than the scores it reports): near ties, which fail
    unless the implementation opts into `accept_near_ties`."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "indexer":
            out["scores"] = ReferenceAdapter().run(component, inputs, params)["scores"]
        return out


class NarrowAccumulatorFp8(ReferenceAdapter):
    """linear.fp8 as an fp8 tensor core may compute it: each K block's 32 products summed one by
    one in a 14-bit truncating accumulator, then scaled and added in fp32 (a correct kernel)."""

    def run(self, component, inputs, params):
        if component != "linear.fp8":
            return super().run(component, inputs, params)
        from v41_conformance.reference import fp8_linear as fp8
        from v41_conformance.reference import numerics as nx

        q = nx.fp8_qdq_ue8m0(inputs["x"])
        codes, scales = inputs["weight"], inputs["weight_scale"]
        n, k = codes.shape
        qa, qw = fp8.e4m3_value(q.codes).double(), fp8.e4m3_value(codes).double()
        sw = nx.e8m0_value(scales).repeat_interleave(fp8.BLOCK, 0)[:n]
        acc = torch.zeros(qa.shape[0], n)
        for kb in range(k // fp8.BLOCK):
            block = torch.zeros(qa.shape[0], n, dtype=torch.float64)
            for c in range(kb * fp8.BLOCK, (kb + 1) * fp8.BLOCK):
                block = _truncate(block + qa[:, c : c + 1] * qw[:, c][None, :], 14)
            acc = acc + block.float() * q.scales[:, kb : kb + 1] * sw[:, kb][None, :]
        return {"y": acc.to(torch.bfloat16), "x_codes": q.codes, "x_scale_bytes": q.scale_bytes}


def _truncate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded toward zero to `bits` fraction bits."""
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.trunc(mantissa * 2.0**bits) / 2.0**bits, exponent)
