"""The indexer chain: the index query before its fp4 round trip, the scores given it, the selection
given the scores (docs/verdicts.md, "The chain").

- `index_q` (optional): judged against the golden's query (`aux.index_q`: the inputs are the golden's,
  so nothing upstream of it is the implementation's);
- `scores`: rows that differ are rederived from the fp4 round trip of the implementation's own
  query where it returned one that passed. Without one, the reference's query stands in, and a row
  beyond the scores' policy is searched for a single fp4 decision of the query taken the other way
  at a rounding boundary (`boundary.admissible_variants`); one that reproduces the row is counted as
  a boundary flip and the row judged against it;
- `ids`: rows that differ are rederived by the reference's selection of the implementation's own
  scores (when they passed), so a selection is judged given the scores it ranked.
"""

from __future__ import annotations

import torch

from ..accumulation import gemm_terms, through_rope
from ..boundary import FORMATS, admissible_variants, pre_tolerance
from ..precision import EXACT, EXACT_ERROR
from ..policy import Policy
from ..reference import numerics as nx
from ..reference.fp8_linear import weight_input
from ..reference.indexer import (
    FP4_BLOCK,
    exact_index_scores,
    head_weights,
    index_scores,
    index_scores_with_terms,
    query_compress_lens,
    select_with_leak,
)
from ..ulps import ulp_of
from .stages import (
    ChainJudgement,
    Given,
    Judge,
    RowContext,
    StageVerdict,
    attribute_problem,
    differing,
    judge_rows,
    rows_of,
)

NINF = float("-inf")


