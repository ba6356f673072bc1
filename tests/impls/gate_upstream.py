"""`UpstreamTorch`: every floating-point component computed the way upstream computes it.

A gate for the harness: plain torch ops on CPU in upstream's dtypes and order (`upstream_ops`),
not the reference's float64-exact accumulations. A correct implementation that rounds the way
DeepSeek's `model.py` / `kernel.py` do must pass; where it cannot, the difference is upstream's
own rounding. Run it:

    conformance run --impl tests/impls/gate_upstream.py:UpstreamTorch --no-isolate

Components without floating-point arithmetic run the reference. `attention` and the ratio-2
compressor support upstream's schedules only (one prefill at position 0, then single-token decode
steps); any other schedule is `Unsupported`. The ratio-1 compressor keeps no state, so it takes
any schedule.
"""

from __future__ import annotations

import torch

import upstream_ops as up
from upstream_attention import attention_call, weight
from gate import Gate, bare, table_args
from v41_conformance import Unsupported


def _eps(params: dict) -> float:
    return float(params.get("eps", 1e-20))


def _as_complex(table: torch.Tensor) -> torch.Tensor:
    """fp32 (cos, sin) table [..., rope_dim/2, 2] -> upstream's complex64 freqs_cis rows."""
    return torch.view_as_complex(table.contiguous())


# --- rope -------------------------------------------------------------------------------------


def rope_yarn_table(inputs, params):
    args = table_args(params)
    inv = up.yarn_inv_freq(**args, device=inputs["positions"].device)
    return {"inv_freq": inv, "table": torch.view_as_real(up.freqs_cis_rows(inputs["positions"], inv)).contiguous()}


def rope_apply(inputs, params):
    return {"y": up.apply_rotary_emb(inputs["x"], _as_complex(inputs["table"]), bool(params.get("inverse", False)))}


# --- numerics ---------------------------------------------------------------------------------


def quant_e2m1(inputs, params):
    codes = up.e2m1_code(inputs["v"])
    return {"codes": codes, "y": up.e2m1_value(codes)}


def _quantiser(fn):
    def run(inputs, params):
        return fn(inputs["x"])._asdict()

    return run


def linear_f32(inputs, params):
    return {"y": up.linear(inputs["x"], inputs["w"])}


def norm_rms(inputs, params):
    return {"y": up.rms_norm(inputs["x"], inputs["weight"], _eps(params))}


def kv_finish(inputs, params):
    """Main row (M:758-760) and index key (M:537-548) of the latents at their group positions j*r."""
    latent, ratio = inputs["latent"], int(params.get("ratio", 2))
    freqs_cis = _as_complex(inputs["table"])[inputs["groups"] * ratio]
    main_rope = up.apply_rotary_emb(latent, freqs_cis)
    main = up.fp4_act_quant_e4m3(main_rope)
    index_norm = up.rms_norm(up.linear(latent, inputs["wk"]), inputs["k_norm_w"], _eps(params))
    index = up.fp4_act_quant_e8m0(up.apply_rotary_emb(index_norm, freqs_cis))
    return {
        "main": main.y,
        "main_rope": main_rope,
        "main_packed": up.pack_nibbles(main.codes),
        "main_scale_bytes": main.scale_bytes,
        "index_k": index.y,
        "index_norm": index_norm,
        "index_packed": up.pack_nibbles(index.codes),
        "index_scale_bytes": index.scale_bytes,
    }


# --- indexer, candidates, top-k ----------------------------------------------------------------


def _leak_policy(ids: torch.Tensor, candidates: torch.Tensor, params: dict) -> torch.Tensor:
    """Apply params.candidate_leak: `upstream` keeps upstream's ids, `drop` removes non-candidates."""
    if params.get("candidate_leak", "upstream") == "drop":
        return up.drop_non_candidates(ids, candidates, int(params.get("offset", 0)))
    return ids


def indexer_weights(inputs, params):
    return {"weights": up.index_head_weights(inputs["x"], inputs["weights_proj"], int(params["index_head_dim"]))}


def indexer_scores(inputs, params):
    return {"scores": up.index_scores(inputs["q"], inputs["k"], inputs["w"])}


