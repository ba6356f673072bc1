"""`attention`: the attention forward of every layer of a configuration over a prefill-and-decode
schedule, with the cross-layer shared runtime passed explicitly (M:613-789, M:1166-1180).

The arithmetic is `v41_conformance.reference.attention.attention_step` (docs/v41-reference.md §5, in the
bf16 mode of §8). This module builds the cases (the schedule and §10.1 policy axis, weights and
inputs), wraps the reference as one (step, layer) call and registers the component; the driver
and what it records are in `attention_steps.py`; docs/attention.md is the user's description.

Case params record the policy (`index_k_policy`: "upstream" bit-faithful to §10.1, or "fixed")
and whether the schedule is upstream's (prefill at 0, then one token per step) or the harness's
generalisation of §10.3 (`generalisation`, `schedule_kind`); case ids end in `-gen-<policy>` or
`-<policy>` so the report shows both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..cases import CaseSpec, seed_for
from ..errors import CaseSpecError
from ..reference.attention import LayerWeights, attention_step, init_weights, window_part_length
from ..reference.compressor import CompressorWeights
from ..reference.config import PRODUCTION_TIER, TINY_A, AttnConfig, LayerRole, layer_roles
from ..reference.fp8_linear import quantise_inputs, weight_input
from ..reference.indexer import IndexerWeights
from ..reference.runtime import POLICIES, LayerState, SharedRuntime
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from ..schedules import parse_schedule_name, schedule_name, validate_schedule
from ..chain.attention import AttentionChain
from .attention_steps import (
    BASE_WEIGHTS,
    SLOTS,
    call_weights,
    config_of,
    drive_layers,
    expected_outputs,
    intermediate_names,
    is_upstream_schedule,
)
from .build import normal
from ..stepnames import step_name

NAME = "attention"
WEIGHT_MODES = ("bf16", "fp8")  # params.weights: ModelArgs.dtype of the case (upstream's default is fp8)
FP8_WEIGHTS = ("wq_a", "wq_b", "wkv", "wo_b", "idx.wq_b")  # the Linears fp8 makes fp8 (§6.4)
ROPE_TAIL = "config.rope_head_dim"  # the RoPE'd channels of every row: judged by their pairs' norm
CONFIGS = {"tiny-a": TINY_A, "production-tier": PRODUCTION_TIER}
NINF = float("-inf")


# --- the case axis: schedules and the §10.1 policy -------------------------------------------


def _expand(spec: CaseSpec) -> list[CaseSpec]:
    """One case per `build.schedules` entry: `<name>-<schedule>[-gen]-<policy>`.

    Adds params: config (every AttnConfig field), schedule, schedule_name, schedule_kind,
    generalisation. All schedules of one `build.data` label share weights and inputs.
    """
    params, build = dict(spec.params), dict(spec.build)
    cfg_name = params.get("config", "tiny-a")
    if cfg_name not in CONFIGS:
        raise CaseSpecError(f"{spec.source}: config {cfg_name!r}; known: {sorted(CONFIGS)}")
    policy = params.get("index_k_policy")
    if policy not in POLICIES:
        raise CaseSpecError(f"{spec.source}: params.index_k_policy must be one of {POLICIES} (§10.1)")
    cfg = CONFIGS[cfg_name]
    weights_mode(params)
    build["data_seed"] = seed_for(f"{NAME}/{build.pop('data', spec.name)}")
    out = []
    for item in build.pop("schedules", None) or []:
        try:
            schedule = validate_schedule(parse_schedule_name(str(item)))
            for i in range(1, len(schedule)):
                if schedule[i][0] != schedule[i - 1][1]:
                    raise ValueError("attention steps must be contiguous (no rollback)")
        except ValueError as exc:
            raise CaseSpecError(f"{spec.source}: schedule {item!r}: {exc}") from None
        if schedule[-1][1] > cfg.max_seq_len:
            raise CaseSpecError(f"{spec.source}: schedule {item!r} ends past max_seq_len {cfg.max_seq_len}")
        upstream = is_upstream_schedule(schedule)
        name = schedule_name(schedule)
        full = {
            **params,
            "config_name": cfg_name,
            "config": dataclasses.asdict(cfg),
            "schedule": [list(s) for s in schedule],
            "schedule_name": name,
            "schedule_kind": "upstream" if upstream else "harness-generalisation (docs/attention.md, §10.3)",
            "generalisation": not upstream,
        }
        case = f"{spec.name}-{name}{'' if upstream else '-gen'}-{policy}"
        out.append(dataclasses.replace(spec, name=case, params=full, build=build))
    if not out:
        raise CaseSpecError(f"{spec.source}: attention cases need build.schedules (schedule names, e.g. p21-d1x11)")
    return out


# --- inputs ------------------------------------------------------------------------------------


def _inputs(params, build, gen):
    """Per-layer input rows and one shared weight set drawn as `init_weights` draws them."""
    cfg = config_of(params)
    b, steps = int(build.get("batch", 2)), validate_schedule(params["schedule"])
    data = torch.Generator().manual_seed(int(build["data_seed"]))
    L, T = cfg.n_total_layers, steps[-1][1]
    # drawn for max_seq_len positions, so every schedule of one data label sees the same rows
    x = normal(data, [L, b, cfg.max_seq_len, cfg.dim], float(build.get("x_scale", 1.0)))[:, :, :T].clone()
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=data))
    layers, roles = init_weights(cfg, seed), layer_roles(cfg)
    out = {"x": x, "attn_sink": torch.stack([w.attn_sink for w in layers])}  # [L, b, T, dim], [L, h]
    first = layers[0]
    out.update({name: getattr(first, name) for name in BASE_WEIGHTS})
    src = next((r.layer for r in roles if r.is_kv_source and r.ratio == 2), None)
    src = src if src is not None else next((r.layer for r in roles if r.is_kv_source), None)
    if src is not None:  # one compressor weight set for every kv source (bf16 values, exact)
        comp = layers[src].compressor
        out["comp.wkv"], out["comp.norm"] = comp.wkv.to(torch.bfloat16), comp.norm_w
        if comp.wgate is not None:
            out["comp.wgate"] = comp.wgate.to(torch.bfloat16)
    idx = next((r.layer for r in roles if r.is_index_source), None)
    if idx is not None:
        out["idx.wq_b"], out["idx.weights_proj"] = layers[idx].indexer.wq_b, layers[idx].indexer.weights_proj
    key = next((r.layer for r in roles if r.owns_k), None)
    if key is not None:
        out["wk"], out["k_norm"] = layers[key].wk, layers[key].k_norm
    if weights_mode(params) == "fp8":  # the checkpoint's fp8 Linears: e4m3 codes + e8m0 tile scales
        quantise_inputs(out, FP8_WEIGHTS)
    return out


def weights_mode(params: dict) -> str:
    mode = params.get("weights", "bf16")
    if mode not in WEIGHT_MODES:
        raise CaseSpecError(f"attention: params.weights must be one of {WEIGHT_MODES}, not {mode!r}")
    return mode


# --- the reference, one layer one step ---------------------------------------------------------


def _layer_weights(inputs: dict, role: LayerRole, cfg: AttnConfig) -> LayerWeights:
    comp = indexer = None
    if role.is_kv_source:
        wkv, gate = inputs["comp.wkv"], inputs.get("comp.wgate")
        if role.ratio == 2:  # upstream's ratio-2 Compressor Linear is fp32 (exact promotion)
            assert gate is not None  # a ratio-2 kv source's inputs carry comp.wgate (_inputs)
            wkv, gate = wkv.float(), gate.float()
        comp = CompressorWeights(wkv, inputs["comp.norm"], gate, cfg.norm_eps)
    if role.is_index_source:
        indexer = IndexerWeights(weight_input(inputs, "idx.wq_b"), inputs["idx.weights_proj"])
    # Fp8Weight only for the fp8 Linears: the norms and wo_a come with no .scale (a dict cannot say which is which)
    base: dict[str, Any] = {n: weight_input(inputs, n) for n in BASE_WEIGHTS}
    return LayerWeights(
        **base,
        attn_sink=inputs["attn_sink"],
        compressor=comp,
        indexer=indexer,
        wk=inputs.get("wk"),
        k_norm=inputs.get("k_norm"),
    )


def _run_reference(inputs, params):
    cfg = config_of(params)
    layer, start = int(params["layer"]), int(params["start"])
    role = layer_roles(cfg)[layer]
    state = LayerState(
        inputs["window"], inputs.get("compress_kv"), inputs.get("index_k"), inputs.get("comp_ring"), start
    )
    unknown = {f"{slot}_from": -1 for slot in SLOTS}  # -1: published before this call
    runtime = SharedRuntime(**{slot: inputs.get(f"rt.{slot}") for slot in SLOTS}, **unknown)
    res = attention_step(
        layer, cfg, _layer_weights(inputs, role, cfg), state, runtime, inputs["x"], start, params["index_k_policy"]
    )
    out = {
        "out": res.out,
        "window_ids": res.window_ids,
        "compressed_ids": res.compressed_ids,
        "window": res.state.window,
    }
    if role.is_candidate_source:
        b, S = res.out.shape[:2]
        out["candidates"] = res.candidates if res.candidates is not None else torch.zeros(b, S, 0, dtype=torch.bool)
    if role.is_kv_source:
        out["compress_kv"], out["comp_ring"] = res.state.compress_kv, res.state.comp_ring
    if role.owns_k:
        out["index_k"] = res.state.index_k
    for slot in SLOTS:
        if getattr(res.runtime, f"{slot}_from") == layer:
            out[f"rt.{slot}"] = getattr(res.runtime, slot)
    out.update(_intermediates(res, role))
    return out, res


def _intermediates(res, role: LayerRole) -> dict:
    """The call's values at its decision points (INTERMEDIATES), as the reference computed them."""
    d = res.dumps
    found = {
        "qr": d["qr"],
        "kv": d["window_kv_pre"],
        "latent": d.get("latent"),
        "compress_pre": d.get("compress_pre"),
        "index_k_pre": d.get("index_k_pre"),
        "index_q": d.get("index_q"),
        "index_scores": d.get("visible_scores"),
        "q": d["q"],
        "o": d["o"],
        "z": d["z"],
    }
    return {k: v for k, v in found.items() if k in intermediate_names(role) and v is not None}


