"""Compressor components: the chunked Compressor with its state ring, the ring's capacity rule
and the output-row metadata of a step.

Upstream: `Compressor` (M:429-485, docs/v41-reference.md §3.1-3.3); chunked prefill and
multi-token decode are the harness's generalisation (§3.5, §10.3, seed 000 §A.1-A.2), written
down in docs/schedules.md. The arithmetic is `harness/reference/compressor.py`; this module only
says how a case is built, how the runner drives an implementation through it and what is compared.

- `compressor`: one implementation call per schedule step. The step gets its chunk of inputs,
  the weights and the ring it returned at the previous step; it returns the rows it completed,
  their positions and the new ring. After every step the harness compares the rows (bf16), the
  row positions (exact) and the ring's live slots (f32) and names the first divergent step.
- `compressor.ring`: does an implementation accept a ring of S slots for steps of q_max positions?
  S >= r + q_max - 1 is required; a smaller ring must be refused.
- `compressor.metadata`: the output rows one request reserves per step (prefill max(1, n_c) rows
  with a zero placeholder, decode one row per query position) and the step's rows laid out in them.
"""

from __future__ import annotations

import dataclasses

import torch

from ..cases import CaseSpec, seed_for
from ..errors import CaseSpecError
from ..reference import compressor as cp
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from ..accumulation import BF16_GEMM_ALLOWANCE
from ..precision import EXACT, EXACT_ERROR
from ..stepnames import step_name, step_of
from ..schedules import (
    compositions,
    is_rollback,
    max_step,
    parse_schedule_name,
    ragged,
    schedule_name,
    validate_schedule,
)
from .build import need, normal
from .steps import drive_steps, step_output_names

STEP_RESULT = ("rows", "row_positions", "ring")  # what an implementation returns per step
RECORDED = ("rows", "row_positions", "ring_kept")  # what the harness records and compares per step
METADATA_OUTPUTS = ("row_positions", "store_slots", "valid", "out_rows")


# --- the schedule axis ------------------------------------------------------------------------


def schedules_from(spec: str) -> list[list[tuple[int, int]]]:
    """One `schedules:` entry of a case file -> the schedules it stands for.

    `compositions-N`: every composition of N positions (2^(N-1) schedules);
    `ragged-N-a-b-...`: N positions in chunks of a, b, ... cycling, the last one possibly short;
    anything else is a schedule name (`chunks-1-3-3`, `p21-d1x11`, `p5-d4-rb2-d3`).
    """
    head, _, rest = str(spec).partition("-")
    try:
        if head == "compositions":
            return compositions(int(rest))
        if head == "ragged":
            n, *sizes = (int(v) for v in rest.split("-"))
            return [ragged(n, sizes)]
        return [parse_schedule_name(str(spec))]
    except ValueError as exc:
        raise CaseSpecError(
            f"schedule {spec!r}: {exc}. Use compositions-N, ragged-N-a-b or a schedule name "
            "(chunks-1-3-3, p5-d1x4, p5-d4-rb2-d3; see docs/schedules.md)"
        ) from None


def expand_schedules(spec: CaseSpec) -> list[CaseSpec]:
    """Expand an entry's `build.schedules` into one case per schedule, named `<entry>-<schedule>`.

    Every case of one entry draws its inputs from the same seed (the entry's id), so all its
    schedules see the same weights and input rows and their goldens can be compared directly.
    """
    build = dict(spec.build)
    specs = build.pop("schedules", None)
    if specs is None:
        raise CaseSpecError(f"{spec.source}: {spec.component} cases need build.schedules (see docs/schedules.md)")
    build["data_seed"] = seed_for(f"{spec.component}/{spec.name}")
    out = []
    for item in specs if isinstance(specs, list) else [specs]:
        for schedule in schedules_from(item):
            params = {**spec.params, "schedule": [list(step) for step in schedule]}
            out.append(
                dataclasses.replace(
                    spec,
                    name=f"{spec.name}-{schedule_name(schedule)}",
                    params=params,
                    build=build,
                    source=f"{spec.source} ({item})",
                )
            )
    return out


