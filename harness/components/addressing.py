"""Candidate blocks, window ids and address translation: which rows attention reads, and where.

Upstream `select_candidate_blocks` (M:583-610), `get_window_topk_idxs` (M:409-426); the
runtime's candidate restoration and block-table translation (seed A.4.2, A.4.3). References:
`harness/reference/candidates.py`, `window.py`, `address.py`; docs/v41-reference.md §4.3,
§5.3, §10.3; how ids are judged: docs/index-verdicts.md.

`candidates.select` is judged along a chain (harness/chain/candidates.py): the kept block ids the
harness derives from the returned mask (`blocks`, index kind against the ranked block scores:
exact, tie order only, or a miss), then the mask exactly, given those blocks where they differ.
"""

from __future__ import annotations

import torch

from ..errors import CaseSpecError
from ..reference import address as ad
from ..reference import candidates as cd
from ..reference import window as wn
from ..chain.candidates import judge_candidates
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from .build import need, normal
from ..reference.numerics import randn

NINF = float("-inf")


def _ints(values, dtype=torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(dtype)


# --- candidates.select -----------------------------------------------------------------------


def _select_inputs(params, build, gen):
    if "values" in build:  # explicit logits [b][S][W] and compress_lens [S]
        logits = torch.tensor(build["values"], dtype=torch.float32)
        lens = _ints(need(build, "compress_lens", "candidates.select"), torch.int64)
    else:
        b, S, W = (int(v) for v in need(build, "shape", "candidates.select"))
        start, ratio = int(need(build, "start", "candidates.select")), int(build.get("ratio", 1))
        lens = torch.div(torch.arange(start + 1, start + S + 1), ratio, rounding_mode="floor")
        kind = build.get("kind", "normal")
        if kind == "normal":
            logits = randn((b, S, W), generator=gen)
        elif kind == "levels":  # few values: many blocks share their maximum
            logits = torch.randint(0, int(build.get("levels", 3)), (b, S, W), generator=gen).float()
        elif kind == "constant":
            logits = torch.full((b, S, W), float(build.get("value", 1.0)))
        else:
            raise CaseSpecError(f"candidates.select: unknown kind {kind!r} (normal, levels, constant, values)")
        if "newest" in build:  # each query's newest reachable row scores low: only the pin keeps its block
            newest = (lens - 1).clamp(min=0)[:, None].expand(b, S, 1)
            logits.scatter_(-1, newest, float(build["newest"]))
        logits = logits.masked_fill(torch.arange(W) >= lens[:, None], NINF)  # a source's visible scores
    return {"logits": logits.to(torch.bfloat16), "compress_lens": lens}


def _candidate_args(params: dict) -> tuple[int, int]:
    for key in ("topk_blocks", "block_size"):
        if key not in params:
            raise CaseSpecError(f"candidates.select: params needs '{key}'")
    return int(params["topk_blocks"]), int(params["block_size"])


def _blocks_of(mask, logits: torch.Tensor, block_size: int) -> torch.Tensor:
    """Kept block ids ascending then -1, int32 [..., nb], from a keep mask (the harness's view).

    A mask of the wrong type or shape gives all -1 here; the runner reports the mask itself.
    """
    nb = -(-logits.shape[-1] // block_size)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != logits.shape:
        return torch.full((*logits.shape[:-1], nb), -1, dtype=torch.int32)
    return cd.kept_block_ids(mask.cpu(), block_size).to(torch.int32)


def candidates_reference(inputs: dict, params: dict) -> dict:
    """candidates.select as an implementation returns it: the keep mask only."""
    topk_blocks, block = _candidate_args(params)
    sel = cd.select_candidate_blocks(inputs["logits"], inputs["compress_lens"], topk_blocks, block)
    return {"mask": sel.mask}


def _candidates_execute(call, inputs, params):
    out = call(inputs, params)
    if not isinstance(out, dict):
        return out  # the runner reports what run() returned
    return {**out, "blocks": _blocks_of(out.get("mask"), inputs["logits"], _candidate_args(params)[1])}


def _candidates_chain(inputs, expected, aux, actual, params, judge, boundary):
    """blocks, then the mask given them (harness/chain/candidates.py)."""
    return judge_candidates(inputs, expected, aux, actual, params, judge, boundary)


def _candidates_aux(inputs, params, outputs):
    topk_blocks, block = _candidate_args(params)
    sel = cd.select_candidate_blocks(inputs["logits"], inputs["compress_lens"], topk_blocks, block)
    return {"ranked_scores": sel.ranked_scores}


register(
    Component(
        name="candidates.select",
        summary="candidate blocks: block max (-inf padded), newest reachable block pinned +inf, top blocks kept, "
        "-inf picks dropped",
        upstream="M:583-610",
        inputs=(
            T("logits", "bf16", "b S W", "a source's visible index scores (rows >= compress_lens at -inf)"),
            T("compress_lens", "int64", "S", "visible compressed rows per query"),
        ),
        outputs=(
            OutputSpec("mask", "exact", "rows of the kept blocks", "bool", "b S W"),
            OutputSpec(
                "blocks",
                "index",
                "kept block ids ascending, then -1; judged against aux.ranked_scores (pinned block +inf)",
                "int32",
                "b S nb",
                scores="ranked_scores",
                order="set",
            ),
        ),
        returns=(T("mask", "bool", "b S W", "rows of the kept blocks"),),
        derived={
            "blocks": "the kept block ids of the returned mask, ascending, then -1 (the harness derives it, so a "
            "mask difference is also classified as tie order or a miss; where they differ, the mask is "
            "judged given them: the rows of your blocks)"
        },
        params=(
            P("topk_blocks", "int", "blocks kept per query (2048 in production)"),
            P("block_size", "int", "compressed rows per block (8 in production)", "rows"),
        ),
        dims={"b": "batch", "S": "queries", "W": "compressed rows", "nb": "ceil(W / block_size) blocks"},
        build=_select_inputs,
        reference=candidates_reference,
        execute=_candidates_execute,
        aux=_candidates_aux,
        chain=_candidates_chain,
        floor=5,
        notes="params: topk_blocks, block_size. logits are a source's visible index scores (rows >= "
        "compress_lens at -inf); compress_lens int64 [S]; implementations return only 'mask'.",
    )
)


# --- candidates.restore ----------------------------------------------------------------------


def _restore_inputs(params, build, gen):
    comp = "candidates.restore"
    if "compact" in build:  # explicit lab-style rows
        compact = _ints(build["compact"])
        kept = build["kept"]
        kept = torch.tensor(kept, dtype=torch.bool) if isinstance(kept[0][0][0], bool) else _ints(kept)
        return {"compact": compact, "kept": kept}
    b, S, W = (int(v) for v in need(build, "shape", comp))
    block = int(need(params, "block_size", comp))
    top, k = int(need(build, "topk_blocks", comp)), int(need(build, "k", comp))
    start = int(build.get("start", W - S))
    lens = torch.arange(start + 1, start + S + 1).clamp(max=W)
    logits = normal(gen, [b, S, W]).masked_fill(torch.arange(W) >= lens[:, None], NINF)
    mask = cd.select_candidate_blocks(logits, lens, top, block).mask  # [b, S, W]
    consumer = normal(gen, [b, S, W]).masked_fill(~mask, NINF)
    picked = torch.topk(consumer.float(), min(k, W), dim=-1).indices  # [b, S, k]; no ties in random data
    finite = torch.isfinite(consumer.gather(-1, picked))
    big = torch.iinfo(torch.int64).max
    logical = torch.where(finite, picked, big).sort(dim=-1).values  # ascending, -1 lanes at the end
    logical = torch.where(logical == big, -1, logical)
    compact = cd.compact_ids(logical, mask).to(torch.int32)
    if build.get("form", "mask") == "mask":
        return {"compact": compact, "kept": mask}
    ids = cd.kept_block_ids(mask, block)[..., :top]  # [b, S, top]: ascending, -1 slots
    if build.get("shuffle", False):  # the runtime's own block order: compact ids follow it
        perm = torch.stack([torch.randperm(top, generator=gen) for _ in range(b * S)]).reshape(b, S, top)
        ids_perm = ids.gather(-1, perm)
        rows = torch.where(compact >= 0, logical, 0)
        blk = torch.div(rows, block, rounding_mode="floor")
        slot = (ids_perm.unsqueeze(-1) == blk.unsqueeze(-2)).long().argmax(dim=-2)  # [b, S, k]
        compact = torch.where(compact >= 0, slot * block + rows % block, -1).to(torch.int32)
        ids = ids_perm
    return {"compact": compact, "kept": ids.to(torch.int32)}


register(
    Component(
        name="candidates.restore",
        summary="compact candidate offsets back to logical rows (+ the request offset), -1 kept",
        upstream="seed A.4.2 (restore_candidate_indices_inplace); M:583-610 for the kept set",
        inputs=(
            T("compact", "int32", "b S k", "offsets into the kept rows, -1 absent"),
            T(
                "kept",
                "bool|int32",
                "b S W|nk",
                "the keep mask [b, S, W], or kept block ids [b, S, nk] in the runtime's order with -1 slots",
            ),
        ),
        outputs=(OutputSpec("ids", "exact", "logical row + request_offset, or -1", "as compact", "b S k"),),
        params=(
            P("block_size", "int", "compressed rows per block", "rows"),
            P(
                "request_offset",
                "int",
                "the request's first row in the gathered buffer",
                "rows",
                required=False,
                default=0,
            ),
        ),
        dims={"b": "batch", "S": "queries", "k": "selected lanes", "W": "compressed rows", "nk": "kept blocks"},
        build=_restore_inputs,
        reference=lambda inputs, params: {
            "ids": cd.restore_candidates(
                inputs["compact"], inputs["kept"], int(params["block_size"]), int(params.get("request_offset", 0))
            )
        },
        floor=3,
        notes="kept is the bool keep mask [b, S, W] (compact c = c-th kept row ascending) or int32 kept block "
        "ids [b, S, nk] in the runtime's order with -1 slots (c -> kept[c // B] * B + c % B).",
    )
)


# --- window.indices --------------------------------------------------------------------------


def _ring_size(params: dict) -> int | None:
    mode, win, seqlen = params.get("mode"), params.get("win"), params.get("seqlen")
    if mode == "chunk" and win is not None and seqlen is not None:
        return int(win) + int(seqlen) - 1
    return win if mode == "decode" else None


def window_reference(inputs: dict, params: dict) -> dict:
    mode, win = str(params.get("mode", "")), int(params["win"])
    if mode == "prefill":
        ids = wn.window_ids_prefill(int(params["seqlen"]), win)
    elif mode == "decode":
        ids = wn.window_ids_decode(int(params["start"]), win)
    elif mode == "chunk":
        ring = params.get("ring_size")
        ids = wn.window_ids_chunk(int(params["start"]), int(params["seqlen"]), win, None if ring is None else int(ring))
    else:
        raise CaseSpecError(f"window.indices: params.mode must be prefill, decode or chunk, not {mode!r}")
    return {"ids": ids}


register(
    Component(
        name="window.indices",
        summary="sliding-window ids: prefill rows clipped to the window, decode ring slots oldest first, -1 unfilled",
        upstream="M:409-426",
        inputs=(),
        outputs=(
            OutputSpec("ids", "exact", "window lanes per query, -1 where nothing is visible", "int32", "rows width"),
        ),
        params=(
            P(
                "mode",
                "str",
                "prefill, decode or chunk (the harness's generalisation)",
                choices=("prefill", "decode", "chunk"),
            ),
            P("win", "int", "window size", "positions"),
            P(
                "seqlen",
                "int",
                "tokens in the step (prefill, chunk)",
                "positions",
                required=False,
                derive=lambda p: 1 if p.get("mode") == "decode" else None,
                default_doc="1 in decode mode; prefill and chunk cases set it",
            ),
            P(
                "start",
                "int",
                "position of the step's first token (decode, chunk)",
                "positions",
                required=False,
                derive=lambda p: 0 if p.get("mode") == "prefill" else None,
                default_doc="0 in prefill mode; decode and chunk cases set it",
            ),
            P(
                "ring_size",
                "int",
                "ring slots (chunk)",
                "slots",
                required=False,
                derive=_ring_size,
                default_doc="win + seqlen - 1 in chunk mode (no lane lost), win in decode mode",
            ),
        ),
        dims={"rows": "prefill S, decode 1, chunk S", "width": "prefill min(S, win), decode win, chunk win"},
        build=lambda params, build, gen: {},
        reference=window_reference,
        floor=4,
        notes="params: mode (prefill: seqlen, win; decode: start, win; chunk: start, seqlen, win, ring_size, the "
        "harness's generalisation for chunked prefill and multi-token decode, docs §10.3).",
    )
)


# --- address.prefill / address.decode --------------------------------------------------------


def _logical_ids(build: dict, gen: torch.Generator, comp: str) -> torch.Tensor:
    """int32 [b, S, K]: ascending distinct rows < rows_valid per query, -1 tail (as top-k returns)."""
    if "ids" in build:
        return _ints(build["ids"])
    b, S, K = (int(v) for v in need(build, "shape", comp))
    T = int(need(build, "rows", comp))
    out = torch.full((b * S, K), -1, dtype=torch.int64)
    for r in range(b * S):
        n = min(K, T, int(torch.randint(max(1, K // 2), K + 1, (1,), generator=gen)))
        out[r, :n] = torch.randperm(T, generator=gen)[:n].sort().values
    return out.reshape(b, S, K).to(torch.int32)


register(
    Component(
        name="address.prefill",
        summary="prefill: logical rows plus the request's offset in the gathered buffer, -1 kept",
        upstream="seed A.4.3 (_load_prefill_kv ks offset)",
        inputs=(T("ids", "int32", "b S K", "logical rows, -1 absent"),),
        outputs=(OutputSpec("ids", "exact", "id + base where id >= 0, else -1", "int32", "b S K"),),
        params=(P("base", "int", "the request's first row in the concatenated buffer", "rows"),),
        dims={"b": "batch", "S": "queries", "K": "lanes"},
        build=lambda params, build, gen: {"ids": _logical_ids(build, gen, "address.prefill")},
        reference=lambda inputs, params: {"ids": ad.address_prefill(inputs["ids"], int(params["base"]))},
        floor=2,
        notes="params: base (the request's first row in the concatenated buffer).",
    )
)


def _decode_inputs(params, build, gen):
    ids = _logical_ids(build, gen, "address.decode")
    if "block_table" in build:
        table = _ints(build["block_table"])
    else:
        rows_per_block = int(params["block_size"]) // int(params["ratio"])
        need_blocks = int(ids.max()) // rows_per_block + 1
        pool = int(build.get("pool", 4 * need_blocks))
        table = torch.stack([torch.randperm(pool, generator=gen)[:need_blocks] for _ in range(ids.shape[0])])
        table = table.to(torch.int32)
    return {"ids": ids, "block_table": table}


register(
    Component(
        name="address.decode",
        summary="decode: logical row j -> block_table[j // (B/r)] * (B/r) + j % (B/r), -1 kept",
        upstream="seed A.4.3 (convert_kv_index)",
        inputs=(
            T("ids", "int32", "b S K", "logical rows, -1 absent"),
            T("block_table", "int32", "[b] nblocks", "physical block of each logical block (one row per request)"),
        ),
        outputs=(OutputSpec("slots", "exact", "physical slot in the ratio-r cache, or -1", "int32", "b S K"),),
        params=(
            P("block_size", "int", "token positions per allocator block", "positions"),
            P("ratio", "int", "compress ratio", choices=(1, 2)),
        ),
        dims={
            "b": "batch",
            "S": "queries",
            "K": "lanes",
            "[b]": "requests (absent: one table for all)",
            "nblocks": "logical blocks",
        },
        build=_decode_inputs,
        reference=lambda inputs, params: {
            "slots": ad.address_decode(
                inputs["ids"], inputs["block_table"], int(params["block_size"]), int(params["ratio"])
            )
        },
        floor=3,
        notes="params: block_size B (token positions per allocator block), ratio r; block_table int32 "
        "[nblocks] or [b, nblocks] (one row per request of ids' batch dim).",
    )
)
