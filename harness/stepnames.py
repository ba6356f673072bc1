"""Names of what stepped components record: `sNN.<name>` per step, `sNN.lK.<name>` per step and
layer (`s03.rows`, `s00.l2.compressed_ids`), and the step a name belongs to."""

from __future__ import annotations


def step_name(step: int, name: str) -> str:
    return f"s{step:02d}.{name}"


def layer_name(step: int, layer: int, name: str) -> str:
    return step_name(step, f"l{layer}.{name}")


def step_of(name: str) -> int | None:
    """The step of a recorded name (`s03.l1.out` -> 3), None for a name of no step."""
    head = name.split(".", 1)[0]
    if head.startswith("s") and head[1:].isdigit() and "." in name:
        return int(head[1:])
    return None
