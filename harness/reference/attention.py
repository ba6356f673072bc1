"""Attention forward for any compress ratio, with the explicit shared runtime (M:613-789).

`attention_step` is upstream `Attention.forward` (docs/v41-reference.md §5.2) for one layer
and one chunk of S tokens at `start`, in either dtype mode of §8: "bf16" (bf16 weights, plain
bf16 GEMMs) or "fp8", upstream's default, where wq_a, wq_b, wkv, wo_b and the indexer's wq_b are
`Fp8Weight`s and quantise their input with act_quant before the block-scaled fp8 GEMM
(`fp8_linear.project`, §6.4); the compressor's wkv/wgate, weights_proj, wk and wo_a stay bf16/fp32:

1. query: qr = q_norm(wq_a(x)); q = wq_b(qr) -> [b, S, h, hd]; RoPE on the last rope dims
   at the tokens' positions (M:765-772);
2. window KV (M:700-720): kv = kv_norm(wkv(x)), RoPE, fp8 e4m3 QDQ with ue8m0 scales,
   block 32 over all hd channels; ring writes and window ids (below);
3. ratio > 0 (M:722-763): kv sources run compressor_step and kv_finish, write their
   compressed rows (and index keys), publish compress_kv (and index_k, §10.1 policy);
   index sources run the indexer (candidate source: publish its block mask; consumer:
   apply the published mask) and publish topk_idxs; other layers reuse topk_idxs;
4. kv = cat(window part, compress_kv[:b, :end//r]); ids = cat(window ids, compressed ids)
   (window first, oldest first; compressed ids ascending, offset = window part length);
5. o = sparse_attn(q, kv, attn_sink, ids, head_dim^-0.5); inverse RoPE on o's tail;
   grouped output projection: einsum with wo_a viewed [g, o_lora, h*hd/g], then wo_b.

Window part, by step kind (upstream defines the first two only, §3.5):
- prefill, start 0: the chunk's own S rows, ids `window_ids_prefill`, offset S;
- decode, start > 0 and S = 1: the ring after writing slot start % win, ids
  `window_ids_decode`, offset win;
- chunk, start > 0 and S > 1 (harness-defined generalisation of §10.3): the ring as it was
  before the step (win rows) followed by the chunk's S rows, offset win + S. Lane j of
  query t stands for position p = start + t - win + 1 + j (oldest first): -1 when p < 0,
  ring slot p % win when p < start, row win + (p - start) otherwise. Each query therefore
  sees exactly the window it would see token by token (per-query visibility), and the ring
  ends up as per-token writes p % win would leave it. The compressor writes and pools per
  token (compressor.py) and the indexer masks per query with compress_lens (t+1+start)//r
  (indexer.py). Results equal one-shot prefill up to the tile grouping of sparse_attn
  (window width and offsets differ), i.e. within a few bf16 ulps.
Every GEMM accumulates exactly (float64 sums of exact bf16 x bf16 or fp8 x fp8 products, one
rounding; `numerics._accumulate`, `fp8_linear`) and every norm works on its own row, so a token's q,
kv and output do not depend on how many tokens share a step: GEMMs run over the whole chunk at
once, and chunked results equal one-shot ones (as compressor.py and kv_finish.py do).

`run_model` drives every layer of a config through a schedule of contiguous (start, end)
steps. Each layer gets its own input (no residual stream): goldens per layer stay
independent, as §11 recommends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from v41_conformance.reference.candidates import select_candidate_blocks
from v41_conformance.reference.compressor import CompressorWeights, compressor_step
from v41_conformance.reference.config import AttnConfig, layer_roles, rope_params
from v41_conformance.reference.numerics import einsum_f32, randn
from v41_conformance.reference.indexer import IndexerWeights, indexer_forward
from v41_conformance.reference.kv_finish import kv_finish
from v41_conformance.reference import numerics as nx  # quantisers looked up at call time: one override point
from v41_conformance.reference.fp8_linear import Fp8Weight, project
from v41_conformance.reference.numerics import rms_norm
from v41_conformance.reference.rope import apply_rotary, freqs_table
from v41_conformance.reference.runtime import LayerState, SharedRuntime, check_policy, init_states
from v41_conformance.reference.sparse_attn import sparse_attn
from v41_conformance.reference.window import window_ids_decode, window_ids_prefill

FP8_BLOCK = 32  # fp8_block_size (M:23-30), window KV act_quant


@dataclass(frozen=True)
class LayerWeights:
    """One layer's attention parameters (§5.1, §3.1, §4.1), bf16 unless noted. With the fp8
    checkpoint (§6.4) wq_a, wq_b, wkv and wo_b (and the indexer's wq_b) are `Fp8Weight`s."""

    wq_a: torch.Tensor | Fp8Weight  # [q_lora, dim]
    q_norm: torch.Tensor  # [q_lora]
    wq_b: torch.Tensor | Fp8Weight  # [h * hd, q_lora]
    wkv: torch.Tensor | Fp8Weight  # [hd, dim]
    kv_norm: torch.Tensor  # [hd]
    wo_a: torch.Tensor  # [g * o_lora, h * hd / g], bf16 in both weight modes
    wo_b: torch.Tensor | Fp8Weight  # [dim, g * o_lora]
    attn_sink: torch.Tensor  # fp32 [h]
    compressor: CompressorWeights | None = None  # kv sources
    indexer: IndexerWeights | None = None  # index sources
    wk: torch.Tensor | None = None  # [ihd, hd], key-owning index sources
    k_norm: torch.Tensor | None = None  # [ihd]


class AttnStepResult(NamedTuple):
    """One layer, one step.

    out bf16 [b, S, dim]; ids int32 [b, S, w + k] (window then compressed);
    window_ids int32 [b, S, w]; compressed_ids int32 [b, S, k] (k = 0 at ratio 0);
    candidates bool [b, S, T] published (candidate source) or applied (consumer), else None;
    state / runtime: the layer's new state and the new shared runtime;
    sources: slot name -> layer whose data this layer read (for reports);
    dumps: named intermediates (qr, q, window_kv and window_kv_pre (before its fp8 QDQ), kv, attn,
    o (after the inverse RoPE), z (wo_a's output, wo_b's input), index_q (the index query before
    its fp4 round trip), index_scores / visible_scores / masked_scores, compress_pre /
    index_k_pre (rows before their fp4 QDQ), ...).
    """

    out: torch.Tensor
    ids: torch.Tensor
    window_ids: torch.Tensor
    compressed_ids: torch.Tensor
    candidates: torch.Tensor | None
    state: LayerState
    runtime: SharedRuntime
    sources: dict
    dumps: dict


class ModelRun(NamedTuple):
    """steps[i][layer]: AttnStepResult of schedule step i; final states and runtime."""

    steps: list[list[AttnStepResult]]
    states: tuple[LayerState, ...]
    runtime: SharedRuntime


# ----------------------------------------------------------------------------- weights


def init_weights(cfg: AttnConfig, seed: int) -> tuple[LayerWeights, ...]:
    """Deterministic random weights for every layer (one torch.Generator, layer order).

    Linears ~ N(0, 1/fan_in) so unit-RMS inputs give O(1) outputs; norm weights 1 + 0.1 N;
    sinks N(0, 1). bf16 storage; ratio-2 compressor weights are bf16 values promoted to fp32
    (§3.1: the checkpoint is bf16, upstream's Linear is fp32).
    """
    g = torch.Generator().manual_seed(seed)

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return (randn(out_f, in_f, generator=g) * in_f**-0.5).to(torch.bfloat16)

    def norm(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * randn(n, generator=g)).to(torch.bfloat16)

    h, hd, ihd = cfg.n_heads, cfg.head_dim, cfg.index_head_dim
    group_in = h * hd // cfg.o_groups
    layers = []
    for role in layer_roles(cfg):
        base: dict[str, Any] = dict(
            wq_a=lin(cfg.q_lora_rank, cfg.dim),
            q_norm=norm(cfg.q_lora_rank),
            wq_b=lin(h * hd, cfg.q_lora_rank),
            wkv=lin(hd, cfg.dim),
            kv_norm=norm(hd),
            wo_a=lin(cfg.o_groups * cfg.o_lora_rank, group_in),
            wo_b=lin(cfg.dim, cfg.o_groups * cfg.o_lora_rank),
            attn_sink=randn(h, generator=g),
        )
        if role.is_kv_source:
            wkv = lin(hd, cfg.dim)
            gate = lin(hd, cfg.dim).float() if role.ratio == 2 else None
            base["compressor"] = CompressorWeights(
                wkv.float() if role.ratio == 2 else wkv, norm(hd), gate, cfg.norm_eps
            )
        if role.is_index_source:
            base["indexer"] = IndexerWeights(
                lin(cfg.index_n_heads * ihd, cfg.q_lora_rank), lin(cfg.index_n_heads, cfg.dim)
            )
        if role.owns_k:
            base["wk"], base["k_norm"] = lin(ihd, hd), norm(ihd)
        layers.append(LayerWeights(**base))
    return tuple(layers)


# ----------------------------------------------------------------------------- helpers


def rope_table(cfg: AttnConfig, ratio: int) -> torch.Tensor:
    """fp32 [max_seq_len, rope/2, 2]: the table a layer of this ratio uses (§2.2)."""
    return freqs_table(**rope_params(cfg, ratio))


def window_part_length(start: int, S: int, win: int) -> int:
    """Rows of a step's window part, i.e. the compressed ids' offset: S at prefill, win at decode,
    win + S for a harness-defined chunk (`window_part`)."""
    if start == 0:
        return S
    return win if S == 1 else win + S


def _chunk_window_ids(start: int, S: int, win: int) -> torch.Tensor:
    """int32 [S, win] for the harness chunk layout (module docstring)."""
    pos = start + torch.arange(S).unsqueeze(1) - win + 1 + torch.arange(win)  # [S, win]
    ids = torch.where(pos < start, pos % win, win + pos - start)
    return torch.where(pos < 0, -1, ids).to(torch.int32)


def step_window_ids(start: int, S: int, win: int) -> torch.Tensor:
    """int32 [S, w]: the window lanes of a step's queries into its window part (module docstring):
    prefill (start 0) the chunk's own rows, decode (S = 1) the ring, a chunk the ring then its rows."""
    if start == 0:
        return window_ids_prefill(S, win)
    if S == 1:
        return window_ids_decode(start, win)
    return _chunk_window_ids(start, S, win)


def window_part(ring: torch.Tensor, kv: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(window KV part [b, n, hd], window ids int32 [b, S, w], new ring [b, win, hd]).

    ring bf16 [b, win, hd] before the step; kv bf16 [b, S, hd] the chunk's finished rows.
    """
    b, S, _ = kv.shape
    win = ring.shape[1]
    new_ring = ring.clone()
    for t in range(max(0, S - win), S):  # per-token writes, later wins
        new_ring[:, (start + t) % win] = kv[:, t]
    if start == 0:
        part = kv
    elif S == 1:
        part = new_ring
    else:
        part = torch.cat([ring, kv], dim=1)
    ids = step_window_ids(start, S, win).to(kv.device)  # on the rows' device (a port on a GPU may call this)
    return part, ids.unsqueeze(0).expand(b, -1, -1).contiguous(), new_ring


# ----------------------------------------------------------------------------- the step


def attention_step(
    layer: int,
    cfg: AttnConfig,
    weights: LayerWeights,
    state: LayerState,
    runtime: SharedRuntime,
    x: torch.Tensor,
    start: int,
    policy: str = "upstream",
) -> AttnStepResult:
    """Layer `layer` over x bf16 [b, S, dim] at positions start..start+S-1 (module docstring).

    policy: "upstream" (bit-faithful §10.1: index_k republished only when a group closes) or
    "fixed" (key-owning sources publish every step, so each reads its own keys).
    """
    check_policy(policy)
    role = layer_roles(cfg)[layer]
    b, S, dim = x.shape
    end = start + S
    if x.dtype != torch.bfloat16 or dim != cfg.dim or S < 1:
        raise ValueError(f"x must be bf16 [b, S >= 1, dim={cfg.dim}], got {x.dtype} {tuple(x.shape)}")
    if start != state.end:
        raise ValueError(
            f"layer {layer}: step starts at {start} but the state holds "
            f"{state.end} positions; steps must be contiguous (no rollback here)"
        )
    if end > cfg.max_seq_len:
        raise ValueError(f"step ends at {end} > max_seq_len {cfg.max_seq_len}")
    w, eps, rd = weights, cfg.norm_eps, cfg.rope_head_dim
    table = rope_table(cfg, role.ratio)
    freqs = table[start:end]  # [S, rd/2, 2]

    qr = rms_norm(project(x, w.wq_a), w.q_norm, eps)
    q = project(qr, w.wq_b).unflatten(-1, (cfg.n_heads, -1))
    q = apply_rotary(q, freqs, rd)  # [b, S, h, hd]
    kv = rms_norm(project(x, w.wkv), w.kv_norm, eps)
    kv_rope = apply_rotary(kv, freqs, rd)  # [b, S, hd]
    kv = nx.fp8_qdq_ue8m0(kv_rope, FP8_BLOCK).y  # [b, S, hd]
    win_kv, win_ids, new_window = window_part(state.window, kv, start)
    offset = win_kv.shape[1]

    dumps = {"qr": qr, "q": q, "window_kv": kv, "window_kv_pre": kv_rope}
    sources: dict = {}
    ckv_cache, ik_cache, ring = state.compress_kv, state.index_k, state.comp_ring
    comp_kv = kv.new_zeros(b, 0, cfg.head_dim)
    comp_ids = torch.zeros(b, S, 0, dtype=torch.int32)
    cand = None
    if role.ratio > 0:
        r, T = role.ratio, end // role.ratio
        if role.is_kv_source:
            ckv_cache, ik_cache, ring, runtime = _compress(
                layer, role, cfg, w, state, runtime, x, start, table, policy, dumps
            )
        comp_kv = runtime.read("compress_kv", layer)[:b, :T]
        sources["compress_kv"] = runtime.compress_kv_from
        if role.is_index_source:
            comp_ids, cand, runtime = _select(layer, role, cfg, w, runtime, x, qr, start, table, offset, sources, dumps)
        else:
            comp_ids = runtime.read("topk_idxs", layer)
            sources["topk_idxs"] = runtime.topk_idxs_from
            if tuple(comp_ids.shape[:2]) != (b, S):
                raise ValueError(
                    f"layer {layer} reuses topk_idxs {tuple(comp_ids.shape)} from "
                    f"layer {runtime.topk_idxs_from}, expected [{b}, {S}, k]"
                )
        if comp_kv.shape[1] != T:
            raise ValueError(
                f"layer {layer}: compress_kv of layer {runtime.compress_kv_from} "
                f"has {comp_kv.shape[1]} rows, needs end // {r} = {T}"
            )

    kv_all = torch.cat([win_kv, comp_kv], dim=1)  # [b, n, hd]
    ids = torch.cat([win_ids, comp_ids], dim=-1)  # [b, S, w + k]
    attn = sparse_attn(q, kv_all, w.attn_sink, ids, cfg.softmax_scale)  # [b, S, h, hd]
    o = apply_rotary(attn, freqs, rd, inverse=True)
    z = output_rank(o, w.wo_a, cfg)  # [b, S, g * r]
    out = project(z, w.wo_b)  # [b, S, dim]
    dumps.update(kv=kv_all, attn=attn, o=o, z=z)
    new_state = LayerState(new_window, ckv_cache, ik_cache, ring, end)
    return AttnStepResult(out, ids, win_ids, comp_ids, cand, new_state, runtime, sources, dumps)


def output_rank(o: torch.Tensor, wo_a: torch.Tensor, cfg: AttnConfig) -> torch.Tensor:
    """The grouped wo_a projection (M:782-786): o bf16 [..., h, hd] -> z bf16 [..., g * o_lora], each
    group's h*hd/g channels times its o_lora rows, fp32 accumulate, one rounding (wo_b's input)."""
    return output_rank_acc(o, wo_a, cfg).to(torch.bfloat16)


def output_rank_acc(o: torch.Tensor, wo_a: torch.Tensor, cfg: AttnConfig) -> torch.Tensor:
    """`output_rank`'s fp32 accumulator, before its rounding to bf16: fp32 [..., g * o_lora]."""
    lead = o.shape[:-2]
    wo_a = wo_a.view(cfg.o_groups, cfg.o_lora_rank, -1)  # [g, r, h*hd/g]
    grouped = o.reshape(-1, cfg.o_groups, wo_a.shape[-1])  # [n, g, h*hd/g]
    return einsum_f32("ngd,grd->ngr", grouped, wo_a).reshape(*lead, -1)  # [n, g, r] flattened


def _compress(layer, role, cfg, w, state, runtime, x, start, table, policy, dumps):
    """Compressor + kv_finish + cache writes + publication of a kv source (M:739-763)."""
    step = compressor_step(x, start, state.comp_ring, w.compressor, role.ratio)
    owns = role.owns_k
    fin = kv_finish(
        step.rows,
        step.row_positions,
        table,
        cfg.rope_head_dim,
        w.wk if owns else None,
        w.k_norm if owns else None,
        cfg.norm_eps,
    )
    rows = step.row_positions // role.ratio  # [G]
    ckv = state.compress_kv.clone()
    ckv[:, rows] = fin.main
    runtime = runtime.publish(layer, compress_kv=ckv)  # unconditional
    ik = state.index_k
    if owns:
        ik = ik.clone()
        ik[:, rows] = fin.index_k
        if rows.numel() > 0 or policy == "fixed":  # §10.1
            runtime = runtime.publish(layer, index_k=ik)
    dumps.update(
        latent=step.rows,
        compress_rows=fin.main,
        index_k_rows=fin.index_k,
        compress_pre=fin.main_rope,
        index_k_pre=fin.index_rope,
    )
    return ckv, ik, step.ring, runtime


def _select(layer, role, cfg, w, runtime, x, qr, start, table, offset, sources, dumps):
    """Indexer of an index source, candidate publication/consumption (M:722-737, M:569-575)."""
    b, S, _ = x.shape
    T = (start + S) // role.ratio
    cand = None
    if T == 0:  # upstream skips the indexer; publishes an empty set
        ids = torch.zeros(b, S, 0, dtype=torch.int32)
    else:
        keys = runtime.read("index_k", layer)
        sources["index_k"] = runtime.index_k_from
        if role.candidate_source is not None:
            cand = runtime.read("candidates", layer)
            sources["candidates"] = runtime.candidates_from
        res = indexer_forward(
            x, qr, keys, start, role.ratio, w.indexer, table, cfg.rope_head_dim, cfg.index_topk, offset, candidates=cand
        )
        ids = res.ids
        dumps.update(
            index_scores=res.scores,
            visible_scores=res.visible_scores,
            masked_scores=res.masked_scores,
            index_q=res.query,
        )
        if role.is_candidate_source:
            cand = select_candidate_blocks(
                res.visible_scores, res.compress_lens, cfg.candidate_topk_blocks, cfg.candidate_block_size
            ).mask
            runtime = runtime.publish(layer, candidates=cand)
    runtime = runtime.publish(layer, topk_idxs=ids)
    return ids, cand, runtime


# ----------------------------------------------------------------------------- the model


def run_model(
    cfg: AttnConfig,
    weights: Sequence[LayerWeights],
    x_seq: torch.Tensor,
    schedule: Sequence[tuple[int, int]],
    policy: str = "upstream",
) -> ModelRun:
    """Every layer of `cfg` over contiguous steps (start, end), layers in order per step.

    x_seq bf16 [b, T, dim] (the same input for every layer) or [L, b, T, dim] (one per layer).
    Example (schedule A of §12): run_model(TINY_A, init_weights(TINY_A, 0), x,
        [(0, 21)] + [(p, p + 1) for p in range(21, 32)]).
    """
    check_policy(policy)
    n_layers = cfg.n_total_layers
    per_layer = x_seq if x_seq.dim() == 4 else x_seq.unsqueeze(0).expand(n_layers, -1, -1, -1)
    if per_layer.shape[0] != n_layers or len(weights) != n_layers:
        raise ValueError(
            f"need inputs and weights for {n_layers} layers; got x_seq "
            f"{tuple(x_seq.shape)} and {len(weights)} weight sets"
        )
    steps = [(int(s), int(e)) for s, e in schedule]
    prev = 0
    for s, e in steps:
        if s != prev or e <= s:
            raise ValueError(
                f"schedule must be contiguous non-empty steps from 0; got {steps} (step ({s}, {e}) after end {prev})"
            )
        prev = e
    if prev > per_layer.shape[2]:
        raise ValueError(f"schedule ends at {prev} but x_seq has {per_layer.shape[2]} tokens")
    q_max = max(e - s for s, e in steps)
    states = list(init_states(cfg, per_layer.shape[1], q_max))
    runtime = SharedRuntime()
    results = []
    for s, e in steps:
        row = []
        for layer in range(n_layers):
            res = attention_step(
                layer, cfg, weights[layer], states[layer], runtime, per_layer[layer, :, s:e], s, policy
            )
            states[layer], runtime = res.state, res.runtime
            row.append(res)
        results.append(row)
    return ModelRun(results, tuple(states), runtime)
