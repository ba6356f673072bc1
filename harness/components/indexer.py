"""Indexer components: head weights, bf16 index scores, the top-k selection, the whole forward.

Upstream `Indexer.forward` (M:527-580); docs/v41-reference.md §4.2, §4.4, §7, §10.3; the
reference is `harness/reference/indexer.py`. How the ids are judged: docs/index-verdicts.md.

- `indexer.weights`: w = weights_proj(x) * index_head_dim^-0.5 * index_n_heads^-0.5 (M:555).
- `indexer.scores`: Σ_h bf16(relu(bf16(q_h · k_j)) * w_h), bf16 out (M:556-557).
- `indexer.select`: visibility (start + t + 1) // ratio, candidate masking, torch CPU top-k,
  ascending ids + offset, -1 tail (M:563-580). Its input is the reference's own scores, so
  the selection is judged apart from the score rounding.
- `indexer`: wq_b, RoPE, fp4 QDQ, head weights, scores, visibility, candidates, top-k.

Quirk policy (golden metadata `params.candidate_leak`, docs §4.4 / §10.2): `upstream`
(default) returns reachable rows that candidate masking set to -inf as valid ids when the
kept pool is smaller than k; `drop` returns -1 for them (a runtime that scores only inside the
kept blocks, seed A.4.2).
"""

from __future__ import annotations

import torch

from ..errors import CaseSpecError
from ..reference import candidates as cd
from ..reference.fp8_linear import quantise_inputs, weight_input
from ..reference import indexer as ix
from ..reference import numerics as nx
from ..reference import rope as rp
from ..chain.indexer import judge_indexer
from ..precision import EXACT, EXACT_ERROR
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from .build import need, normal
from ..reference.numerics import randn

NINF = float("-inf")
LEAK_POLICIES = ix.LEAK_POLICIES
SCORE_KINDS = ("normal", "levels", "constant", "relu", "ninf_runs")

SELECT_PARAMS = (
    P("start", "int", "position of the chunk's first query", "positions"),
    P("ratio", "int", "compress ratio (1 or 2)", choices=(1, 2)),
    P("index_topk", "int", "compressed rows kept per query (512 in production)"),
    P("offset", "int", "added to every selected row id: the window part's length", "rows", required=False, default=0),
    P(
        "candidate_leak",
        "str",
        "the §4.4 quirk policy: upstream (bit-faithful) or drop",
        required=False,
        choices=("upstream", "drop"),
        default="upstream",
    ),
)
INDEX_DIMS = {
    "b": "batch",
    "S": "queries in the chunk",
    "T": "compressed rows, (start + S) // ratio",
    "k": "min(index_topk, T)",
    "H": "index heads",
    "D": "index_head_dim",
    "dim": "hidden size",
    "q_lora": "q_lora_rank",
    "rows": "cache rows (>= T; rows >= T are never read)",
    "rope/2": "rotated pairs",
    "2": "(cos, sin)",
    "N/32": "ceil(H*D/32)",
    "q_lora/32": "tiles along K",
}


# --- shared pieces ---------------------------------------------------------------------------


def _int(params: dict, key: str, component: str) -> int:
    if key not in params:
        raise CaseSpecError(f"{component}: params needs '{key}'")
    return int(params[key])


def _lens(params: dict, seqlen: int, component: str) -> torch.Tensor:
    """int64 [S]: compressed rows each query sees, (start + t + 1) // ratio."""
    return ix.query_compress_lens(_int(params, "start", component), seqlen, _int(params, "ratio", component))


def _leak_policy(params: dict) -> str:
    policy = str(params.get("candidate_leak", "upstream"))
    if policy not in LEAK_POLICIES:
        raise CaseSpecError(f"candidate_leak must be one of {LEAK_POLICIES}, not {policy!r}")
    return policy