def _data_generator(build: dict, gen: torch.Generator) -> torch.Generator:
    if "data_seed" not in build:
        return gen
    shared = torch.Generator()
    shared.manual_seed(int(build["data_seed"]))
    return shared


def _ratio(params: dict) -> int:
    ratio = int(params.get("ratio", 2))
    cp.check_ratio(ratio)
    return ratio


# --- compressor ---------------------------------------------------------------------------------


def _compressor_inputs(params, build, gen):
    """Weights (bf16 checkpoint values), the step-ordered input stream and a fresh ring."""
    ratio = _ratio(params)
    schedule = validate_schedule(params["schedule"])
    dim, hd, b = (int(need(build, k, "compressor")) for k in ("dim", "head_dim", "batch"))
    data = _data_generator(build, gen)
    wkv = normal(data, [hd, dim], dim**-0.5)
    wgate = normal(data, [hd, dim], float(build.get("score_scale", 1.0)) * dim**-0.5)
    norm_w = normal(data, [hd], 0.1, torch.float32).add(1.0).to(torch.bfloat16)
    accepted = normal(data, [b, max(end for _, end in schedule), dim], 1.0)  # [b, T, dim]
    chunks = []
    for i, (start, end) in enumerate(schedule):
        chunk = accepted[:, start:end].clone()
        if i + 1 < len(schedule) and is_rollback(schedule, i + 1):
            keep = schedule[i + 1][0] - start  # the draft's rejected tail saw other inputs
            chunk[:, keep:] = normal(gen, [b, end - start - keep, dim], 1.0)
        chunks.append(chunk)
    need_slots = cp.ring_capacity(ratio, max_step(schedule))
    slots = int(build.get("ring_slots", need_slots))
    if slots < need_slots:
        raise CaseSpecError(f"compressor: ring_slots {slots} < r + longest step - 1 = {need_slots}")
    return {
        "x": torch.cat(chunks, dim=1),  # [b, sum of step lengths, dim]
        "wkv": wkv,
        "wgate": wgate if ratio == 2 else torch.empty(0, dim, dtype=torch.bfloat16),
        "norm_w": norm_w,
        "ring": cp.new_ring(b, slots, hd) if ratio == 2 else cp.new_ring(b, 0, hd),
    }


def _weights(inputs, params) -> cp.CompressorWeights:
    eps = float(params.get("eps", 1e-20))
    if _ratio(params) == 1:
        return cp.CompressorWeights(wkv=inputs["wkv"], norm_w=inputs["norm_w"], eps=eps)
    return cp.CompressorWeights(wkv=inputs["wkv"], norm_w=inputs["norm_w"], wgate=inputs["wgate"], eps=eps)


def _compressor_reference(inputs, params):
    weights = _weights(inputs, params)
    res = cp.compressor_step(inputs["x"], int(params["start"]), inputs["ring"], weights, _ratio(params))
    return {"rows": res.rows, "row_positions": res.row_positions, "ring": res.ring}


def _stream_offsets(schedule) -> list[int]:
    offsets = [0]
    for start, end in schedule:
        offsets.append(offsets[-1] + end - start)
    return offsets


def _compressor_step_inputs(params):
    offsets = _stream_offsets(params["schedule"])

    def step_inputs(inputs, i, start, end):
        x = inputs["x"][:, offsets[i] : offsets[i + 1]]  # this step's chunk [b, n, dim]
        return {"x": x, "wkv": inputs["wkv"], "wgate": inputs["wgate"], "norm_w": inputs["norm_w"]}

    return step_inputs


def next_start(schedule, step: int) -> int:
    """Where the schedule's next step starts: the step's end, or before it for a rollback."""
    return int(schedule[step + 1][0]) if step + 1 < len(schedule) else int(schedule[step][1])


def _ring_kept(step_in, result, step_params):
    """Record the ring slots the schedule's next step reads (canonical layout), not the whole ring:
    the open group's positions at the next step's start, so a draft step that dropped a slot a
    rollback reads fails at the draft step itself (docs/schedules.md, "Which slots to keep")."""
    given, ring = step_in["ring"], result["ring"]
    if ring.dtype != torch.float32 or tuple(ring.shape) != tuple(given.shape):
        raise ValueError(
            f"returned ring {ring.dtype} {list(ring.shape)}, expected the canonical layout float32 "
            f"{list(given.shape)} (S slots of (score, latent), position p in slot p mod S; docs/schedules.md)"
        )
    read = cp.live_slots(
        next_start(step_params["schedule"], int(step_params["step"])), _ratio(step_params), ring.shape[1]
    )
    return {
        "rows": result["rows"],
        "row_positions": result["row_positions"],
        "ring_kept": ring.detach().cpu()[:, read].contiguous(),
    }


