"""Indexer, candidate and address implementations with one deliberate bug each (and one that
is merely computed in float64), built on the reference for everything else.

tests/test_components_indexer.py runs them through the real CLI and checks that exactly the
affected cases fail, with messages that name the query row and the differing ids.
"""

from __future__ import annotations


import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from patching import patched
from v41_conformance.reference import address as ad
from v41_conformance.reference import candidates as cd
from v41_conformance.reference import indexer as ix

NINF = float("-inf")


def lowest_index_topk(values, k, dim=-1, largest=True, sorted=True):
    """Top-k that keeps the lowest indices among ties (CUDA-like), instead of torch's CPU order."""
    order = torch.sort(values.float(), dim=dim, descending=largest, stable=True).indices
    idx = order.narrow(dim, 0, k)
    return values.gather(dim, idx), idx


class PrefixOffByOne(ReferenceAdapter):
    """Query at position p sees (p + 2) // r compressed rows instead of (p + 1) // r."""

    def run(self, component, inputs, params):
        def lens(start, seqlen, ratio):
            return torch.div(torch.arange(start + 2, start + seqlen + 2), ratio, rounding_mode="floor")

        with patched(ix, "query_compress_lens", lens):
            return super().run(component, inputs, params)


def _select_whole_buffer(scores, compress_lens, k_max, offset=0):
    """Top-k over every stored score, the valid prefix applied only afterwards (the bug)."""
    S, T = scores.shape[1], scores.shape[2]
    lens = torch.as_tensor(compress_lens).reshape(S, 1)
    _, picked = torch.topk(scores, min(k_max, T), dim=-1, sorted=False)
    picked = picked.sort(dim=-1).values
    return ix.TopkSelection(torch.where(picked < lens, picked + offset, -1).to(torch.int32), scores)


class WholeBufferSelect(ReferenceAdapter):
    """Selects over the whole score buffer (future and unwritten rows included), then maps ids
    at or past the valid prefix to -1: large stale scores crowd out valid rows."""

    def run(self, component, inputs, params):
        if component == "indexer.select":
            with patched(ix, "select_topk", _select_whole_buffer):
                return super().run(component, inputs, params)
        if component == "indexer":
            out = super().run(component, inputs, params)
            scores = out["scores"].masked_fill(~inputs["candidates"], NINF)  # no visibility mask
            lens = ix.query_compress_lens(int(params["start"]), scores.shape[1], int(params["ratio"]))
            ids = _select_whole_buffer(scores, lens, int(params["index_topk"]), int(params["offset"])).ids
            return {**out, "ids": ids}
        return super().run(component, inputs, params)


class LowestIndexTies(ReferenceAdapter):
    """Breaks top-k ties by lowest index (as CUDA tends to), for rows and for candidate blocks:
    differs only in tie order."""

    def run(self, component, inputs, params):
        with patched(ix, "torch_cpu_topk", lowest_index_topk), patched(cd, "torch_cpu_topk", lowest_index_topk):
            return super().run(component, inputs, params)


class OtherLeakPolicy(ReferenceAdapter):
    """Follows the other candidate_leak policy than the case's: drop where it leaks, leak where it drops."""

    def run(self, component, inputs, params):
        if "candidate_leak" in params or component in ("indexer", "indexer.select"):
            other = "drop" if params.get("candidate_leak", "upstream") == "upstream" else "upstream"
            params = {**params, "candidate_leak": other}
        return super().run(component, inputs, params)


class UnpinnedCandidates(ReferenceAdapter):
    """Ranks candidate blocks by their maximum only: the newest reachable block is not pinned."""

    def run(self, component, inputs, params):
        if component != "candidates.select":
            return super().run(component, inputs, params)
        no_pin = torch.zeros_like(inputs["compress_lens"])  # compress_lens 0 pins nothing
        top, block = int(params["topk_blocks"]), int(params["block_size"])
        sel = cd.select_candidate_blocks(inputs["logits"], no_pin, top, block)
        return {"mask": sel.mask}


class PartialBlockMask(ReferenceAdapter):
    """Drops the last row of every kept block of two or more rows from the candidate mask."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "candidates.select":
            block = int(params["block_size"])
            mask = out["mask"].clone()
            last = torch.arange(mask.shape[-1]) % block == block - 1
            out["mask"] = mask & ~(last if block > 1 else torch.zeros_like(last))
        return out


class DecodeAddressWithB(ReferenceAdapter):
    """Decode addresses with B rows per allocator block instead of B / r."""

    def run(self, component, inputs, params):
        if component != "address.decode":
            return super().run(component, inputs, params)
        B, r = int(params["block_size"]), int(params["ratio"])
        return {"slots": ad.address_decode(inputs["ids"], inputs["block_table"], B * r, r)}  # B*r / r = B rows


def _to_bf16_via_f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)  # float64 -> bf16 in one rounding (no fp32 step)


class Float64Indexer(ReferenceAdapter):
    """indexer.weights and indexer.scores in float64, rounded to bf16 at upstream's points: passes."""

    def run(self, component, inputs, params):
        if component == "indexer.weights":
            x, wp = inputs["x"].double(), inputs["weights_proj"].double()
            H, D = wp.shape[0], int(params["index_head_dim"])
            y = _to_bf16_via_f64(x @ wp.T)
            return {"weights": _to_bf16_via_f64(y.double() * (D**-0.5 * H**-0.5))}
        if component == "indexer.scores":
            q, k, w = inputs["q"].double(), inputs["k"].double(), inputs["w"].double()
            dots = _to_bf16_via_f64(torch.einsum("bshd,btd->bsht", q, k)).double().relu()
            terms = _to_bf16_via_f64(dots * w[..., None]).double()
            return {"scores": _to_bf16_via_f64(terms.sum(dim=2)) + 0.0}
        return super().run(component, inputs, params)


