"""One `attention` call (one layer, one schedule step) as upstream `Attention.forward` computes it.

The arithmetic is `upstream_ops`: one GEMM per projection over the step's S tokens (bf16
`F.linear`, the ratio-2 Compressor in fp32), RMSNorm, `apply_rotary_emb`, the kernel.py
quantisers, the tiled `sparse_attn`, and the grouped `wo_a` as a bf16 `torch.einsum`
(docs/v41-reference.md §5.2). The bookkeeping is the harness's (docs/attention.md): the layer's
state and the shared slots `rt.*` come in as tensors and go out as tensors, the window ring and
window ids are the reference's (`window_part`), and `index_k` is published per the case's §10.1
policy.

Upstream defines a prefill at position 0 followed by single-token decode steps only; a case whose
schedule is the harness's generalisation (§10.3) is `Unsupported`.
"""

from __future__ import annotations

import torch

import upstream_ops as up
from v41_conformance import Unsupported
from v41_conformance.components.attention_steps import config_of
from v41_conformance.reference.attention import window_part
from v41_conformance.reference.config import AttnConfig, LayerRole, rope_params


def attention_call(inputs: dict, params: dict) -> dict:
    """Upstream `Attention.forward` (M:765-789) of layer params.layer over x bf16 [b, S, dim], with
    its values at the decision points as intermediates (qr, kv, index_q, index_scores, o, z, ...)."""
    if params.get("generalisation"):
        raise Unsupported(
            f"schedule {params['schedule_name']} is the harness's generalisation (§10.3): upstream "
            "defines only a prefill at position 0 followed by single-token decode steps"
        )
    cfg, role = config_of(params), LayerRole(**params["role"])
    start, x = int(params["start"]), inputs["x"]
    freqs_cis = up.precompute_freqs_cis(**rope_params(cfg, role.ratio), device=inputs["x"].device)
    freqs = freqs_cis[start : start + x.shape[1]]
    qr = up.rms_norm(up.linear(x, weight(inputs, "wq_a")), inputs["q_norm"], cfg.norm_eps)
    q = up.apply_rotary_emb(up.linear(qr, weight(inputs, "wq_b")).unflatten(-1, (cfg.n_heads, cfg.head_dim)), freqs)
    kv_pre = up.apply_rotary_emb(
        up.rms_norm(up.linear(x, weight(inputs, "wkv")), inputs["kv_norm"], cfg.norm_eps), freqs
    )
    kv = up.act_quant(kv_pre).y
    window_kv, window_ids, window = window_part(inputs["window"], kv, start)
    out = {"window": window, "window_ids": window_ids, "qr": qr, "kv": kv_pre, "q": q}
    compressed_kv, compressed_ids = _compressed_part(inputs, params, cfg, role, qr, freqs_cis, window_kv.shape[1], out)
    o = up.sparse_attn(
        q,
        torch.cat([window_kv, compressed_kv], dim=1),
        inputs["attn_sink"],
        torch.cat([window_ids, compressed_ids], dim=-1),
        cfg.softmax_scale,
    )
    out["o"] = up.apply_rotary_emb(o, freqs, inverse=True)
    out["z"] = output_rank(out["o"], inputs, cfg)
    out["out"] = up.linear(out["z"], weight(inputs, "wo_b"))
    out["compressed_ids"] = compressed_ids
    return out


def output_rank(o: torch.Tensor, inputs: dict, cfg: AttnConfig) -> torch.Tensor:
    """einsum("bsgd,grd->bsgr", o, wo_a) on bf16 tensors (§5.2 step 8): bf16 [b, S, g * o_lora], wo_b's input."""
    b, S = o.shape[:2]
    wo_a = inputs["wo_a"].view(cfg.o_groups, cfg.o_lora_rank, -1)
    return torch.einsum("bsgd,grd->bsgr", o.reshape(b, S, cfg.o_groups, -1), wo_a).flatten(2)


def weight(inputs: dict, name: str):
    """A Linear's weight: (codes, tile scales) for an fp8 Linear (`<name>.scale` given), else the tensor."""
    scale = inputs.get(f"{name}.scale")
    return inputs[name] if scale is None else (inputs[name], scale)


def _slot(inputs: dict, out: dict, name: str) -> torch.Tensor:
    """A shared slot as this layer reads it: its own publication of this call, else the latest one."""
    key = f"rt.{name}"
    return out[key] if key in out else inputs[key]