def _explain(name: str, params) -> str:
    """Which positions a failing `sNN.ring_kept` holds, and why the step had to keep them."""
    step, output = step_of(name), name.split(".", 1)[-1]
    if output != "ring_kept" or step is None or _ratio(params) != 2:
        return ""
    schedule = [(int(a), int(b)) for a, b in params["schedule"]]
    start, end = schedule[step]
    restart = next_start(schedule, step)
    read = list(cp.pending_positions(restart, 2))
    if restart == end:
        return f"it holds the ring slots of position(s) {read}: the open group at the step's end {end}"
    return (
        f"it holds the ring slot(s) of position(s) {read}, which the next step [{restart}, "
        f"{schedule[step + 1][1]}) reads: a rollback to {restart}, so the draft step [{start}, {end}) must keep "
        f"them although its own open group is {list(cp.pending_positions(end, 2))} (a step keeps positions "
        f"{cp.kept_positions(start, end, 2)}; docs/schedules.md, \"Which slots to keep\")"
    )


def _exact_rows(inputs, params):
    """Every step's rows without the reference's roundings after the projections, and how far those
    roundings may take the reference (`sNN.rows.exact`, `sNN.rows.exact_error`): the golden's schedule
    replayed from its first ring, as the golden was written (more precision never fails)."""
    weights, ratio, step_inputs = _weights(inputs, params), _ratio(params), _compressor_step_inputs(params)
    ring, context = inputs["ring"], {}
    for i, (start, end) in enumerate(params["schedule"]):
        x = step_inputs(inputs, i, int(start), int(end))["x"]
        exact, error = cp.exact_step_rows(x, int(start), ring, weights, ratio, BF16_GEMM_ALLOWANCE)
        context[step_name(i, "rows") + EXACT], context[step_name(i, "rows") + EXACT_ERROR] = exact, error
        ring = cp.compressor_step(x, int(start), ring, weights, ratio, check_capacity=False).ring
    return context


def _compressor_execute(call, inputs, params):
    return drive_steps(
        call,
        inputs,
        params,
        _compressor_step_inputs(params),
        state={"ring": "ring"},
        outputs=STEP_RESULT,
        derive=_ring_kept,
    )


