"""Driving a stateful component through a schedule, one implementation call per step.

The golden holds the whole input sequence, the initial state and the schedule (a list of
`[start, end)` steps in `params["schedule"]`). For each step the driver slices the step's inputs,
passes the state the implementation returned at the previous step (never the reference's: the
harness really chunks), and records every output as `s<step>.<name>` (`s00.rows`, `s01.ring`).
The generator runs the same driver with the reference, so goldens hold the reference's state
after every step and the comparator can name the first divergent step.

A component may record something other than the raw step result through `derive` (for example
the compressor records its ring's live slots, not the whole ring, so an implementation is never
judged on slots no future step reads). Without `derive`, every returned output is recorded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..adapters.base import Declined, Unsupported
from ..registry import Call, Params, Tensors
from ..runner import StepError, names_error
from ..stepnames import step_name

StepInputs = Callable[[Tensors, int, int, int], Tensors]  # (inputs, step, start, end) -> step inputs
Derive = Callable[[Tensors, Tensors, Params], Tensors]  # (step inputs, step result, step params) -> recorded


def drive_steps(
    call: Call,
    inputs: Tensors,
    params: Params,
    step_inputs: StepInputs,
    state: dict[str, str],
    outputs: tuple[str, ...],
    derive: Derive | None = None,
) -> Tensors:
    """Run every step of `params["schedule"]`.

    state: maps a state output name to the input name it feeds at the next step (for example
    {"ring": "ring"}); the first step gets the golden's initial state from `inputs`.
    outputs: the names each step must return (state names included).
    derive: optional; maps (the step's inputs, its validated result, the step params) to the
    tensors recorded for that step. A ValueError it raises (a malformed state, say) becomes a
    StepError of that step. The state carried to the next step is always the raw result.
    """
    schedule = [(int(a), int(b)) for a, b in params["schedule"]]
    carried = {in_name: inputs[in_name] for in_name in state.values()}
    recorded: Tensors = {}
    for i, (start, end) in enumerate(schedule):
        step_in = {**step_inputs(inputs, i, start, end), **{k: v.clone() for k, v in carried.items()}}
        step_params = {**params, "step": i, "start": start, "end": end}
        try:
            result = call(step_in, step_params)
        except Unsupported:
            raise
        except Exception as exc:
            raise StepError(i, f"[{start}, {end}) raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, dict):
            raise StepError(
                i, f"[{start}, {end}) returned {type(result).__name__}, expected a dict of tensors", "type error"
            )
        missing = [n for n in outputs if n not in result]
        extra = [n for n in result if n not in outputs]
        if missing or extra:
            raise StepError(
                i, f"[{start}, {end}) returned {sorted(result)}; expected {sorted(outputs)}", names_error(missing)
            )
        for name in outputs:
            value = result[name]
            if isinstance(value, Declined) and name not in state:  # judged nowhere: the case is partial
                continue
            if not isinstance(value, torch.Tensor):
                what = (
                    "state the next step needs, which cannot be declined"
                    if isinstance(value, Declined)
                    else f"a {type(value).__name__}, not a tensor"
                )
                raise StepError(i, f"output {name!r} is {what}", "type error")
        record = {name: result[name] for name in outputs}
        if derive is not None:
            try:
                record = derive(step_in, record, step_params)
            except ValueError as exc:
                raise StepError(i, f"[{start}, {end}) {exc}") from exc
        for name, value in record.items():
            recorded[step_name(i, name)] = value if isinstance(value, Declined) else value.detach().cpu()
        carried = {in_name: result[out_name] for out_name, in_name in state.items()}
    return recorded


def step_output_names(outputs: tuple[str, ...]) -> Callable[[Params], tuple[str, ...]]:
    def names(params: Params) -> tuple[str, ...]:
        return tuple(step_name(i, n) for i in range(len(params["schedule"])) for n in outputs)

    return names