def _reference(inputs, params):
    return _run_reference(inputs, params)[0]


def _reference_with_aux(inputs, params) -> tuple[dict, dict[str, torch.Tensor]]:
    """The reference outputs and what the comparator needs per step, in one pass:

    - `sNN.lK.scores` (per compressed layer): the masked index scores its compressed ids came
      from, with `offset` leading -inf columns so the ids index them directly;
    - `sNN.window_pre` [L, b, n, hd]: the window rows the step wrote, before their fp8 QDQ;
    and the generator keeps the intermediates (`INTERMEDIATES`): `sNN.lK.latent`, `compress_pre`,
    `index_k_pre` in full (the boundary verdict of compress_rows and index_k_rows reads the last
    two), the others as row digests `sNN.lK.<name>.digest` (harness/chain).
    """
    cfg = config_of(params)
    roles = layer_roles(cfg)
    scores: dict[tuple[int, int], torch.Tensor] = {}
    aux: dict[str, torch.Tensor] = {}
    window_pre: dict[int, list[torch.Tensor]] = {}

    def call(call_in, call_params):
        out, res = _run_reference(call_in, call_params)
        step, layer, start = int(call_params["step"]), int(call_params["layer"]), int(call_params["start"])
        b, S = res.out.shape[:2]
        written = [p - start for p in range(max(start, start + S - cfg.window_size), start + S)]
        window_pre.setdefault(step, []).append(res.dumps["window_kv_pre"][:, written])
        masked = res.dumps.get("masked_scores")
        if masked is not None:
            pad = window_part_length(start, S, cfg.window_size)
            front = torch.full((b, S, pad), NINF, dtype=masked.dtype)
            scores[(step, layer)] = torch.cat([front, masked], -1)
        return out

    outputs = drive_layers(call, inputs, params)  # with the reference's intermediates: build_golden keeps them
    for step, rows in window_pre.items():
        aux[step_name(step, "window_pre")] = torch.stack(rows).contiguous()
    for (i, layer), value in scores.items():
        for r in roles:  # an index source's scores also judge the layers that reuse its selection
            if r.ratio and r.index_source == layer:
                aux[step_name(i, f"l{r.layer}.scores")] = value
    return outputs, aux