register(
    Component(
        name="compressor",
        summary="ratio 1/2 pre-RoPE latent rows over a chunk schedule; the fp32 state ring checked after every step",
        upstream="M:429-485 (Compressor); chunked steps: harness generalisation of §3.5/§10.3, seed 000 §A.1-A.2",
        inputs=(
            T("x", "bf16", "b n dim", "this step's inputs (the golden holds every step's, in step order)"),
            T("wkv", "bf16", "hd dim", "promoted exactly to fp32 at ratio 2"),
            T("wgate", "bf16", "hd dim", "ratio 2; empty [0, dim] at ratio 1"),
            T("norm_w", "bf16", "hd"),
            T("ring", "f32", "b Sr 2 hd", "the ring the previous step returned (slot p % Sr: (score, latent))"),
        ),
        outputs=(
            OutputSpec(
                "rows",
                "bf16",
                "pre-RoPE latents of the groups the step completed, in order; or no farther from the exact "
                "rows than the reference's own bf16 cast before its norm takes it",
                "bf16",
                "b G hd",
                precision=True,
            ),
            OutputSpec("row_positions", "exact", "each completed group's first position j*r", "int64", "G"),
            OutputSpec(
                "ring_kept",
                "f32",
                "the returned ring's slots the next step reads: the open group's positions "
                "at the next step's start (its end, or the earlier start of a rollback), in position order",
                "f32",
                "b Pn 2 hd",
            ),
        ),
        returns=(
            T("rows", "bf16", "b G hd"),
            T("row_positions", "int64", "G"),
            T("ring", "f32", "b Sr 2 hd", "the new ring, in the layout it was given"),
        ),
        derived={
            "ring_kept": "the returned ring's slots of the open group's positions at the next step's start "
            "(live_slots of that start): every slot a rollback may read must be kept, and only "
            "slots a step reads are judged"
        },
        steps="one call per schedule step [start, end): x is that step's chunk, ring the ring the implementation "
        "returned at the previous step (the golden's fresh ring at step 0); compared per step as sNN.<output>",
        params=(
            P("ratio", "int", "compress ratio", choices=(1, 2), required=False, default=2),
            P("schedule", "int_pairs", "the steps [start, end) in order (rollbacks start before the previous end)"),
            P("eps", "float", "RMSNorm eps", required=False, default=1e-20),
            P("step", "int", "this call's step number", driver=True),
            P("start", "int", "this step's first position", "positions", driver=True),
            P("end", "int", "one past this step's last position", "positions", driver=True),
        ),
        dims={
            "b": "batch",
            "n": "the step's positions",
            "dim": "input width",
            "hd": "head_dim",
            "Sr": "ring slots (>= r + longest step - 1)",
            "2": "(score, latent)",
            "G": "groups completed in the step",
            "Pn": "the open group's positions at the next step's start",
        },
        build=_compressor_inputs,
        reference=_compressor_reference,
        judge_context=_exact_rows,
        explain=_explain,
        execute=_compressor_execute,
        expected_outputs=step_output_names(RECORDED),
        floor=64,
        notes="step i receives x = in.x[:, o_i : o_i + n_i] (in.x holds each step's inputs in step order, so a "
        "rejected draft's inputs appear once per write), wkv/wgate/norm_w (bf16 checkpoint values, promoted "
        "exactly to fp32 at ratio 2; wgate is empty at ratio 1) and the ring it returned at step i-1; params "
        "ratio, start, end, step, schedule. See docs/schedules.md.",
        extra={"expand": expand_schedules},
    )
)


# --- compressor.ring ----------------------------------------------------------------------------


def _ring_inputs(params, build, gen):
    _ratio(params)
    slots = int(need(build, "slots", "compressor.ring"))
    return {"ring": cp.new_ring(1, slots, int(build.get("head_dim", 16)))}


def _ring_reference(inputs, params):
    ratio, q_max = _ratio(params), int(params["q_max"])
    slots = int(inputs["ring"].shape[1])
    need_slots = cp.ring_capacity(ratio, q_max)
    try:
        if ratio == 1 and slots:
            raise ValueError("ratio 1 keeps no state")
        cp.check_ring_capacity(slots, ratio, q_max)
        accepted = True
    except ValueError:
        accepted = False
    return {"accepted": torch.tensor(accepted), "min_slots": torch.tensor(need_slots, dtype=torch.int64)}


register(
    Component(
        name="compressor.ring",
        summary="ring capacity: S >= r + q_max - 1 keeps every pair (7 at r = 2, q_max = 6); a smaller ring is refused",
        upstream="seed 000 §A.2 (state_cache.shape[1] >= compress_ratio + max_seqlen_q - 1); M:429-485",
        inputs=(T("ring", "f32", "1 Sr 2 hd", "a fresh ring of Sr slots"),),
        params=(
            P("ratio", "int", "compress ratio", choices=(1, 2), required=False, default=2),
            P("q_max", "int", "the longest step the ring must take", "positions"),
        ),
        dims={"Sr": "ring slots", "2": "(score, latent)", "hd": "head_dim"},
        outputs=(
            OutputSpec(
                "accepted", "exact", "would the implementation run steps of q_max positions on this ring", "bool", ""
            ),
            OutputSpec("min_slots", "exact", "the smallest ring it accepts, r + q_max - 1 (0 at ratio 1)", "int64", ""),
        ),
        build=_ring_inputs,
        reference=_ring_reference,
        floor=4,
    )
)


# --- compressor.metadata ------------------------------------------------------------------------


