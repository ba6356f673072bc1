"""Driving `attention` through a schedule: one implementation call per (step, layer).

Layers run in order inside a step. A call receives the layer's input chunk, its weights under
plain names, its own state and the shared slots published so far (`rt.*`); it returns the layer's
output, the ids it attended, its new state and the slots it published (docs/attention.md). The
driver carries the state and the slots the implementation returned (never the reference's), so
the runtime is explicit and every step really is chunked, and records per step:

- per layer `sNN.lK.<name>`: out; compressed_ids (ratio > 0); candidates (candidate source);
  compress_rows / index_k_rows (the cache rows the step wrote); ring_pending (ratio-2 ring);
- stacked over layers `sNN.<name>`: window_ids [L, b, S, w], window_rows [L, b, n, hd] (the ring
  slots the step wrote) and published [L, 4] (which slots each layer published: §10.1 shows here).

Golden inputs hold per-layer input rows `x` [L, b, T, dim] and one weight set shared by the
layers (`comp.*`, `idx.*`, `wk`, `k_norm` for the roles that have them; `attn_sink` [L, h]).
"""

from __future__ import annotations


import torch

from ..adapters.base import Unsupported
from ..reference.compressor import completed_groups, pending_state
from ..reference.config import AttnConfig, LayerRole, layer_roles
from ..reference.runtime import SLOTS, init_layer_state
from ..runner import StepError, names_error
from ..schedules import max_step, validate_schedule
from ..stepnames import step_name

BASE_WEIGHTS = ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "wo_a", "wo_b")
STACKED = ("window_ids", "window_rows", "published")  # recorded once per step, stacked over layers


def config_of(params: dict) -> AttnConfig:
    """The AttnConfig a golden records in params.config."""
    return AttnConfig.from_dict(params["config"])


def role_dict(role: LayerRole) -> dict:
    return dict(vars(role))  # its fields are plain values: a shallow copy is a fresh dict per call


def is_upstream_schedule(schedule: list[tuple[int, int]]) -> bool:
    """Upstream defines one prefill chunk at 0, then single-token decode steps (§3.5)."""
    return all(end - start == 1 for start, end in schedule[1:])


def call_weights(inputs: dict, role: LayerRole) -> dict:
    """The weights one layer's call receives, under their plain names; an fp8 Linear's tile scales
    come with it as `<name>.scale` (uint8 e8m0 [ceil(N/32), K/32]; its weight is uint8 e4m3 codes)."""
    out = {name: inputs[name] for name in BASE_WEIGHTS}
    out["attn_sink"] = inputs["attn_sink"][role.layer]
    if role.is_kv_source:
        out["comp.wkv"], out["comp.norm"] = inputs["comp.wkv"], inputs["comp.norm"]
        if role.ratio == 2:
            out["comp.wgate"] = inputs["comp.wgate"]
    if role.is_index_source:
        out["idx.wq_b"], out["idx.weights_proj"] = inputs["idx.wq_b"], inputs["idx.weights_proj"]
    if role.owns_k:
        out["wk"], out["k_norm"] = inputs["wk"], inputs["k_norm"]
    out.update({f"{name}.scale": inputs[f"{name}.scale"] for name in list(out) if f"{name}.scale" in inputs})
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


def intermediate_names(role: LayerRole) -> tuple[str, ...]:
    """What one call may also return: its values at the decision points (docs/verdicts.md, "The
    chain"); each returned one is recorded per step and layer and judged, and what follows it is
    judged given it."""
    names = ["qr", "kv"]
    if role.is_kv_source:
        names += ["latent", "compress_pre"]
    if role.owns_k:
        names.append("index_k_pre")
    if role.is_index_source:
        names += ["index_q", "index_scores"]
    return (*names, "q", "o", "z")


def recorded_names(role: LayerRole) -> tuple[str, ...]:
    """What the harness records and compares per step for this layer (besides STACKED)."""
    names = ["out"]
    if role.ratio:
        names.append("compressed_ids")
    if role.is_candidate_source:
        names.append("candidates")
    if role.is_kv_source:
        names.append("compress_rows")
        if role.ratio == 2:
            names.append("ring_pending")
    if role.owns_k:
        names.append("index_k_rows")
    return tuple(names)


def _record(role: LayerRole, cfg: AttnConfig, start: int, end: int, result: dict) -> tuple[dict, dict]:
    """(per-layer tensors, this layer's share of the STACKED tensors) compared for one step."""
    win = cfg.window_size
    slots = [p % win for p in range(max(start, end - win), end)]  # ring slots written, oldest first
    shared = {
        "window_ids": result["window_ids"],
        "window_rows": result["window"][:, slots],
        "published": torch.tensor([f"rt.{slot}" in result for slot in SLOTS]),
    }
    rec = {"out": result["out"]}
    if role.ratio:
        rec["compressed_ids"] = result["compressed_ids"]
    if role.is_candidate_source:
        rec["candidates"] = result["candidates"]
    rows = list(completed_groups(start, end, role.ratio)) if role.ratio else []
    if role.is_kv_source:
        rec["compress_rows"] = result["compress_kv"][:, rows]
        if role.ratio == 2:
            rec["ring_pending"] = pending_state(result["comp_ring"], end, role.ratio)
    if role.owns_k:
        rec["index_k_rows"] = result["index_k"][:, rows]
    rec.update({name: result[name] for name in intermediate_names(role) if name in result})
    return {k: _plain(v) for k, v in rec.items()}, {k: _plain(v) for k, v in shared.items()}


def _plain(t: torch.Tensor) -> torch.Tensor:
    """The tensor as recorded: detached, on the CPU, contiguous (itself when it is all three already:
    a step records dozens)."""
    if t.is_cpu and not t.requires_grad and t.is_contiguous():
        return t
    return t.detach().cpu().contiguous()