def _chain(inputs, expected, aux, actual, params, judge, boundary):
    """Every output and intermediate judged along the chain (harness/chain/attention.py)."""
    cfg = config_of(params)
    weights = {r.layer: _layer_weights(call_weights(inputs, r), r, cfg) for r in layer_roles(cfg)}
    return AttentionChain(inputs["x"], weights, expected, aux, actual, params, judge).run()


# --- registration ------------------------------------------------------------------------------

OUTPUTS = (
    OutputSpec("out", "bf16", "the layer's attention output after wo_a/wo_b", "bf16", "b S dim", accumulates=True),
    OutputSpec("window_ids", "exact", "every layer's window lanes (oldest first, -1 absent)", "int32", "L b S w"),
    OutputSpec(
        "compressed_ids",
        "index",
        "selected compressed rows + offset, ascending, -1 tail; judged tie-aware against aux sNN.lK.scores",
        "int32",
        "b S k",
        order="set",
        scores="{prefix}scores",
    ),
    OutputSpec("candidates", "exact", "the candidate source's published block mask", "bool", "b S T"),
    OutputSpec(
        "window_rows",
        "quantised",
        "every layer's ring slots written this step, oldest first (fp8 QDQ; boundary flips against aux sNN.window_pre)",
        "bf16",
        "L b n hd",
        quant="fp8_ue8m0",
        pre="{prefix}window_pre",
        pre_tail=ROPE_TAIL,
    ),
    OutputSpec(
        "compress_rows",
        "quantised",
        "compressed cache rows written this step (fp4 QDQ; boundary flips against aux sNN.lK.compress_pre)",
        "bf16",
        "b G hd",
        quant="fp4_e4m3",
        pre="{prefix}compress_pre",
        pre_tail=ROPE_TAIL,
    ),
    OutputSpec(
        "index_k_rows",
        "quantised",
        "index-key rows written this step (fp4 QDQ; boundary flips against aux sNN.lK.index_k_pre)",
        "bf16",
        "b G ihd",
        quant="fp4_e8m0",
        pre="{prefix}index_k_pre",
        pre_tail=ROPE_TAIL,
    ),
    OutputSpec("ring_pending", "f32", "the ratio-2 compressor ring's live slots", "f32", "b Pn 2 hd"),
    OutputSpec(
        "published",
        "exact",
        "layer l published compress_kv, index_k, topk_idxs, candidates",
        "bool",
        "L 4",
        labels=SLOTS,
    ),
)
INTERMEDIATES = (
    OutputSpec(
        "qr",
        "bf16",
        "q_norm(wq_a(x)), the normed query latent",
        "bf16",
        "b S q_lora",
        feeds="act_quant of wq_b's input and of the indexer's wq_b (fp8 checkpoint)",
        accumulates=True,
    ),
    OutputSpec(
        "kv",
        "bf16",
        "the window KV rows after RoPE, before their fp8 QDQ",
        "bf16",
        "b S hd",
        pre_tail=ROPE_TAIL,
        feeds="the fp8 QDQ of the window rows",
        accumulates=True,
    ),
    OutputSpec(
        "latent",
        "bf16",
        "the compressor's rows written this step, before RoPE (kv_finish's input); or no farther from the exact "
        "rows than the reference's own bf16 cast before its norm takes it",
        "bf16",
        "b G hd",
        when="a kv source",
        precision=True,
        kept="aux",
        feeds="RoPE and the index key's wk (no decision: a bf16 rounding)",
    ),
    OutputSpec(
        "compress_pre",
        "bf16",
        "the compressed rows written this step after RoPE, before their fp4 QDQ",
        "bf16",
        "b G hd",
        when="a kv source",
        pre_tail=ROPE_TAIL,
        kept="aux",
        feeds="the fp4 e4m3 QDQ of the compressed rows",
    ),
    OutputSpec(
        "index_k_pre",
        "bf16",
        "the index keys written this step after RoPE, before their fp4 QDQ",
        "bf16",
        "b G D",
        when="a key-owning index source",
        pre_tail=ROPE_TAIL,
        kept="aux",
        feeds="the fp4 e8m0 QDQ of the index keys",
    ),
    OutputSpec(
        "index_q",
        "bf16",
        "the index query after RoPE, before its fp4 round trip",
        "bf16",
        "b S H D",
        when="an index source that sees compressed rows",
        pre_tail=ROPE_TAIL,
        feeds="the fp4 e8m0 round trip of the index query",
        accumulates=True,
    ),
    OutputSpec(
        "index_scores",
        "bf16",
        "the index scores of the rows each query sees (-inf where it cannot), before candidate masking",
        "bf16",
        "b S T",
        when="an index source that sees compressed rows",
        feeds="the top-k and the candidate blocks",
        terms="{prefix}index_scores_terms",
        precision=True,
    ),
    OutputSpec(
        "q",
        "bf16",
        "sparse attention's query: wq_b of qr, after RoPE",
        "bf16",
        "b S h hd",
        pre_tail=ROPE_TAIL,
        feeds="sparse attention's logits (no decision: judged as index_q is)",
        accumulates=True,
    ),
    OutputSpec(
        "o",
        "bf16",
        "sparse attention's output after the inverse RoPE (wo_a's input)",
        "bf16",
        "b S h hd",
        pre_tail=ROPE_TAIL,
        feeds="wo_a (no decision: judged by sparse_attn's tolerance)",
    ),
    OutputSpec(
        "z",
        "bf16",
        "the grouped wo_a output (wo_b's input)",
        "bf16",
        "b S g*o_lora",
        feeds="act_quant of wo_b's input (fp8 checkpoint)",
    ),
)
INTERMEDIATE_NAMES = tuple(o.name for o in INTERMEDIATES)
WEIGHT = "bf16|uint8"  # bf16, or float8_e4m3fn codes with weights: fp8
INPUTS = (
    T("x", "bf16", "L b Tn dim", "each layer's input rows for every position (a call gets x[layer, :, start:end])"),
    T("attn_sink", "f32", "L h", "each layer's sink logits"),
    T("wq_a", WEIGHT, "q_lora dim"),
    T("wq_a.scale", "uint8", "q_lora/32 dim/32", when="weights: fp8"),
    T("q_norm", "bf16", "q_lora"),
    T("wq_b", WEIGHT, "h*hd q_lora"),
    T("wq_b.scale", "uint8", "h*hd/32 q_lora/32", when="weights: fp8"),
    T("wkv", WEIGHT, "hd dim"),
    T("wkv.scale", "uint8", "hd/32 dim/32", when="weights: fp8"),
    T("kv_norm", "bf16", "hd"),
    T("wo_a", "bf16", "g*o_lora h*hd/g"),
    T("wo_b", WEIGHT, "dim g*o_lora"),
    T("wo_b.scale", "uint8", "dim/32 g*o_lora/32", when="weights: fp8"),
    T("comp.wkv", "bf16", "hd dim", "kv sources' compressor", when="a kv source"),
    T("comp.wgate", "bf16", "hd dim", when="a ratio-2 kv source"),
    T("comp.norm", "bf16", "hd", when="a kv source"),
    T("idx.wq_b", WEIGHT, "H*D q_lora", when="an index source"),
    T("idx.wq_b.scale", "uint8", "H*D/32 q_lora/32", when="an index source, weights: fp8"),
    T("idx.weights_proj", "bf16", "H dim", when="an index source"),
    T("wk", "bf16", "D hd", when="a key-owning index source"),
    T("k_norm", "bf16", "D", when="a key-owning index source"),
)
RETURNS = (
    T("out", "bf16", "b S dim"),
    T("window_ids", "int32", "b S w"),
    T("compressed_ids", "int32", "b S k"),
    T("candidates", "bool", "b S T", when="the candidate source"),
    T("window", "bf16", "b win hd", "the layer's window ring after the step"),
    T("compress_kv", "bf16", "b max_seq/r hd", "the compressed cache", when="a kv source"),
    T("comp_ring", "f32", "b Sr 2 hd", "the compressor ring", when="a kv source"),
    T("index_k", "bf16", "b max_seq/r D", "the index-key cache", when="a key-owning index source"),
    T(
        "rt.<slot>",
        "as the slot",
        "",
        "each shared slot the layer published this step (compress_kv, index_k, topk_idxs, candidates)",
        when="it published",
    ),
)
PARAMS = (
    P("config", "mapping", "every AttnConfig field (docs/attention.md)"),
    P("config_name", "str", "the named config", required=False, default="tiny-a"),
    P("index_k_policy", "str", "§10.1: upstream (bit-faithful stale read) or fixed", choices=("upstream", "fixed")),
    P(
        "weights",
        "str",
        "the checkpoint dtype of the fp8-able Linears",
        required=False,
        choices=WEIGHT_MODES,
        default="bf16",
    ),
    P("schedule", "int_pairs", "the steps [start, end)"),
    P(
        "schedule_name",
        "str",
        "the schedule's name",
        required=False,
        derive=lambda p: schedule_name([tuple(s) for s in p["schedule"]]),
        default_doc="the name of `schedule`",
    ),
    P(
        "schedule_kind",
        "str",
        "upstream or the harness's generalisation",
        required=False,
        derive=lambda p: "harness-generalisation (docs/attention.md, §10.3)" if p.get("generalisation") else "upstream",
        default_doc="from `generalisation`",
    ),
    P(
        "generalisation",
        "bool",
        "the schedule goes beyond upstream's prefill-then-single-token decode",
        required=False,
        default=False,
    ),
    P("step", "int", "this call's step", driver=True),
    P("start", "int", "this step's first position", "positions", driver=True),
    P("end", "int", "one past this step's last position", "positions", driver=True),
    P("layer", "int", "this call's layer", driver=True),
    P("role", "mapping", "the layer's role (LayerRole fields: ratio, mode, sources)", driver=True),
)
DIMS = {
    "L": "layers",
    "b": "batch",
    "Tn": "positions of the whole schedule",
    "S": "tokens of the step",
    "dim": "hidden size",
    "h": "heads",
    "hd": "head_dim",
    "q_lora": "q_lora_rank",
    "g": "o_groups",
    "o_lora": "o_lora_rank",
    "H": "index heads",
    "D": "index_head_dim",
    "w": "window lanes per query",
    "k": "compressed lanes per query",
    "T": "compressed rows visible at the step's end",
    "n": "ring slots written",
    "G": "compressed rows written",
    "Pn": "pending positions",
    "2": "(score, latent)",
    "4": "the shared slots",
    "win": "window_size",
    "Sr": "ring slots",
    "max_seq/r": "max_seq_len // ratio",
    "/32": "32-wide tiles",
}