def _metadata_inputs(params, build, gen):
    ratio = _ratio(params)
    schedule = validate_schedule(params["schedule"])
    groups = sum(len(cp.completed_groups(start, end, ratio)) for start, end in schedule)
    b, hd = int(build.get("batch", 2)), int(build.get("head_dim", 16))
    return {"rows": normal(gen, [b, groups, hd], 1.0)}  # every step's completed rows, in step order


def _metadata_reference(inputs, params):
    ratio, start, end = _ratio(params), int(params["start"]), int(params["end"])
    meta = cp.compressor_metadata(params["kind"], start, end - start, ratio)
    rows = inputs["rows"]  # [b, G, hd]
    if rows.shape[1] != len(cp.completed_groups(start, end, ratio)):
        raise ValueError(
            f"step [{start}, {end}) completes {len(cp.completed_groups(start, end, ratio))} groups, "
            f"got {rows.shape[1]} rows"
        )
    out = torch.zeros(rows.shape[0], meta.valid.shape[0], rows.shape[2], dtype=rows.dtype)
    out[:, meta.valid] = rows  # valid rows are the completed groups in order; the rest stay zero
    return {"row_positions": meta.row_positions, "store_slots": meta.store_slots, "valid": meta.valid, "out_rows": out}


def _metadata_execute(call, inputs, params):
    ratio = _ratio(params)
    schedule = validate_schedule(params["schedule"])
    decode_from = int(params.get("decode_from", len(schedule)))
    offsets = [0]
    for start, end in schedule:
        offsets.append(offsets[-1] + len(cp.completed_groups(start, end, ratio)))

    def step_inputs(all_inputs, i, start, end):
        return {"rows": all_inputs["rows"][:, offsets[i] : offsets[i + 1]]}

    def with_kind(step_in, step_params):
        kind = "prefill" if int(step_params["step"]) < decode_from else "decode"
        return call(step_in, {**step_params, "kind": kind})

    return drive_steps(with_kind, inputs, params, step_inputs, state={}, outputs=METADATA_OUTPUTS)


register(
    Component(
        name="compressor.metadata",
        summary="rows a step reserves: prefill max(1, n_c) (placeholder: position 0, slot -1, zero row); "
        "decode one per query",
        upstream="seed 000 §A.1.1 (prepare_tensor_input_v4.cpp:46-91); M:746-761",
        inputs=(T("rows", "bf16", "b G hd", "the rows this step completed (the golden holds every step's, in order)"),),
        outputs=(
            OutputSpec(
                "row_positions", "exact", "RoPE position j*r of each reserved row, 0 for a placeholder", "int64", "R"
            ),
            OutputSpec("store_slots", "exact", "compressed cache row j, -1 where nothing is stored", "int64", "R"),
            OutputSpec("valid", "exact", "the row is a completed group", "bool", "R"),
            OutputSpec(
                "out_rows",
                "exact",
                "the step's completed rows in their reserved rows, zeros elsewhere",
                "bf16",
                "b R hd",
            ),
        ),
        steps="one call per schedule step; params.kind says prefill or decode",
        params=(
            P("ratio", "int", "compress ratio", choices=(1, 2), required=False, default=2),
            P("schedule", "int_pairs", "the steps [start, end)"),
            P(
                "decode_from",
                "int",
                "the first step that is a decode step",
                required=False,
                derive=lambda p: len(p.get("schedule") or []),
                default_doc="len(schedule): every step is a prefill step",
            ),
            P("step", "int", "this call's step number", driver=True),
            P("start", "int", "this step's first position", "positions", driver=True),
            P("end", "int", "one past this step's last position", "positions", driver=True),
            P("kind", "str", "prefill or decode", driver=True, choices=("prefill", "decode")),
        ),
        dims={
            "b": "batch",
            "G": "groups completed in the step",
            "hd": "head_dim",
            "R": "rows reserved: prefill max(1, G), decode one per query",
        },
        build=_metadata_inputs,
        reference=_metadata_reference,
        execute=_metadata_execute,
        expected_outputs=step_output_names(METADATA_OUTPUTS),
        floor=3,
        notes="step i receives rows = the bf16 [b, G_i, hd] rows it completed and params ratio, start, end, step, "
        "kind ('prefill' for steps before params.decode_from, else 'decode').",
        extra={"expand": expand_schedules},
    )
)