def _compressed_part(
    inputs: dict,
    params: dict,
    cfg: AttnConfig,
    role: LayerRole,
    qr: torch.Tensor,
    freqs_cis: torch.Tensor,
    offset: int,
    out: dict,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(compressed KV rows [b, T, hd], compressed ids int32 [b, S, k]) of a ratio > 0 layer (M:722-763);
    the layer's new state and its publications go into `out`. Ratio 0: nothing."""
    x = inputs["x"]
    b, S, _ = x.shape
    if not role.ratio:
        return x.new_zeros(b, 0, cfg.head_dim), torch.zeros(b, S, 0, dtype=torch.int32, device=x.device)
    start = int(params["start"])
    if role.is_kv_source:
        _compress(inputs, cfg, role, start, freqs_cis, params["index_k_policy"], out)
    if role.is_index_source:
        _select(inputs, cfg, role, qr, start, freqs_cis[start : start + S], offset, out)
    ids = _slot(inputs, out, "topk_idxs")
    return _slot(inputs, out, "compress_kv")[:b, : (start + S) // role.ratio], ids


def _compress(
    inputs: dict, cfg: AttnConfig, role: LayerRole, start: int, freqs_cis: torch.Tensor, policy: str, out: dict
) -> None:
    """A kv source (M:739-763, M:537-548): Compressor, the latent's RoPE + fp4 e4m3 row and, for a key
    owner, the index key's fp4 e8m0 row, both at the group's first position; cache writes; publication."""
    step = up.compressor_forward(
        inputs["x"],
        start,
        inputs["comp_ring"],
        role.ratio,
        inputs["comp.wkv"],
        inputs["comp.norm"],
        cfg.norm_eps,
        inputs.get("comp.wgate"),
    )
    groups, freqs = step.row_positions // role.ratio, freqs_cis[step.row_positions]
    compress_kv = inputs["compress_kv"].clone()
    out["latent"] = step.rows
    out["compress_pre"] = up.apply_rotary_emb(step.rows, freqs)
    compress_kv[:, groups] = up.fp4_act_quant_e4m3(out["compress_pre"]).y
    out.update({"compress_kv": compress_kv, "comp_ring": step.ring, "rt.compress_kv": compress_kv})
    if not role.owns_k:
        return
    keys = up.rms_norm(up.linear(step.rows, inputs["wk"]), inputs["k_norm"], cfg.norm_eps)
    index_k = inputs["index_k"].clone()
    out["index_k_pre"] = up.apply_rotary_emb(keys, freqs)
    index_k[:, groups] = up.fp4_act_quant_e8m0(out["index_k_pre"]).y
    out["index_k"] = index_k
    if groups.numel() or policy == "fixed":  # §10.1: upstream republishes only when a group closed
        out["rt.index_k"] = index_k


def _select(
    inputs: dict,
    cfg: AttnConfig,
    role: LayerRole,
    qr: torch.Tensor,
    start: int,
    freqs: torch.Tensor,
    offset: int,
    out: dict,
) -> None:
    """An index source (M:722-737, M:550-580): its selection, and the candidate source's block mask."""
    x = inputs["x"]
    b, S, _ = x.shape
    T = (start + S) // role.ratio
    candidates = torch.zeros(b, S, 0, dtype=torch.bool, device=x.device)
    if T == 0:  # upstream skips the indexer and publishes an empty selection
        ids = torch.zeros(b, S, 0, dtype=torch.int32, device=x.device)
    else:
        consumed = inputs["rt.candidates"] if role.candidate_source is not None else None
        ids, scores, out["index_q"] = up.indexer_forward(
            x,
            qr,
            _slot(inputs, out, "index_k"),
            weight(inputs, "idx.wq_b"),
            inputs["idx.weights_proj"],
            freqs,
            start,
            role.ratio,
            cfg.index_topk,
            offset,
            consumed,
            with_query=True,
        )
        lens = up.query_compress_lens(start, S, role.ratio, x.device)
        out["index_scores"] = up.mask_invisible(scores, lens)
        if role.is_candidate_source:
            candidates = up.select_candidate_blocks(
                out["index_scores"], lens, cfg.candidate_topk_blocks, cfg.candidate_block_size
            )
            out["rt.candidates"] = candidates
    if role.is_candidate_source:
        out["candidates"] = candidates
    out["rt.topk_idxs"] = ids
