"""`attention`: the attention forward of every layer of a configuration over a prefill-and-decode
schedule, with the cross-layer shared runtime passed explicitly (M:613-789, M:1166-1180).

The arithmetic is `harness.reference.attention.attention_step` (docs/v41-reference.md §5). This
module says how a case is built, how the harness drives an implementation and what it compares;
docs/attention.md is the user-facing description.

Driving: one implementation call per (step, layer), layers in order inside a step. A call gets
the layer's input chunk, its weights, its own state (window ring; compressed cache, compressor
ring and index keys for sources) and the shared slots published so far (`rt.*`); it returns the
layer's output, the window and compressed ids it attended, its new state and the slots it
published. The harness carries the state and the slots the implementation returned (never the
reference's), so the runtime really is explicit and every step really is chunked.

Recorded per step and layer, as `sNN.lK.<name>`: out (bf16), window_ids (exact), compressed_ids
(index: tie-aware against the reference's masked index scores), candidates (candidate source,
exact), the cache rows the step wrote (window_rows, compress_rows, index_k_rows: exact, they are
fp8/fp4 fake-quantised), the compressor ring's live slots (ring_pending, f32) and which slots the
layer published (published, exact: the §10.1 index_k policy is visible there).

Golden inputs share one set of base weights across layers (the implementation only ever sees one
layer's weights per call), while every layer gets its own input rows `x[layer]`, so layers'
caches differ and a read of the wrong layer's slot shows.
"""

from __future__ import annotations

import dataclasses

import torch

from ..cases import CaseSpec, seed_for
from ..errors import CaseSpecError
from ..reference.attention import LayerWeights, attention_step, init_weights
from ..reference.compressor import CompressorWeights, completed_groups, pending_state
from ..reference.config import TINY_A, AttnConfig, LayerRole, layer_roles
from ..reference.indexer import IndexerWeights
from ..reference.runtime import POLICIES, LayerState, SharedRuntime, init_layer_state
from ..registry import Component, OutputSpec, register
from ..runner import StepError
from ..schedules import max_step, parse_schedule_name, schedule_name, validate_schedule
from .build import normal
from .steps import step_name

NAME = "attention"
CONFIGS = {"tiny-a": TINY_A}
SLOTS = ("compress_kv", "index_k", "topk_idxs", "candidates")
BASE_WEIGHTS = ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "wo_a", "wo_b")
NINF = float("-inf")


# --- configuration, roles and the case axis --------------------------------------------------


def config_of(params: dict) -> AttnConfig:
    """The AttnConfig a golden records in params.config (lists back to tuples)."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in params["config"].items()}
    return AttnConfig(**fields)


def role_dict(role: LayerRole) -> dict:
    return dataclasses.asdict(role)


def is_upstream_schedule(schedule: list[tuple[int, int]]) -> bool:
    """Upstream defines one prefill chunk at 0, then single-token decode steps (§3.5)."""
    return all(end - start == 1 for start, end in schedule[1:])


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
        full = {**params, "config_name": cfg_name, "config": dataclasses.asdict(cfg),
                "schedule": [list(s) for s in schedule], "schedule_name": name,
                "schedule_kind": "upstream" if upstream else "harness-generalisation (docs/attention.md, §10.3)",
                "generalisation": not upstream}
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
    x = normal(data, [L, b, T, cfg.dim], float(build.get("x_scale", 1.0)))
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=data))
    layers, roles = init_weights(cfg, seed), layer_roles(cfg)
    out = {"x": x, "attn_sink": torch.stack([w.attn_sink for w in layers])}    # [L, b, T, dim], [L, h]
    first = layers[0]
    out.update({name: getattr(first, name) for name in BASE_WEIGHTS})
    for ratio in (1, 2):
        src = next((r.layer for r in roles if r.is_kv_source and r.ratio == ratio), None)
        if src is not None:
            comp = layers[src].compressor
            out[f"comp{ratio}.wkv"], out[f"comp{ratio}.norm"] = comp.wkv.to(torch.bfloat16), comp.norm_w
            if ratio == 2:
                out["comp2.wgate"] = comp.wgate.to(torch.bfloat16)   # bf16 values, exact
    idx = next((r.layer for r in roles if r.is_index_source), None)
    if idx is not None:
        out["idx.wq_b"], out["idx.weights_proj"] = layers[idx].indexer.wq_b, layers[idx].indexer.weights_proj
    key = next((r.layer for r in roles if r.owns_k), None)
    if key is not None:
        out["wk"], out["k_norm"] = layers[key].wk, layers[key].k_norm
    return out


def _call_weights(inputs: dict, role: LayerRole) -> dict:
    """The weights one layer's call receives, under their plain names."""
    out = {name: inputs[name] for name in BASE_WEIGHTS}
    out["attn_sink"] = inputs["attn_sink"][role.layer]
    if role.is_kv_source:
        r = role.ratio
        out["comp.wkv"], out["comp.norm"] = inputs[f"comp{r}.wkv"], inputs[f"comp{r}.norm"]
        if r == 2:
            out["comp.wgate"] = inputs["comp2.wgate"]
    if role.is_index_source:
        out["idx.wq_b"], out["idx.weights_proj"] = inputs["idx.wq_b"], inputs["idx.weights_proj"]
    if role.owns_k:
        out["wk"], out["k_norm"] = inputs["wk"], inputs["k_norm"]
    return out


