"""`sparse_attn`: attention over gathered KV rows with a per-head sink (kernel.py K41:296-403).

The golden follows the reference kernel's arithmetic (`v41_conformance.reference.sparse_attn.sparse_attn`,
docs/v41-reference.md §6.3): scores in fp32 scaled by softmax_scale, a running max over tiles of
64 index lanes in row order starting at -1e30, probabilities rounded to bf16 before the value
product, the sink a raw logit in the denominator only. A row whose lanes are all absent (-1)
gives exactly 0: those rows are found from `topk_idxs` (structure), never from a 0 in the golden,
which a row with present lanes can also hold (P = [1, 0.1875] against values that cancel). The bf16 tolerance on `o` is calibrated on the plain one-softmax variant
(`sparse_attn_plain`), which must pass (docs/attention.md).

Inputs are built from the case's `build:` block:
- `shape: [b, m, h, d]`, `n` KV rows, `k` lanes per row; q ~ N(0, q_scale^2), kv ~ N(0, 1);
- `sinks`: explicit per-head logits (tiled over h), else N(0, sink_scale^2);
- `absent`: fraction of lanes set to -1; `all_absent`: rows [batch, query] with every lane -1;
  `absent_first_tile`: rows whose first 64 lanes are all -1 (the running max stays -1e30 there);
- ids are distinct KV rows in random order per row (`order: ascending` sorts the present ids).
"""

from __future__ import annotations

import dataclasses

import torch

from ..cases import CaseSpec
from ..errors import CaseSpecError
from ..logit_scale import scale_context
from ..reference.sparse_attn import TILE, sparse_attn
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from .build import need, normal, tile_to

NAME = "sparse_attn"


def _with_scale(spec: CaseSpec) -> list[CaseSpec]:
    """Add params.softmax_scale = d^-0.5 (a Python float, as upstream) unless the case gives one."""
    if "softmax_scale" in spec.params:
        return [spec]
    shape = need(spec.build, "shape", NAME)
    return [dataclasses.replace(spec, params={**spec.params, "softmax_scale": int(shape[3]) ** -0.5})]


def _ids(gen: torch.Generator, b: int, m: int, n: int, k: int, build: dict) -> torch.Tensor:
    """int32 [b, m, k]: distinct rows of [0, n) per query row, then the requested absences."""
    if k > n:
        raise CaseSpecError(f"{NAME}: k = {k} lanes need at least k distinct KV rows, n = {n}")
    ids = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(b * m)]).view(b, m, k)
    if build.get("order") == "ascending":
        ids = ids.sort(dim=-1).values
    absent = torch.rand((b, m, k), generator=gen) < float(build.get("absent", 0.0))
    for bi, mi in build.get("absent_first_tile", []):
        absent[bi, mi, :TILE] = True
    for bi, mi in build.get("all_absent", []):
        absent[bi, mi] = True
    return ids.masked_fill(absent, -1).to(torch.int32)


def _inputs(params, build, gen):
    b, m, h, d = (int(v) for v in need(build, "shape", NAME))
    n, k = int(need(build, "n", NAME)), int(need(build, "k", NAME))
    q = normal(gen, [b, m, h, d], float(build.get("q_scale", 1.0)))
    kv = normal(gen, [b, n, d], float(build.get("kv_scale", 1.0)))
    if "sinks" in build:
        sink = tile_to([float(s) for s in build["sinks"]], [h])
    else:
        sink = normal(gen, [h], float(build.get("sink_scale", 1.0)), torch.float32)
    return {"q": q, "kv": kv, "attn_sink": sink, "topk_idxs": _ids(gen, b, m, n, k, build)}


def _reference(inputs, params):
    return {
        "o": sparse_attn(
            inputs["q"], inputs["kv"], inputs["attn_sink"], inputs["topk_idxs"], float(params["softmax_scale"])
        )
    }


register(
    Component(
        name=NAME,
        summary="sparse attention with a sink logit in the denominator; 64-lane running-max tiles, bf16 P",
        upstream="K41:296-403 (sparse_attn); M:776",
        inputs=(
            T("q", "bf16", "b m h d"),
            T("kv", "bf16", "b n d", "K = V"),
            T("attn_sink", "f32", "h", "a raw logit per head (not scaled)"),
            T("topk_idxs", "int32", "b m K", "kv rows per query, -1 = absent lane"),
        ),
        params=(P("softmax_scale", "float", "the score scale head_dim^-0.5 (used as fp32)"),),
        dims={"b": "batch", "m": "query rows", "h": "heads", "d": "head_dim", "n": "kv rows", "K": "lanes per row"},
        outputs=(
            OutputSpec(
                "o", "bf16", "exactly 0 on a row whose lanes are all -1", "bf16", "b m h d", absent_rows="in.topk_idxs"
            ),
        ),
        build=_inputs,
        reference=_reference,
        judge_context=lambda inputs, params: scale_context(
            "o", inputs["q"], inputs["kv"], inputs["attn_sink"], inputs["topk_idxs"], float(params["softmax_scale"])
        ),
        floor=5,
        notes="q bf16 [b, m, h, d]; kv bf16 [b, n, d] (K = V); attn_sink fp32 [h], a raw logit (not scaled); "
        "topk_idxs int32 [b, m, K], -1 = absent lane; params.softmax_scale (Python float, used as fp32). "
        "Goldens follow the tiled kernel (running max from -1e30, tiles of 64 lanes in row order, bf16 P "
        "before P.V); the tolerance is calibrated on a plain fp32 softmax (docs/attention.md).",
        extra={"expand": _with_scale},
    )
)