def _stack(step: int, name: str, per_layer: list[torch.Tensor]) -> torch.Tensor:
    """[L, ...] from every layer's tensor; a layer whose shape or dtype differs is named."""
    first = per_layer[0]
    for layer, t in enumerate(per_layer):
        if t.dtype != first.dtype or t.shape != first.shape:
            raise StepError(
                step,
                f"layer {layer} returned {name} as {t.dtype} {list(t.shape)} but layer 0 as "
                f"{first.dtype} {list(first.shape)}; every layer's must agree",
                _layout_error(t, first),
            )
    return torch.stack(per_layer)


def initial_state(cfg: AttnConfig, layer: int, batch: int, q_max: int) -> dict:
    """Zero caches and a fresh compressor ring (scores -inf), as `runtime.init_layer_state`."""
    st = init_layer_state(cfg, layer, batch, q_max)
    out = {"window": st.window, "compress_kv": st.compress_kv, "comp_ring": st.comp_ring, "index_k": st.index_k}
    return {k: v for k, v in out.items() if v is not None}


def drive_layers(call, inputs: dict, params: dict) -> dict:
    """Every step of params.schedule, every layer in order, one `call` each (module docstring)."""
    cfg = config_of(params)
    roles = layer_roles(cfg)
    schedule = validate_schedule(params["schedule"])
    b = int(inputs["x"].shape[1])
    states = {r.layer: initial_state(cfg, r.layer, b, max_step(schedule)) for r in roles}
    weights = {r.layer: call_weights(inputs, r) for r in roles}  # the same every step
    protocol = {r.layer: _protocol(r) for r in roles}
    runtime: dict[str, torch.Tensor] = {}
    recorded: dict[str, torch.Tensor] = {}
    for i, (start, end) in enumerate(schedule):
        shared: dict[str, list[torch.Tensor]] = {name: [] for name in STACKED}
        for role in roles:
            layer = role.layer
            where = f"layer {layer} ({role.mode}, ratio {role.ratio}), [{start}, {end})"
            given = {k: v.clone() for k, v in states[layer].items()}
            call_in = {
                "x": inputs["x"][layer, :, start:end].contiguous(),
                **weights[layer],
                **given,
                **{f"rt.{k}": v.clone() for k, v in runtime.items()},
            }
            call_params = {**params, "step": i, "start": start, "end": end, "layer": layer, "role": role_dict(role)}
            try:
                result = call(call_in, call_params)
            except Unsupported:
                raise
            except Exception as exc:
                raise StepError(i, f"{where} raised {type(exc).__name__}: {exc}") from exc
            _check_result(i, where, role, result, protocol[layer])
            _check_state(i, where, role, given, result)
            try:
                rec, mine = _record(role, cfg, start, end, result)
            except (ValueError, IndexError, RuntimeError) as exc:
                raise StepError(i, f"{where}: {exc}") from exc
            recorded.update({step_name(i, f"l{layer}.{k}"): v for k, v in rec.items()})
            for name, value in mine.items():
                shared[name].append(value)
            states[layer] = {k: result[k] for k in state_names(role)}
            runtime.update({slot: result[f"rt.{slot}"] for slot in SLOTS if f"rt.{slot}" in result})
        recorded.update({step_name(i, name): _stack(i, name, values) for name, values in shared.items()})
    return recorded


def _protocol(role: LayerRole) -> tuple[tuple[str, ...], frozenset[str]]:
    """(what a call of this role must return, everything it may return)."""
    required = returned_names(role)
    return required, frozenset(required) | {f"rt.{s}" for s in publishable(role)} | set(intermediate_names(role))


def _check_result(step: int, where: str, role: LayerRole, result, protocol: tuple) -> None:
    """`protocol`: `_protocol(role)`, computed once per layer."""
    if not isinstance(result, dict):
        raise StepError(step, f"{where} returned {type(result).__name__}, expected a dict of tensors", "type error")
    required, allowed = protocol
    missing = [n for n in required if n not in result]
    extra = sorted(n for n in result if n not in allowed)
    if missing or extra:
        may = ", ".join(f"rt.{s}" for s in publishable(role)) or "no shared slot"
        raise StepError(
            step,
            f"{where} returned {sorted(result)}; a {role.mode} layer returns {sorted(required)}, "
            f"may publish {may} and may return the intermediates "
            f"{', '.join(intermediate_names(role))}" + (f"; unexpected {extra}" if extra else ""),
            names_error(missing),
        )
    for name, value in result.items():
        if not isinstance(value, torch.Tensor):
            raise StepError(step, f"{where}: output {name!r} is a {type(value).__name__}, not a tensor", "type error")


def _check_state(step: int, where: str, role: LayerRole, given: dict, result: dict) -> None:
    """Every state the call returns keeps the layout it was given (a dtype or shape error otherwise)."""
    for name in state_names(role):
        want, got = given[name], result[name]
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            raise StepError(
                step,
                f"{where}: returned state {name!r} as {got.dtype} {list(got.shape)}; it must keep "
                f"the layout it was given, {want.dtype} {list(want.shape)} (docs/attention.md)",
                _layout_error(got, want),
            )


def _layout_error(got: torch.Tensor, want: torch.Tensor) -> str:
    return "dtype error" if got.dtype != want.dtype else "shape error"


def expected_outputs(params: dict) -> tuple[str, ...]:
    roles = layer_roles(config_of(params))
    names = []
    for i in range(len(params["schedule"])):
        names += [step_name(i, n) for n in STACKED]
        names += [step_name(i, f"l{r.layer}.{n}") for r in roles for n in recorded_names(r)]
    return tuple(names)