def _masked(scores: torch.Tensor, lens: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """What top-k ranks: rows >= lens[t] and non-candidates at -inf. bf16 [b, S, T]."""
    T = scores.shape[-1]
    visible = scores.masked_fill(torch.arange(T) >= lens[:, None], NINF)
    return visible.masked_fill(~candidates, NINF)


def _source_mask(spec, like: torch.Tensor, lens: torch.Tensor, gen: torch.Generator, component: str) -> torch.Tensor:
    """Candidate mask bool [b, S, T] for a consumer case (all True when spec is None).

    spec: {"rows": [[...]]} explicit flags (repeated over queries), or {"block_size": B,
    "topk_blocks": n} for the mask a candidate source computes from its own random scores.
    """
    b, S, T = like.shape
    if spec is None:
        return torch.ones((b, S, T), dtype=torch.bool)
    if "rows" in spec:
        flags = torch.tensor(spec["rows"], dtype=torch.bool).reshape(-1, T)
        return flags.repeat(-(-(b * S) // flags.shape[0]), 1)[: b * S].reshape(b, S, T)
    source = normal(gen, [b, S, T]).masked_fill(torch.arange(T) >= lens[:, None], NINF)
    block, top = int(need(spec, "block_size", component)), int(need(spec, "topk_blocks", component))
    return cd.select_candidate_blocks(source, lens, top, block).mask


# --- indexer.weights -------------------------------------------------------------------------


def _weights_inputs(params, build, gen):
    if build.get("kind") == "values":  # explicit x [b, S, dim], weights_proj [H, dim]
        as_bf16 = lambda key: torch.tensor(need(build, key, "indexer.weights"), dtype=torch.float32).to(torch.bfloat16)
        return {"x": as_bf16("x"), "weights_proj": as_bf16("weights_proj")}
    b, S, dim = (int(v) for v in need(build, "shape", "indexer.weights"))
    H = int(need(build, "heads", "indexer.weights"))
    x = normal(gen, [b, S, dim], float(build.get("x_scale", 1.0)))
    weights_proj = normal(gen, [H, dim], float(build.get("w_scale", dim**-0.5)))
    return {"x": x, "weights_proj": weights_proj}


def _weights_reference(inputs, params):
    wp = inputs["weights_proj"]
    D = _int(params, "index_head_dim", "indexer.weights")
    return {"weights": ix.head_weights(inputs["x"], wp, D, wp.shape[0])}


register(
    Component(
        name="indexer.weights",
        summary="head weights: bf16 weights_proj(x) times index_head_dim^-0.5 * index_n_heads^-0.5",
        upstream="M:555",
        inputs=(T("x", "bf16", "b S dim"), T("weights_proj", "bf16", "H dim")),
        outputs=(
            OutputSpec(
                "weights",
                "bf16",
                "the multiplier index_head_dim^-0.5 * H^-0.5 is a Python float applied "
                "to the bf16 linear output (torch's bf16 * scalar)",
                "bf16",
                "b S H",
            ),
        ),
        params=(P("index_head_dim", "int", "D, for the multiplier"),),
        dims=INDEX_DIMS,
        build=_weights_inputs,
        reference=_weights_reference,
        floor=2,
    )
)


# --- indexer.scores --------------------------------------------------------------------------


def _scores_inputs(params, build, gen):
    if build.get("kind") == "values":  # explicit q [b, S, H, D], k [b, T, D], w [b, S, H]
        as_bf16 = lambda key: torch.tensor(need(build, key, "indexer.scores"), dtype=torch.float32).to(torch.bfloat16)
        return {"q": as_bf16("q"), "k": as_bf16("k"), "w": as_bf16("w")}
    b, S, H, D, T = (int(v) for v in need(build, "shape", "indexer.scores"))
    q = normal(gen, [b, S, H, D], float(build.get("q_scale", 1.0)))
    k = normal(gen, [b, T, D], float(build.get("k_scale", 1.0)))
    if build.get("qdq", True):  # what the indexer scores: post-RoPE fp4 round trips
        q, k = nx.fp4_qdq_e8m0(q, ix.FP4_BLOCK).y, nx.fp4_qdq_e8m0(k, ix.FP4_BLOCK).y
    w = normal(gen, [b, S, H], float(build.get("w_scale", (H * D) ** -0.5)))
    if build.get("positive_w", False):
        w = w.abs()
    return {"q": q, "k": k, "w": w}


def _scores_with_terms(inputs, params):
    scores, largest = ix.index_scores_with_terms(inputs["q"], inputs["k"], inputs["w"])
    return {"scores": scores}, {"term_scale": largest}


register(
    Component(
        name="indexer.scores",
        summary="bf16 index scores: sum over heads of bf16(relu(bf16(q_h . k)) * w_h), fp32 sums",
        upstream="M:556-557",
        inputs=(
            T("q", "bf16", "b S H D", "post-RoPE, fp4-QDQ'd queries"),
            T("k", "bf16", "b T D", "index keys"),
            T("w", "bf16", "b S H", "head weights"),
        ),
        outputs=(
            OutputSpec(
                "scores",
                "bf16",
                "einsum rounded to bf16, ReLU, product rounded, head sum rounded; zeros "
                "are +0; judged within 1 ulp plus an allowance in bf16 ulps of the largest head term "
                "(aux.term_scale), or no farther from the exact scores than the reference's own roundings",
                "bf16",
                "b S T",
                terms="term_scale",
                precision=True,
            ),
        ),
        dims=INDEX_DIMS,
        build=_scores_inputs,
        reference=lambda inputs, params: {"scores": ix.index_scores(inputs["q"], inputs["k"], inputs["w"])},
        reference_with_aux=_scores_with_terms,
        judge_context=lambda inputs, params: dict(
            zip(
                ("scores" + EXACT, "scores" + EXACT_ERROR), ix.exact_index_scores(inputs["q"], inputs["k"], inputs["w"])
            )
        ),
        floor=3,
    )
)


# --- indexer.select --------------------------------------------------------------------------


def _score_rows(kinds: list[str], build: dict, gen: torch.Generator, shape: list[int]) -> torch.Tensor:
    """fp32 [b, S, T] scores; row r (flattened b, S) takes kinds[r % len(kinds)]."""
    b, S, T = shape
    rows = []
    for r in range(b * S):
        kind = kinds[r % len(kinds)]
        if kind == "normal":
            row = randn(T, generator=gen) * float(build.get("scale", 1.0))
        elif kind == "levels":  # few bf16 values: dense ties at the k-th score
            row = torch.randint(0, int(build.get("levels", 4)), (T,), generator=gen).float() * 0.5
        elif kind == "constant":
            row = torch.full((T,), float(build.get("value", 0.375)))
        elif kind == "relu":  # what ReLU leaves when most heads score <= 0: mostly exact zeros
            row = (randn(T, generator=gen) - float(build.get("shift", 1.0))).relu()
        elif kind == "ninf_runs":  # runs of -inf inside the valid prefix, ties among the rest
            run = int(build.get("run", 3))
            phase = int(torch.randint(0, 2 * run, (1,), generator=gen))
            row = torch.randint(0, 3, (T,), generator=gen).float()
            row[((torch.arange(T) + phase) // run) % 2 == 1] = NINF
        else:
            raise CaseSpecError(f"indexer.select: unknown score kind {kind!r}; use one of {SCORE_KINDS} or 'values'")
        rows.append(row)
    return torch.stack(rows).reshape(b, S, T)


def _select_inputs(params, build, gen):
    if "values" in build:  # explicit rows [b][S][T]
        scores = torch.tensor(build["values"], dtype=torch.float32)
    else:
        shape = [int(v) for v in need(build, "shape", "indexer.select")]
        kinds = build.get("kind", "normal")
        scores = _score_rows([kinds] if isinstance(kinds, str) else list(kinds), build, gen, shape)
    if scores.ndim != 3:
        raise CaseSpecError(f"indexer.select: scores must be [b, S, T], got {list(scores.shape)}")
    lens = _lens(params, scores.shape[1], "indexer.select")
    if "future" in build:  # unwritten / future rows hold large stale values that must never win
        future = torch.arange(scores.shape[-1]) >= lens[:, None]
        scores = torch.where(future, float(build["future"]) * (1 + torch.rand(scores.shape, generator=gen)), scores)
    scores = scores.to(torch.bfloat16)
    return {"scores": scores, "candidates": _source_mask(build.get("candidates"), scores, lens, gen, "indexer.select")}


def select_reference(inputs: dict, params: dict) -> dict:
    """indexer.select: the reference selection of the given scores (see module docstring)."""
    return {"ids": select_from_scores(inputs["scores"], inputs["candidates"], params, "indexer.select")[0]}


def select_from_scores(
    scores: torch.Tensor, candidates: torch.Tensor, params: dict, component: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, masked scores): visibility, candidate masking, top-k, ids + offset, leak policy (M:563-580)."""
    selection = ix.select_with_leak(
        scores,
        candidates,
        _lens(params, scores.shape[1], component),
        _int(params, "index_topk", component),
        int(params.get("offset", 0)),
        _leak_policy(params),
    )
    return selection.ids, selection.masked_scores


def _id_limit(lens: torch.Tensor, batch: int, params) -> torch.Tensor:
    """int64 [b, S]: a valid id must be below the query's compress_lens + offset."""
    return (lens.to(torch.int64) + int(params.get("offset", 0))).expand(batch, -1).contiguous()


def _select_aux(inputs, params, outputs):
    lens = _lens(params, inputs["scores"].shape[1], "indexer.select")
    return {
        "masked_scores": _masked(inputs["scores"], lens, inputs["candidates"]),
        "id_limit": _id_limit(lens, inputs["scores"].shape[0], params),
    }


IDS_DOC = (
    "selected rows ascending + offset, then -1 (judged as a set against aux.masked_scores; docs/index-verdicts.md)"
)

# Both selecting components judge ids the same way: as a set against the masked scores, with the
# per-query id limit, -1 lanes standing for worst-score picks (docs/index-verdicts.md).
IDS_SPEC = OutputSpec(
    "ids",
    "index",
    IDS_DOC,
    "int32",
    "b S k",
    scores="masked_scores",
    order="set",
    offset_param="offset",
    limit="id_limit",
    fill_is_worst=True,
)

register(
    Component(
        name="indexer.select",
        summary="valid prefix (start+t+1)//ratio, candidate mask, torch CPU top-k, ascending ids + offset, -1 tail",
        upstream="M:563-580",
        inputs=(
            T("scores", "bf16", "b S T", "index scores (rows a query cannot see may hold anything)"),
            T("candidates", "bool", "b S T", "level-one keep mask; all True for a non-consumer"),
        ),
        outputs=(IDS_SPEC,),
        params=SELECT_PARAMS,
        dims={
            **INDEX_DIMS,
            "T": "score columns of the buffer: at least (start + S) // ratio, and may be more (a "
            "runtime's preallocated buffer: r1-decode-start40-buffer48 sends 48 for 41 rows); "
            "query t reads only its first (start + t + 1) // ratio",
            "k": "min(index_topk, T)",
        },
        build=_select_inputs,
        reference=select_reference,
        aux=_select_aux,
        floor=6,
        notes="params: start, ratio, index_topk, offset, candidate_leak (upstream|drop; default upstream). "
        "candidates is all True for a layer that does not consume candidate blocks.",
    )
)


# --- indexer (the whole forward) -------------------------------------------------------------


def _forward_inputs(params, build, gen):
    comp = "indexer"
    start, ratio = _int(params, "start", comp), _int(params, "ratio", comp)
    rope_dim = _int(params, "rope_dim", comp)
    b, S = (int(v) for v in need(build, "shape", comp))
    dim, q_lora = int(build.get("dim", 128)), int(build.get("q_lora_rank", 64))
    H, D = int(build.get("heads", 4)), int(build.get("head_dim", 64))
    T = (start + S) // ratio
    rows = max(T, int(build.get("cache_rows", T)))  # a cache longer than T: rows >= T are never read
    keys = nx.fp4_qdq_e8m0(normal(gen, [b, rows, D]), ix.FP4_BLOCK).y  # published: post-RoPE, QDQ'd
    table = rp.freqs_table(
        rope_dim,
        start + S,
        float(build.get("base", 160000.0)),
        int(build.get("original_seq_len", 65536)),
        float(build.get("factor", 16.0)),
    )
    inputs = {
        "x": normal(gen, [b, S, dim]),
        "qr": normal(gen, [b, S, q_lora]),
        "index_k_cache": keys,
        "wq_b": normal(gen, [H * D, q_lora], q_lora**-0.5),
        "weights_proj": normal(gen, [H, dim], dim**-0.5),
        "freqs": table[start : start + S].contiguous(),
    }
    if params.get("weights", "bf16") == "fp8":  # the checkpoint's fp8 wq_b: e4m3 codes + e8m0 tile scales
        quantise_inputs(inputs, ("wq_b",))
    lens = ix.query_compress_lens(start, S, ratio)
    inputs["candidates"] = _source_mask(build.get("candidates"), torch.empty(b, S, T), lens, gen, comp)
    return inputs


def _table_by_position(inputs: dict, start: int) -> torch.Tensor:
    freqs = inputs["freqs"]
    return torch.cat([torch.zeros((start, *freqs.shape[1:]), dtype=freqs.dtype), freqs])  # rows by position


def forward_reference(inputs: dict, params: dict) -> dict:
    """indexer: the reference forward; the rope rows for positions start.. are given as `freqs`."""
    comp = "indexer"
    start, ratio = _int(params, "start", comp), _int(params, "ratio", comp)
    result = ix.indexer_forward(
        inputs["x"],
        inputs["qr"],
        inputs["index_k_cache"],
        start,
        ratio,
        ix.IndexerWeights(weight_input(inputs, "wq_b"), inputs["weights_proj"]),
        _table_by_position(inputs, start),
        _int(params, "rope_dim", comp),
        _int(params, "index_topk", comp),
        int(params.get("offset", 0)),
        inputs["candidates"],
    )
    return {
        "ids": select_from_scores(result.scores, inputs["candidates"], params, comp)[0],
        "scores": result.scores,
        "index_q": result.query,
    }


def _forward_aux(inputs, params, outputs):
    """The selection's judges (masked scores, id limits) and the scores' head-term scales."""
    lens = _lens(params, inputs["x"].shape[1], "indexer")
    heads = inputs["weights_proj"].shape[0]
    query = outputs["index_q"]  # the reference's intermediate (kept in aux as `index_q` by the generator)
    w = ix.head_weights(inputs["x"], inputs["weights_proj"], query.shape[-1], heads)
    keys = inputs["index_k_cache"][:, : outputs["scores"].shape[-1]]
    _, terms = ix.index_scores_with_terms(nx.fp4_qdq_e8m0(query, ix.FP4_BLOCK).y, keys, w)
    return {
        "masked_scores": _masked(outputs["scores"], lens, inputs["candidates"]),
        "id_limit": _id_limit(lens, inputs["x"].shape[0], params),
        "term_scale": terms,
    }


def _chain(inputs, expected, aux, actual, params, judge, boundary):
    """index_q, scores given it, ids given the scores (harness/chain/indexer.py)."""
    return judge_indexer(inputs, expected, aux, actual, params, judge, boundary)


register(
    Component(
        name="indexer",
        summary="indexer forward: wq_b, RoPE, fp4 QDQ, head weights, scores, visibility, candidates, top-k",
        upstream="M:550-580",
        inputs=(
            T("x", "bf16", "b S dim"),
            T("qr", "bf16", "b S q_lora"),
            T("index_k_cache", "bf16", "b rows D", "published index keys (post-RoPE, fp4-QDQ'd)"),
            T("wq_b", "bf16|uint8", "H*D q_lora", "bf16, or float8_e4m3fn codes with weights: fp8"),
            T("wq_b.scale", "uint8", "N/32 q_lora/32", "e8m0 tile scales of the fp8 wq_b", when="weights: fp8"),
            T("weights_proj", "bf16", "H dim"),
            T("freqs", "f32", "S rope/2 2", "(cos, sin) of positions start.."),
            T("candidates", "bool", "b S T", "level-one keep mask; all True for a non-consumer"),
        ),
        outputs=(
            IDS_SPEC,
            OutputSpec(
                "scores",
                "bf16",
                "index scores before any mask; judged as indexer.scores (1 ulp plus an allowance "
                "in bf16 ulps of the largest head term, aux.term_scale, or no farther from the exact scores than "
                "the reference's own roundings)",
                "bf16",
                "b S T",
                terms="term_scale",
                precision=True,
            ),
        ),
        intermediates=(
            OutputSpec(
                "index_q",
                "bf16",
                "the query after RoPE, before its fp4 round trip",
                "bf16",
                "b S H D",
                pre_tail="rope_dim",
                kept="aux",
                feeds="the fp4 e8m0 round trip of the query",
                accumulates=True,
            ),
        ),
        chain=_chain,
        params=SELECT_PARAMS
        + (
            P("rope_dim", "int", "rotated trailing channels of the query"),
            P(
                "weights",
                "str",
                "the checkpoint dtype of wq_b",
                required=False,
                choices=("bf16", "fp8"),
                default="bf16",
            ),
        ),
        dims=INDEX_DIMS,
        build=_forward_inputs,
        reference=forward_reference,
        aux=_forward_aux,
        floor=5,
        notes="params: start, ratio, rope_dim, index_topk, offset, candidate_leak, weights (bf16 | fp8: wq_b arrives as "
        "uint8 e4m3 codes with its e8m0 tile scales as wq_b.scale, and quantises qr with act_quant). "
        "freqs holds the (cos, sin) "
        "rows of positions start..start+S-1; index_k_cache rows >= T are never read. H comes from "
        "weights_proj rows, D from the cache's last dim.",
    )
)