def state_names(role: LayerRole) -> tuple[str, ...]:
    names = ["window"]
    if role.is_kv_source:
        names += ["compress_kv", "comp_ring"]
    if role.owns_k:
        names.append("index_k")
    return tuple(names)


def publishable(role: LayerRole) -> tuple[str, ...]:
    """Slots this role may publish (M:1166-1180)."""
    allowed = []
    if role.is_kv_source:
        allowed.append("compress_kv")
    if role.owns_k:
        allowed.append("index_k")
    if role.is_index_source:
        allowed.append("topk_idxs")
    if role.is_candidate_source:
        allowed.append("candidates")
    return tuple(allowed)


def returned_names(role: LayerRole) -> tuple[str, ...]:
    """What one call must return (the `rt.*` slots it published come on top)."""
    extra = ("candidates",) if role.is_candidate_source else ()
    return ("out", "window_ids", "compressed_ids", *extra, *state_names(role))


def recorded_names(role: LayerRole) -> tuple[str, ...]:
    """What the harness records and compares per step for this layer."""
    names = ["out", "window_ids", "compressed_ids", "window_rows", "published"]
    if role.is_candidate_source:
        names.append("candidates")
    if role.is_kv_source:
        names.append("compress_rows")
        if role.ratio == 2:
            names.append("ring_pending")
    if role.owns_k:
        names.append("index_k_rows")
    return tuple(names)


# --- the reference, one layer one step ---------------------------------------------------------


def _layer_weights(inputs: dict, role: LayerRole, cfg: AttnConfig) -> LayerWeights:
    comp = indexer = None
    if role.is_kv_source:
        wkv, gate = inputs["comp.wkv"], inputs.get("comp.wgate")
        if role.ratio == 2:  # upstream's ratio-2 Compressor Linear is fp32 (exact promotion)
            wkv, gate = wkv.float(), gate.float()
        comp = CompressorWeights(wkv, inputs["comp.norm"], gate, cfg.norm_eps)
    if role.is_index_source:
        indexer = IndexerWeights(inputs["idx.wq_b"], inputs["idx.weights_proj"])
    return LayerWeights(**{n: inputs[n] for n in (*BASE_WEIGHTS, "attn_sink")}, compressor=comp,
                        indexer=indexer, wk=inputs.get("wk"), k_norm=inputs.get("k_norm"))


def _run_reference(inputs, params):
    cfg = config_of(params)
    layer, start = int(params["layer"]), int(params["start"])
    role = layer_roles(cfg)[layer]
    state = LayerState(inputs["window"], inputs.get("compress_kv"), inputs.get("index_k"),
                       inputs.get("comp_ring"), start)
    unknown = {f"{slot}_from": -1 for slot in SLOTS}   # -1: published before this call
    runtime = SharedRuntime(**{slot: inputs.get(f"rt.{slot}") for slot in SLOTS}, **unknown)
    res = attention_step(layer, cfg, _layer_weights(inputs, role, cfg), state, runtime, inputs["x"],
                         start, params["index_k_policy"])
    out = {"out": res.out, "window_ids": res.window_ids, "compressed_ids": res.compressed_ids,
           "window": res.state.window}
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
    return out, res


def _reference(inputs, params):
    return _run_reference(inputs, params)[0]


# --- the driver --------------------------------------------------------------------------------


def window_part_length(start: int, S: int, win: int) -> int:
    """Rows of the window part, i.e. the compressed ids' offset: S at prefill, win at decode, win+S
    for a harness-defined chunk (reference/attention.py)."""
    if start == 0:
        return S
    return win if S == 1 else win + S