def judge_indexer(
    inputs: dict, golden: dict, aux: dict, actual: dict, params: dict, judge: Judge, boundary: Policy
) -> ChainJudgement:
    result = ChainJudgement()
    S = inputs["x"].shape[1]
    start, ratio = int(params["start"]), int(params["ratio"])
    lens = query_compress_lens(start, S, ratio)  # [S]
    keys = inputs["index_k_cache"]
    H = inputs["weights_proj"].shape[0]
    T = golden["scores"].shape[-1]
    w = head_weights(inputs["x"], inputs["weights_proj"], keys.shape[-1], H)  # [b, S, H]

    # index_q
    query = Given("index_q", rows_of(aux["index_q"], 2))
    mine = actual.get("index_q")
    if mine is not None:
        verdict = judge("index_q", aux["index_q"], mine, _query_accumulation(inputs, aux["index_q"], mine, params))
        stage = StageVerdict("index_q", verdict, intermediate=True)
        result.verdicts.append(stage)
        if not attribute_problem(mine, aux["index_q"].dtype, tuple(aux["index_q"].shape)):
            query = Given("index_q", rows_of(mine, 2), own=True, passed=stage.explained)

    # scores
    terms = aux["term_scale"].clone()  # the golden's, rows replaced where rederived
    exact = RowContext("scores" + EXACT, golden["scores"].shape[0] * S, (T,), fill=float("nan"))
    error = RowContext("scores" + EXACT_ERROR, golden["scores"].shape[0] * S, (T,), fill=float("nan"))

    def scores_of(rows: torch.Tensor, q_rows: torch.Tensor) -> torch.Tensor:
        q = nx.fp4_qdq_e8m0(q_rows, FP4_BLOCK).y  # [n, H, D]
        out = torch.empty(rows.numel(), T, dtype=torch.bfloat16)
        b_of = rows // S
        for bi in torch.unique(b_of).tolist():
            sel = b_of == bi
            s, scale = index_scores_with_terms(q[sel][None], keys[bi : bi + 1, :T], rows_of(w, 2)[rows[sel]][None])
            out[sel] = s[0]
            rows_of(terms, 2)[rows[sel]] = scale[0]
            value, bound = exact_index_scores(q[sel][None], keys[bi : bi + 1, :T], rows_of(w, 2)[rows[sel]][None])
            exact.put(rows[sel], value[0])
            error.put(rows[sel], bound[0])
        return out

    flips: list[str] = []

    def reference_scores(rows: torch.Tensor) -> torch.Tensor:
        values = scores_of(rows, query.rows(rows))
        if not query.own and boundary.accept_boundary:
            values = _explain_by_query_flips(
                rows,
                values,
                rows_of(actual["scores"], 2),
                aux["index_q"],
                keys,
                w,
                rows_of(terms, 2),
                boundary,
                params,
                flips,
            )
        return values

    got = actual.get("scores")
    scores_given = Given("scores", rows_of(golden["scores"], 2))
    if attribute_problem(got, golden["scores"].dtype, tuple(golden["scores"].shape)):
        result.verdicts.append(StageVerdict("scores", judge("scores", golden["scores"], got, {})))
    else:
        assert got is not None  # attribute_problem: a tensor of the golden's dtype and shape
        differ = differing(got, golden["scores"], 2)
        verdict, expected, n = judge_rows(
            judge,
            "scores",
            got,
            golden["scores"],
            differ,
            reference_scores,
            2,
            lambda rows, values: {"term_scale": terms, **exact.extra(), **error.extra()},
        )
        given = ("index_q",) if query.own else ()
        if flips:
            verdict.message = f"judged against the reference recomputed with {flips[0]}\n{verdict.message}".strip()
        stage = StageVerdict("scores", verdict, given, () if query.own else ("index_q",), n)
        result.verdicts.append(stage)
        scores_given = Given("scores", rows_of(got, 2), own=True, passed=stage.explained)
    if flips:
        result.flips, result.flip_example = len(flips), flips[0]

    # ids
    candidates = inputs["candidates"]
    offset, k = int(params.get("offset", 0)), int(params["index_topk"])
    leak = str(params.get("candidate_leak", "upstream"))
    masked_aux = aux["masked_scores"]

    def select(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = scores_given.rows(rows)[None]  # [1, n, T]
        sel = select_with_leak(scores, rows_of(candidates, 2)[rows][None], lens[rows % S], k, offset, leak)
        return sel.ids[0], sel.masked_scores[0]

    ids = actual.get("ids")
    if attribute_problem(ids, golden["ids"].dtype, tuple(golden["ids"].shape)):
        result.verdicts.append(StageVerdict("ids", judge("ids", golden["ids"], ids, {})))
        return result
    assert ids is not None  # attribute_problem: a tensor of the golden's dtype and shape
    differ = differing(ids, golden["ids"], 2)

    def ranked(rows, values):
        out = rows_of(masked_aux, 2).clone()
        if rows.numel():
            out[rows] = select(rows)[1].to(out.dtype)
        return {"masked_scores": out.reshape(masked_aux.shape)}

    verdict, _, n = judge_rows(judge, "ids", ids, golden["ids"], differ, lambda rows: select(rows)[0], 2, ranked)
    own = ("scores",) if scores_given.own else ()
    result.verdicts.append(StageVerdict("ids", verdict, own, () if own else ("scores",), n))
    return result


def _query_accumulation(inputs: dict, expected: torch.Tensor, mine, params: dict) -> dict[str, torch.Tensor]:
    """`index_q.acc` and `index_q.acc_rms` where the returned query differs and wq_b is fp8: the
    magnitudes of the fp8 GEMM's terms behind each element, carried through RoPE (harness/accumulation.py)."""
    if attribute_problem(mine, expected.dtype, tuple(expected.shape)) or not bool(differing(mine, expected, 2).any()):
        return {}
    terms = gemm_terms(inputs["qr"], weight_input(inputs, "wq_b"))
    if terms is None:
        return {}
    return through_rope(terms.map(lambda t: t.reshape(expected.shape)), int(params["rope_dim"])).context("index_q")


def _explain_by_query_flips(
    rows, values, got, q_pre, keys, w, terms, boundary: Policy, params, found: list[str]
) -> torch.Tensor:
    """The reference's scores of `rows`, each row replaced by the scores of its query with one fp4
    decision taken the other way at a rounding boundary, where that reproduces the implementation's
    row and the reference's does not (the row's bound: 1 bf16 ulp plus the head-term allowance)."""
    fmt = FORMATS["fp4_e8m0"]
    tail = int(params["rope_dim"])
    S = q_pre.shape[1]
    out = values.clone()
    flat_q = rows_of(q_pre, 2)
    for i, r in enumerate(rows.tolist()):
        bound = ulp_of(values[i], torch.bfloat16) + 2 * ulp_of(terms[r], torch.bfloat16)

        def within(reference: torch.Tensor) -> bool:
            return bool(((got[r].double() - reference.double()).abs() <= bound).all())

        if within(values[i]):
            continue
        bi = r // S
        q = nx.fp4_qdq_e8m0(flat_q[r], FP4_BLOCK).y  # [H, D]
        wr = rows_of(w, 2)[r][None, None]  # [1, 1, H]
        for h in range(q.shape[0]):
            tol = pre_tolerance(flat_q[r, h], boundary.boundary_ulps, tail, boundary.boundary_atol_rel, fmt.block)
            hit = None
            for what, row in admissible_variants(flat_q[r, h], tol, fmt):
                trial = q.clone()
                trial[h] = row
                redone = index_scores(trial[None, None], keys[bi : bi + 1, : values.shape[-1]], wr)[0, 0]
                if within(redone):
                    hit = (what, redone)
                    break
            if hit is not None:
                out[i] = hit[1]
                found.append(
                    f"query row {[bi, r % S]}, head {h}: {hit[0]} of the fp4 query (a value within "
                    f"{boundary.boundary_ulps:g} bf16 ulps of its rounding boundary); its scores follow"
                )
                break
    return out