register(
    Component(
        name=NAME,
        summary="attention of every layer over prefill + decode, shared runtime explicit; per step and layer",
        upstream="M:613-789 (Attention), M:1166-1180 (shared_attn); §10.1 policy; chunks: harness §10.3",
        inputs=INPUTS,
        outputs=OUTPUTS,
        returns=RETURNS,
        params=PARAMS,
        dims=DIMS,
        steps="one call per (step, layer), layers in order: x [b, S, dim] is the layer's chunk, the weights its role "
        "uses under the names above, its state (window; compress_kv, comp_ring; index_k) as it returned them and "
        "the shared slots published so far as rt.<slot>; recorded per step as sNN.lK.<output> (per layer) and "
        "sNN.<output> (stacked over layers)",
        build=_inputs,
        reference=_reference,
        execute=drive_layers,
        reference_with_aux=_reference_with_aux,
        expected_outputs=expected_outputs,
        intermediates=INTERMEDIATES,
        chain=_chain,
        chain_reuses=True,
        derived_specs=(
            OutputSpec(
                "candidate_blocks",
                "index",
                "the kept block ids of a candidates mask that differs from "
                "the reference's selection (ascending, then -1), judged as candidates.select judges its "
                "blocks: against the ranked block scores",
                "int64",
                "b S nb",
                order="set",
                scores="{prefix}candidate_ranked",
            ),
        ),
        floor=4,
        notes="one implementation call per (step, layer), layers in order: inputs x [b, S, dim], the layer's weights "
        "(wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink; comp.* / idx.* / wk, k_norm by role), its "
        "state (window; compress_kv, comp_ring; index_k) and the shared slots published so far (rt.*); params "
        "config, role, layer, step, start, end, index_k_policy. Returns out, window_ids, compressed_ids, "
        "candidates (candidate source), the new state and the rt.* slots it published. docs/attention.md.",
        extra={"expand": _expand},
    )
)