def indexer_select(inputs, params):
    scores, candidates = inputs["scores"], inputs["candidates"]
    lens = up.query_compress_lens(int(params["start"]), scores.shape[1], int(params["ratio"]), scores.device)
    ids = up.select_topk(scores, lens, int(params["index_topk"]), int(params.get("offset", 0)), candidates)
    return {"ids": _leak_policy(ids, candidates, params)}


def indexer_forward(inputs, params):
    candidates = inputs["candidates"]
    ids, scores, query = up.indexer_forward(
        inputs["x"],
        inputs["qr"],
        inputs["index_k_cache"],
        weight(inputs, "wq_b"),
        inputs["weights_proj"],
        _as_complex(inputs["freqs"]),
        int(params["start"]),
        int(params["ratio"]),
        int(params["index_topk"]),
        int(params.get("offset", 0)),
        candidates,
        with_query=True,
    )
    return {"ids": _leak_policy(ids, candidates, params), "scores": scores, "index_q": query}


def candidates_select(inputs, params):
    return {
        "mask": up.select_candidate_blocks(
            inputs["logits"], inputs["compress_lens"], int(params["topk_blocks"]), int(params["block_size"])
        )
    }


def topk_torch_cpu(inputs, params):
    top = torch.topk(
        inputs["values"],
        int(params["k"]),
        dim=-1,
        largest=bool(params.get("largest", True)),
        sorted=bool(params.get("sorted", True)),
    )
    return {"values": top.values, "indices": top.indices}


def sparse_attn(inputs, params):
    return {
        "o": up.sparse_attn(
            inputs["q"], inputs["kv"], inputs["attn_sink"], inputs["topk_idxs"], float(params["softmax_scale"])
        )
    }


# --- compressor ----------------------------------------------------------------------------------


def check_upstream_schedule(schedule) -> None:
    """Raise Unsupported unless the schedule is a prefill at 0 followed by single-token decode steps."""
    steps = [(int(a), int(b)) for a, b in schedule]
    for (_, prev_end), (start, end) in zip(steps, steps[1:]):
        if start != prev_end:
            raise Unsupported(f"rollback to {start} after a step ending at {prev_end}: upstream has no rollback")
        if end - start != 1:
            raise Unsupported(f"step [{start}, {end}) decodes {end - start} tokens: upstream decodes one per call")


def compressor(inputs, params):
    """One schedule step of upstream's Compressor.forward, with its state kept in the harness ring.

    Ratio 1 keeps no state, so every schedule is upstream-defined; ratio 2 only upstream's own.
    """
    ratio = int(params.get("ratio", 2))
    if ratio == 2:
        check_upstream_schedule(params["schedule"])
    step = up.compressor_forward(
        inputs["x"],
        int(params["start"]),
        inputs["ring"],
        ratio,
        inputs["wkv"],
        inputs["norm_w"],
        _eps(params),
        inputs.get("wgate"),
    )
    return step._asdict()


# --- the implementation ------------------------------------------------------------------------


def linear_fp8(inputs, params):
    y, q = up.fp8_linear(inputs["x"], inputs["weight"], inputs["weight_scale"])
    return {"y": y, "x_codes": q.codes, "x_scale_bytes": q.scale_bytes}


HANDLERS = {
    "linear.fp8": linear_fp8,
    "rope.yarn_table": rope_yarn_table,
    "rope.apply": rope_apply,
    "quant.e2m1": quant_e2m1,
    "quant.fp4_e4m3": _quantiser(up.fp4_act_quant_e4m3),
    "quant.fp4_e8m0": _quantiser(up.fp4_act_quant_e8m0),
    "quant.fp8_ue8m0": _quantiser(up.act_quant),
    "linear.f32": linear_f32,
    "norm.rms": norm_rms,
    "kv.finish": kv_finish,
    "indexer.weights": indexer_weights,
    "indexer.scores": indexer_scores,
    "indexer.select": indexer_select,
    "indexer": indexer_forward,
    "candidates.select": candidates_select,
    "topk.torch_cpu": topk_torch_cpu,
    "sparse_attn": sparse_attn,
    "compressor": compressor,
    "attention": attention_call,
}


class UpstreamTorch(Gate):
    """Upstream arithmetic for every floating-point component; the reference for the rest."""

    handlers = HANDLERS


BareUpstreamTorch = bare(UpstreamTorch)