def _record(role: LayerRole, cfg: AttnConfig, start: int, end: int, given: dict, result: dict) -> dict:
    """The tensors compared for one layer and step (module docstring)."""
    for name in state_names(role):
        want, got = given[name], result[name]
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            raise ValueError(f"returned state {name!r} as {got.dtype} {list(got.shape)}; it must keep the layout it "
                             f"was given, {want.dtype} {list(want.shape)} (docs/attention.md)")
    win = cfg.window_size
    slots = [p % win for p in range(max(start, end - win), end)]   # ring slots written, oldest first
    rec = {"out": result["out"], "window_ids": result["window_ids"], "compressed_ids": result["compressed_ids"],
           "window_rows": result["window"][:, slots],
           "published": torch.tensor([f"rt.{slot}" in result for slot in SLOTS])}
    if role.is_candidate_source:
        rec["candidates"] = result["candidates"]
    rows = list(completed_groups(start, end, role.ratio)) if role.ratio else []
    if role.is_kv_source:
        rec["compress_rows"] = result["compress_kv"][:, rows]
        if role.ratio == 2:
            rec["ring_pending"] = pending_state(result["comp_ring"], end, role.ratio)
    if role.owns_k:
        rec["index_k_rows"] = result["index_k"][:, rows]
    return {k: v.detach().cpu().contiguous() for k, v in rec.items()}


def initial_state(cfg: AttnConfig, layer: int, batch: int, q_max: int) -> dict:
    """Zero caches and a fresh compressor ring (scores -inf), as `runtime.init_layer_state`."""
    st = init_layer_state(cfg, layer, batch, q_max)
    out = {"window": st.window, "compress_kv": st.compress_kv, "comp_ring": st.comp_ring, "index_k": st.index_k}
    return {k: v for k, v in out.items() if v is not None}


def drive_layers(call, inputs: dict, params: dict, observe=None) -> dict:
    """Every step of params.schedule, every layer in order, one `call` each (module docstring).

    observe: optional callback (step, layer, call inputs, call params) -> None, for aux.
    """
    cfg = config_of(params)
    roles = layer_roles(cfg)
    schedule = validate_schedule(params["schedule"])
    b = int(inputs["x"].shape[1])
    states = {r.layer: initial_state(cfg, r.layer, b, max_step(schedule)) for r in roles}
    runtime: dict[str, torch.Tensor] = {}
    recorded: dict[str, torch.Tensor] = {}
    for i, (start, end) in enumerate(schedule):
        for role in roles:
            layer = role.layer
            where = f"layer {layer} ({role.mode}, ratio {role.ratio}), [{start}, {end})"
            given = {k: v.clone() for k, v in states[layer].items()}
            call_in = {"x": inputs["x"][layer, :, start:end], **_call_weights(inputs, role), **given,
                       **{f"rt.{k}": v.clone() for k, v in runtime.items()}}
            call_params = {**params, "step": i, "start": start, "end": end, "layer": layer, "role": role_dict(role)}
            if observe is not None:
                observe(i, layer, call_in, call_params)
            try:
                result = call(call_in, call_params)
            except Exception as exc:
                raise StepError(i, f"{where} raised {type(exc).__name__}: {exc}") from exc
            _check_result(i, where, role, result)
            try:
                rec = _record(role, cfg, start, end, given, result)
            except (ValueError, IndexError, RuntimeError) as exc:
                raise StepError(i, f"{where}: {exc}") from exc
            recorded.update({step_name(i, f"l{layer}.{k}"): v for k, v in rec.items()})
            states[layer] = {k: result[k] for k in state_names(role)}
            runtime.update({slot: result[f"rt.{slot}"] for slot in SLOTS if f"rt.{slot}" in result})
    return recorded


def _check_result(step: int, where: str, role: LayerRole, result) -> None:
    if not isinstance(result, dict):
        raise StepError(step, f"{where} returned {type(result).__name__}, expected a dict of tensors")
    required = returned_names(role)
    allowed = set(required) | {f"rt.{s}" for s in publishable(role)}
    missing = [n for n in required if n not in result]
    extra = sorted(n for n in result if n not in allowed)
    if missing or extra:
        may = ", ".join(f"rt.{s}" for s in publishable(role)) or "no shared slot"
        raise StepError(step, f"{where} returned {sorted(result)}; a {role.mode} layer returns {sorted(required)} "
                              f"and may publish {may}" + (f"; unexpected {extra}" if extra else ""))
    for name, value in result.items():
        if not isinstance(value, torch.Tensor):
            raise StepError(step, f"{where}: output {name!r} is a {type(value).__name__}, not a tensor")


