"""The V4.1 indexer: head weights, bf16 index scores, per-query visibility, top-k selection and
the whole indexer forward over a chunk (upstream `Indexer.forward`, M:527-580).

Upstream anchors (`docs/v41-reference.md` §4.2; `M:` = `inference/model.py` @ dba1be0a):

- `head_weight_multiplier`, `head_weights`: M:555, ``weights_proj(x) * (softmax_scale *
  n_heads ** -0.5)`` (bf16 linear times a Python float).
- `index_scores`: M:556-557, einsum ``bshd,btd->bsht`` (bf16 inputs, fp32 accumulate, bf16
  out), ReLU, times the head weights (bf16 product), sum over heads (fp32 accumulate, bf16 out).
- `select_topk`: M:563-567 (visibility) and M:577-580 (top-k ``sorted=False``, ids sorted
  ascending, ``where(id < compress_lens, id + offset, -1)``).
- `indexer_forward`: M:550-580 for the query side; the index keys come in already published
  (post-RoPE, fp4-QDQ'd, M:537-548 are the key owner's business).

Accumulation (the one deliberate departure from "call the same torch op"): the two fp32
accumulations are evaluated exactly, in float64, and rounded once to fp32 and then to bf16,
i.e. the result of an ideal fp32 accumulator with a bf16 output. Products of bf16 values are
exact in float64 (16 significant bits) and a float64 sum of them is exact unless the terms span
more than about 2^29 in magnitude (never for fp4-QDQ'd q and k, whose products carry at most
4 significant bits). So a score depends only on its own query row, key row and head weights:
not on S, T, thread count or BLAS kernel. torch's own bf16 CPU einsum (oneDNN) was observed to be
shape-independent on torch 2.13, but for random (non-QDQ) bf16 inputs ~6e-5 of its elements
differ by one bf16 ulp from the exactly rounded value, and which ones depends on the kernel
oneDNN picks for the machine; for fp4-QDQ'd inputs the two agree. A chunk is scored in row
blocks only to bound memory; the blocking cannot change any value.

Visibility (harness generalisation of M:563-567, doc §10.3): query t of a chunk starting at
`start` sees ``compress_lens[t] = (start + t + 1) // ratio`` compressed rows. This is upstream's
``(t + 1) // ratio`` at prefill (start 0) and its scalar ``end // ratio`` for a decode step
(S = 1), and stays causal for chunks and multi-token decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from v41_conformance.reference import numerics as nx  # quantisers looked up at call time: one override point
from v41_conformance.reference.fp8_linear import Fp8Weight, project
from v41_conformance.reference.numerics import linear_bf16
from v41_conformance.reference.rope import apply_rotary
from v41_conformance.reference.topk import torch_cpu_topk

FP4_BLOCK = 32  # fp4_block_size (M:23-30): indexer q/k QDQ block, E8M0 scales
LEAK_POLICIES = ("upstream", "drop")  # §4.4: ids of masked-out rows kept (upstream) or -1 (drop)
_ROW_BLOCK_ELEMS = 1 << 22  # float64 elements per scoring block (memory bound only)


@dataclass(frozen=True)
class IndexerWeights:
    """Indexer parameters on the query side (M:496-525).

    wq_b:         bf16 [H * D, q_lora_rank] (index_n_heads * index_head_dim rows), or an
                  `Fp8Weight` with the fp8 checkpoint (§6.4).
    weights_proj: bf16 [H, dim].
    """

    wq_b: torch.Tensor | Fp8Weight
    weights_proj: torch.Tensor


class TopkSelection(NamedTuple):
    """ids int32 [b, S, k_sel]: selected rows ascending + offset, then a -1 tail.
    masked_scores bf16 [b, S, T]: the scores top-k ranked (rows >= compress_lens at -inf)."""

    ids: torch.Tensor
    masked_scores: torch.Tensor


class IndexerResult(NamedTuple):
    """Everything one indexer forward produces (shapes for a chunk of S queries, T rows).

    ids:            int32 [b, S, min(index_topk, T)], offset applied, -1 tail.
    scores:         bf16 [b, S, T], index scores before any mask.
    visible_scores: bf16 [b, S, T], rows >= compress_lens at -inf (what a candidate source
                    feeds to `candidates.select_candidate_blocks`).
    masked_scores:  bf16 [b, S, T], visible_scores with non-candidates at -inf (what top-k saw;
                    equals visible_scores when no candidates were given).
    compress_lens:  int64 [S], visible compressed rows per query.
    query:          bf16 [b, S, H, D], the query after RoPE and before its fp4 round trip.
    """

    ids: torch.Tensor
    scores: torch.Tensor
    visible_scores: torch.Tensor
    masked_scores: torch.Tensor
    compress_lens: torch.Tensor
    query: torch.Tensor | None = None


def head_weight_multiplier(index_head_dim: int, index_n_heads: int) -> float:
    """index_head_dim^-0.5 * index_n_heads^-0.5 as a Python float (M:555).

    Production 128, 32 -> 0.015625000000000003 (2^-6 once fp32); tiny config A 64, 4 -> 2^-4.
    """
    return index_head_dim**-0.5 * index_n_heads**-0.5


def head_weights(x: torch.Tensor, weights_proj: torch.Tensor, index_head_dim: int, index_n_heads: int) -> torch.Tensor:
    """w = linear_bf16(x, weights_proj) * multiplier, bf16 [b, S, H] (M:555).

    x bf16 [b, S, dim], weights_proj bf16 [H, dim]. The multiply is torch's bf16-tensor times
    Python-float product, exactly as upstream evaluates it.
    """
    if weights_proj.shape[0] != index_n_heads:
        raise ValueError(
            f"head_weights: weights_proj has {weights_proj.shape[0]} rows but index_n_heads is "
            f"{index_n_heads}; weights_proj must be [index_n_heads, dim]"
        )
    return linear_bf16(x, weights_proj) * head_weight_multiplier(index_head_dim, index_n_heads)


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Σ_h bf16(bf16(relu(q_h · k)) * w_h) with upstream's rounding points, bf16 [b, S, T].

    q bf16 [b, S, H, D] (post-RoPE, fp4-QDQ'd), k bf16 [b, T, D] (published index keys),
    w bf16 [b, S, H] (head weights). Per element (module docstring for the exact evaluation):
      s_h  = bf16(fp32(Σ_d q[h, d] * k[d]))      einsum, fp32 accumulate, bf16 out
      p_h  = bf16(relu(s_h) * w_h)               product rounded once
      out  = bf16(fp32(Σ_h p_h))                 sum over heads, fp32 accumulate, bf16 out
    Zeros come out as +0.

    Example: two heads q = (1, 0), (0, 1), w = (1, 2), key (0, 3) -> 0 + 3 * 2 = 6.
    """
    _check_score_operands(q, k, w)
    return _scores_and_terms(q, k, w, with_terms=False)[0]