def _scores(
    inputs, rounded_dots: bool = True, relu: bool = True, heads: slice = slice(None), bf16_head_sum: bool = False
):
    """indexer.scores with upstream's rounding points unless a flag says otherwise."""
    q, k, w = inputs["q"].double()[:, :, heads], inputs["k"].double(), inputs["w"].double()[:, :, heads]
    dots = torch.einsum("bshd,btd->bsht", q, k)
    if rounded_dots:
        dots = dots.float().to(torch.bfloat16).double()
    if relu:
        dots = dots.relu()
    terms = (dots * w[..., None]).to(torch.bfloat16)
    if bf16_head_sum:
        total = torch.zeros_like(terms[:, :, 0])
        for h in range(terms.shape[2]):
            total = total + terms[:, :, h]  # bf16 + bf16 rounds at every head
        return {"scores": total + 0.0}
    return {"scores": terms.double().sum(dim=2).float().to(torch.bfloat16) + 0.0}


class ScoresVariant(ReferenceAdapter):
    """indexer.scores computed by `_scores` with `options` (other components: the reference)."""

    options: dict = {}

    def run(self, component, inputs, params):
        if component == "indexer.scores":
            return _scores(inputs, **self.options)
        return super().run(component, inputs, params)


class Bf16HeadSum(ScoresVariant):
    """Sums the head terms in a bf16 running sum (rounded at every head) instead of fp32."""

    options = {"bf16_head_sum": True}


class ScoresWithoutRelu(ScoresVariant):
    """Leaves out the ReLU: negative head dots pull the score down."""

    options = {"relu": False}


class ScoresDropLastHead(ScoresVariant):
    """Sums every head but the last."""

    options = {"heads": slice(0, -1)}


class ScoresUnroundedDots(ScoresVariant):
    """Keeps each head's dot product in fp32 (no bf16 rounding before the weight): a departure
    from upstream's rounding points by half an ulp of each dot, which the term allowance absorbs."""

    options = {"rounded_dots": False}


def _weights_without_softmax_scale(x, weights_proj, index_head_dim, index_n_heads):
    return (x.float() @ weights_proj.float().T).to(torch.bfloat16) * index_n_heads**-0.5


def _fp32_scores_scaled_after(q, k, w):
    dots = torch.einsum("bshd,btd->bsht", q.float(), k.float()).relu()  # fp32 through the head sum
    total = (dots * w.float().unsqueeze(-1)).sum(dim=2)
    return (total * q.shape[-1] ** -0.5).to(torch.bfloat16) + 0.0


class SoftmaxScaleOnScores(ReferenceAdapter):
    """A port in the transformers manner: head weights scaled by n_heads^-0.5 only, scores in fp32
    with softmax_scale applied to them (upstream folds it into the bf16 head weights)."""

    def run(self, component, inputs, params):
        with (
            patched(ix, "head_weights", _weights_without_softmax_scale),
            patched(ix, "index_scores", _fp32_scores_scaled_after),
        ):
            return super().run(component, inputs, params)


def _argpartition_topk(values, k, dim=-1, largest=True, sorted=True):
    """MLX's CPU argpartition of -values at kth = k - 1 (std::nth_element under the order (value, index)):
    the k largest, ties to the lowest index, in no particular order."""
    keyed = torch.sort(values.float(), dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)
    scrambled = keyed.flip(dim) if k > 1 else keyed  # nth_element leaves the selected ids unordered
    return values.gather(dim, scrambled), scrambled


class ArgpartitionTies(ReferenceAdapter):
    """Selects the indexer's top-k with MLX-style argpartition: same set as lowest-index ties."""

    def run(self, component, inputs, params):
        with patched(ix, "torch_cpu_topk", _argpartition_topk):
            return super().run(component, inputs, params)


__all__ = [
    "ArgpartitionTies",
    "SoftmaxScaleOnScores",
    "Bf16HeadSum",
    "ScoresDropLastHead",
    "ScoresUnroundedDots",
    "ScoresWithoutRelu",
    "DecodeAddressWithB",
    "Float64Indexer",
    "LowestIndexTies",
    "OtherLeakPolicy",
    "PartialBlockMask",
    "PrefixOffByOne",
    "UnpinnedCandidates",
    "WholeBufferSelect",
    "lowest_index_topk",
]


class LowestIndexBlockTies(ReferenceAdapter):
    """Breaks ties between candidate blocks by the lowest block id (the indexer's own top-k is
    torch's): differs from the reference only in which of two equally scored blocks it keeps."""

    def run(self, component, inputs, params):
        with patched(cd, "torch_cpu_topk", lowest_index_topk):
            return super().run(component, inputs, params)