def expected_outputs(params: dict) -> tuple[str, ...]:
    roles = layer_roles(config_of(params))
    return tuple(step_name(i, f"l{r.layer}.{n}") for i in range(len(params["schedule"]))
                 for r in roles for n in recorded_names(r))


def _aux(inputs, params, outputs):
    """Per step and compressed layer: the masked index scores its compressed ids came from, with
    `offset` leading -inf columns so the ids index them directly (`sNN.lK.scores`)."""
    cfg = config_of(params)
    roles = layer_roles(cfg)
    scores: dict[tuple[int, int], torch.Tensor] = {}

    def call(call_in, call_params):
        out, res = _run_reference(call_in, call_params)
        masked = res.dumps.get("masked_scores")
        if masked is not None:
            b, S, _ = masked.shape
            pad = window_part_length(int(call_params["start"]), S, cfg.window_size)
            front = torch.full((b, S, pad), NINF, dtype=masked.dtype)
            scores[(int(call_params["step"]), int(call_params["layer"]))] = torch.cat([front, masked], -1)
        return out

    drive_layers(call, inputs, params)
    aux = {}
    for (i, layer), value in scores.items():
        for r in roles:   # an index source's scores also judge the layers that reuse its selection
            if r.ratio and r.index_source == layer:
                aux[step_name(i, f"l{r.layer}.scores")] = value
    return aux


# --- registration ------------------------------------------------------------------------------

OUTPUTS = (
    OutputSpec("out", "bf16", "bf16 [b, S, dim]: the layer's attention output after wo_a/wo_b"),
    OutputSpec("window_ids", "exact", "int32 [b, S, w]: window lanes (oldest first, -1 absent)"),
    OutputSpec("compressed_ids", "index", "int32 [b, S, k]: selected compressed rows + offset, ascending, "
               "-1 tail; judged tie-aware against aux sNN.lK.scores", order="set"),
    OutputSpec("candidates", "exact", "bool [b, S, T]: the candidate source's published block mask"),
    OutputSpec("window_rows", "exact", "bf16 [b, n, hd]: ring slots written this step, oldest first (fp8 QDQ)"),
    OutputSpec("compress_rows", "exact", "bf16 [b, G, hd]: compressed cache rows written this step (fp4 QDQ)"),
    OutputSpec("index_k_rows", "exact", "bf16 [b, G, ihd]: index-key rows written this step (fp4 QDQ)"),
    OutputSpec("ring_pending", "f32", "fp32 [b, P, 2, hd]: the ratio-2 compressor ring's live slots"),
    OutputSpec("published", "exact", "bool [4]: this call published compress_kv, index_k, topk_idxs, candidates"),
)


@dataclasses.dataclass(frozen=True)
class _LayeredComponent(Component):
    """Resolves `sNN.lK.<name>` to the spec of `<name>`; compressed ids get that step's scores."""

    def output_spec(self, name: str) -> OutputSpec:
        parts = name.split(".")
        base = parts[-1]
        spec = next((s for s in self.outputs if s.name == base), None)
        if spec is None:
            raise KeyError(f"component {self.name} has no output {name!r}")
        if base == "compressed_ids" and len(parts) == 3:
            return dataclasses.replace(spec, scores=f"{parts[0]}.{parts[1]}.scores")
        return spec


register(_LayeredComponent(
    name=NAME,
    summary="attention of every layer over prefill + decode, shared runtime explicit; per step and layer",
    upstream="M:613-789 (Attention), M:1166-1180 (shared_attn); §10.1 policy; chunks: harness §10.3",
    inputs=("x", "attn_sink", *BASE_WEIGHTS),
    outputs=OUTPUTS,
    build=_inputs,
    reference=_reference,
    execute=drive_layers,
    aux=_aux,
    expected_outputs=expected_outputs,
    floor=4,
    notes="one implementation call per (step, layer), layers in order: inputs x [b, S, dim], the layer's weights "
          "(wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink; comp.* / idx.* / wk, k_norm by role), its "
          "state (window; compress_kv, comp_ring; index_k) and the shared slots published so far (rt.*); params "
          "config, role, layer, step, start, end, index_k_policy. Returns out, window_ids, compressed_ids, "
          "candidates (candidate source), the new state and the rt.* slots it published. docs/attention.md.",
    extra={"expand": _expand},
))