def index_scores_with_terms(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`index_scores` and, per score, the scale of its largest head term (fp32 [b, S, T]):
    max_h |w_h| * max(relu(s_h), 2^-8 * sum_d |q_hd k_d|). A correct implementation whose dot
    product sums in another order may round s_h one step the other way, or (for a dot near zero by
    cancellation) land a few fp32 ulps of sum_d |q_hd k_d| away; either moves the score by a few
    bf16 ulps of this scale (the `terms` allowance of conformance.yaml, docs/verdicts.md)."""
    _check_score_operands(q, k, w)
    scores, terms = _scores_and_terms(q, k, w, with_terms=True)
    assert terms is not None  # with_terms
    return scores, terms


def exact_index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [b, S, T] twice: Σ_h relu(q_h · k) * w_h of the same operands with no rounding at all
    (what an implementation with more precision approaches, such as DeepGEMM's fp32 MQA logits), and
    how far `index_scores` may lie from it by its own roundings: half a bf16 ulp of each head's dot
    times |w_h|, of each head's product, and of the sum (docs/verdicts.md, "GPU arithmetic")."""
    from ..ulps import ulp_of

    _check_score_operands(q, k, w)
    b, S, H, D = q.shape
    exact = torch.empty((b, S, k.shape[1]), dtype=torch.float64)
    bound = torch.empty_like(exact)
    k64 = k.double()
    rows = max(1, _ROW_BLOCK_ELEMS // max(1, b * H * max(k.shape[1], D)))
    for s0 in range(0, S, rows):
        dots = torch.einsum("bshd,btd->bsht", q[:, s0 : s0 + rows].double(), k64).relu()  # exact
        ww = w[:, s0 : s0 + rows, :, None].double()
        terms = dots * ww
        total = terms.sum(dim=2)
        exact[:, s0 : s0 + rows] = total
        half = lambda v: ulp_of(v, torch.bfloat16) / 2  # noqa: E731
        bound[:, s0 : s0 + rows] = (
            (half(dots) * ww.abs()).masked_fill(dots == 0, 0.0) + half(terms).masked_fill(terms == 0, 0.0)
        ).sum(dim=2) + half(total)
    return exact, bound


def _check_score_operands(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> None:
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        raise ValueError(f"index_scores takes bf16 q, k, w; got {q.dtype}, {k.dtype}, {w.dtype}")
    if q.ndim != 4 or k.ndim != 3 or w.ndim != 3:
        raise ValueError(
            f"index_scores wants q [b, S, H, D], k [b, T, D], w [b, S, H]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, w {tuple(w.shape)}"
        )
    b, S, H, D = q.shape
    if k.shape[0] != b or k.shape[2] != D or tuple(w.shape) != (b, S, H):
        raise ValueError(
            f"index_scores shape mismatch: q {tuple(q.shape)} needs k [{b}, T, {D}] and w "
            f"[{b}, {S}, {H}]; got k {tuple(k.shape)}, w {tuple(w.shape)}"
        )


def _scores_and_terms(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, with_terms: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scores, and their term scales only when asked (the indexer and attention references
    score every chunk and need none)."""
    b, S, H, D = q.shape
    T = k.shape[1]
    out = torch.empty((b, S, T), dtype=torch.bfloat16)
    largest = torch.empty((b, S, T), dtype=torch.float32) if with_terms else None
    k64 = k.double()  # [b, T, D]
    rows = max(1, _ROW_BLOCK_ELEMS // max(1, b * H * max(T, D)))
    for s0 in range(0, S, rows):
        q64 = q[:, s0 : s0 + rows].double()  # [b, s, H, D]
        dots = torch.einsum("bshd,btd->bsht", q64, k64)  # exact
        s = dots.float().to(torch.bfloat16).relu()  # [b, s, H, T] bf16
        p = (s.float() * w[:, s0 : s0 + rows, :, None].float()).to(torch.bfloat16)  # exact product, one rounding
        total = p.double().sum(dim=2)  # [b, s, T], exact
        out[:, s0 : s0 + rows] = total.float().to(torch.bfloat16) + 0.0  # +0.0 turns -0 into +0
        if largest is None:
            continue
        if H:
            # What a correct dot product may differ by: one rounding step of s_h, or (for a dot
            # near zero by cancellation) its fp32 sum's error, a small fraction of sum_d |q k|.
            magnitude = torch.einsum("bshd,btd->bsht", q64.abs(), k64.abs())
            scale = torch.maximum(s.double(), magnitude * 2.0**-8) * w[:, s0 : s0 + rows, :, None].double().abs()
            largest[:, s0 : s0 + rows] = scale.amax(dim=2).float()
        else:
            largest[:, s0 : s0 + rows] = 0.0
    return out, largest


def indexer_query(
    qr: torch.Tensor, wq_b: torch.Tensor | Fp8Weight, heads: int, freqs: torch.Tensor, rope_dim: int
) -> torch.Tensor:
    """bf16 [b, S, H, D]: wq_b(qr) per head with RoPE on its last rope_dim channels, before the fp4
    QDQ (M:550-552). freqs: fp32 [S, rope_dim/2, 2], the rows of the tokens' positions."""
    return apply_rotary(project(qr, wq_b).unflatten(-1, (heads, -1)), freqs, rope_dim)


def query_compress_lens(start: int, seqlen: int, ratio: int) -> torch.Tensor:
    """int64 [S]: (start + t + 1) // ratio, the compressed rows query t can see (M:563-567)."""
    if ratio <= 0 or start < 0 or seqlen < 0:
        raise ValueError(
            f"query_compress_lens needs ratio > 0, start >= 0, seqlen >= 0; got {ratio}, {start}, {seqlen}"
        )
    return torch.div(torch.arange(start + 1, start + seqlen + 1), ratio, rounding_mode="floor")


def select_topk(
    scores: torch.Tensor, compress_lens: torch.Tensor | int, k_max: int, offset: int | torch.Tensor = 0
) -> TopkSelection:
    """Top-k compressed rows per query (M:563-567, M:577-580).

    scores bf16 [b, S, T]; compress_lens int64 [S] (or an int for every query: a decode step's
    end // ratio); offset int or an int tensor broadcastable to [b, S, k_sel].
    1. masked = scores with rows >= compress_lens[t] at -inf (out of place), so a row that is
       unwritten or in the future never competes, however large its stored score;
    2. k_sel = min(k_max, T); torch CPU top-k (`topk.torch_cpu_topk`, sorted=False) of masked;
    3. ids sorted ascending; where(id < compress_lens[t], id + offset, -1) as int32.
    Unreachable picks are larger than reachable ones, so valid ids come first, then -1s.

    Example: scores [2, 6, 3, 0, 300], compress_lens [4], k_max 2 -> ids [[1, 2]].
    """
    if scores.ndim != 3:
        raise ValueError(f"select_topk wants scores [b, S, T], got {tuple(scores.shape)}")
    if k_max <= 0:
        raise ValueError(f"select_topk: k_max must be positive, got {k_max}")
    b, S, T = scores.shape
    lens = _lens_column(compress_lens, S)  # [S, 1]
    masked = scores.masked_fill(torch.arange(T) >= lens, float("-inf"))  # [b, S, T]
    k_sel = min(k_max, T)
    _, picked = torch_cpu_topk(masked, k_sel, dim=-1, largest=True, sorted=False)  # [b, S, k_sel]
    picked = picked.sort(dim=-1).values
    ids = torch.where(picked < lens, picked + offset, -1).to(torch.int32)
    return TopkSelection(ids, masked)


def drop_masked(ids: torch.Tensor, candidates: torch.Tensor, offset: int) -> torch.Tensor:
    """The `drop` policy (§4.4): ids of non-candidate rows -> -1, then valid ids ascending, -1 tail.

    ids int32 [b, S, k]; candidates bool [b, S, T].
    """
    valid = ids >= 0
    rows = torch.where(valid, ids.long() - offset, 0)  # [b, S, k]
    keep = valid & candidates.gather(-1, rows)
    key = torch.where(keep, ids.long(), torch.iinfo(torch.int64).max)
    ordered = key.sort(dim=-1).values
    return torch.where(ordered == torch.iinfo(torch.int64).max, -1, ordered).to(ids.dtype)


def select_with_leak(
    scores: torch.Tensor,
    candidates: torch.Tensor,
    compress_lens: torch.Tensor | int,
    k_max: int,
    offset: int,
    leak: str = "upstream",
) -> TopkSelection:
    """`select_topk` of the scores with non-candidates at -inf (a consumer's level-one mask; all True
    otherwise), and the §4.4 policy for masked rows a short pool still picks: `upstream` keeps
    them as valid ids (the leak), `drop` turns them into -1. scores bf16 [b, S, T]."""
    if leak not in LEAK_POLICIES:
        raise ValueError(f"candidate leak policy must be one of {LEAK_POLICIES}, not {leak!r}")
    selection = select_topk(scores.masked_fill(~candidates, float("-inf")), compress_lens, k_max, offset)
    if leak == "drop":
        return TopkSelection(drop_masked(selection.ids, candidates, offset), selection.masked_scores)
    return selection


def _lens_column(compress_lens: torch.Tensor | int, S: int) -> torch.Tensor:
    """compress_lens (int or int [S]) -> int64 [S, 1]."""
    if isinstance(compress_lens, int):
        return torch.full((S, 1), compress_lens, dtype=torch.int64)
    lens = torch.as_tensor(compress_lens)
    if lens.dtype.is_floating_point or tuple(lens.shape) not in ((S,), (S, 1)):
        raise ValueError(
            f"compress_lens must be an int or an integer tensor [S] = [{S}], got {lens.dtype} {tuple(lens.shape)}"
        )
    return lens.to(torch.int64).reshape(S, 1)


def indexer_forward(
    x: torch.Tensor,
    qr: torch.Tensor,
    index_k_cache: torch.Tensor,
    start: int,
    ratio: int,
    weights: IndexerWeights,
    rope_table: torch.Tensor,
    rope_dim: int,
    index_topk: int,
    offset: int | torch.Tensor,
    candidates: torch.Tensor | None = None,
) -> IndexerResult:
    """One indexer forward over a chunk of S tokens at positions start..start+S-1 (M:550-580).

    x bf16 [b, S, dim]; qr bf16 [b, S, q_lora_rank]; index_k_cache bf16 [>= b, >= T, D], the
    published index keys (post-RoPE, fp4-QDQ'd), of which rows [:b, :T] with T = (start+S)//ratio
    are read (M:554); rope_table fp32 [>= start+S, rope_dim/2, 2] indexed by absolute position
    (`rope.freqs_table`); offset: the window part's length (§5.4), int or broadcastable tensor;
    candidates: bool [b, S, T] level-one mask for a candidate consumer, None otherwise.

    q = wq_b(qr) -> [b, S, H, D]; RoPE on the last rope_dim channels at the tokens' positions;
    fp4 E8M0 QDQ per 32 channels; w = head_weights(x); scores; visibility with
    compress_lens = query_compress_lens(start, S, ratio); consumer masking
    masked_fill(~candidates, -inf); select_topk(k_max=index_topk). A candidate source passes
    candidates=None and computes its block mask from `visible_scores` itself (it does not
    restrict its own selection, M:569-575).
    """
    if x.ndim != 3 or qr.ndim != 3 or x.shape[:2] != qr.shape[:2]:
        raise ValueError(
            f"indexer_forward wants x [b, S, dim] and qr [b, S, q_lora]; got {tuple(x.shape)}, {tuple(qr.shape)}"
        )
    if start < 0 or ratio <= 0:
        raise ValueError(f"indexer_forward needs start >= 0 and ratio > 0, got start {start}, ratio {ratio}")
    b, S, _ = x.shape
    H = weights.weights_proj.shape[0]
    D = index_k_cache.shape[-1]
    if weights.wq_b.shape[0] != H * D:
        raise ValueError(
            f"wq_b has {weights.wq_b.shape[0]} rows; expected index_n_heads * index_head_dim = {H} * {D} "
            "(H from weights_proj rows, D from the index key width)"
        )
    T = (start + S) // ratio
    if index_k_cache.ndim != 3 or index_k_cache.shape[0] < b or index_k_cache.shape[1] < T:
        raise ValueError(
            f"index_k_cache {tuple(index_k_cache.shape)} must be [>= {b}, >= {T}, D]: a chunk ending at "
            f"{start + S} with ratio {ratio} reads {T} rows"
        )
    if rope_table.shape[0] < start + S:
        raise ValueError(f"rope_table has {rope_table.shape[0]} rows; positions up to {start + S - 1} are needed")
    if candidates is not None and (candidates.dtype != torch.bool or tuple(candidates.shape) != (b, S, T)):
        raise ValueError(f"candidates must be bool [{b}, {S}, {T}], got {candidates.dtype} {tuple(candidates.shape)}")

    query = indexer_query(qr, weights.wq_b, H, rope_table[start : start + S], rope_dim)
    q = nx.fp4_qdq_e8m0(query, FP4_BLOCK).y
    w = head_weights(x, weights.weights_proj, D, H)  # [b, S, H]
    scores = index_scores(q, index_k_cache[:b, :T], w)  # [b, S, T]

    lens = query_compress_lens(start, S, ratio)  # [S]
    visible = scores.masked_fill(torch.arange(T) >= lens[:, None], float("-inf"))
    masked = visible if candidates is None else visible.masked_fill(~candidates, float("-inf"))
    if T == 0:  # upstream skips the indexer (M:722-737); the selection is empty
        ids = torch.empty((b, S, 0), dtype=torch.int32)
    else:
        ids = select_topk(masked, lens, index_topk, offset).ids
    return IndexerResult(ids, scores, visible, masked, lens, query)
