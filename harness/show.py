"""`conformance show CASE_ID [--dump DIR]`: one concrete case, as a porter needs it.

The text form lists the case's params (with their declared types) and every tensor of its golden
(`in.*` what the implementation receives, `out.*` what it must return or what is compared,
`aux.*` what the comparator uses) with dtype, shape and its first values. `--dump DIR` drives the
case's calls with the reference, the way the runner drives an implementation, and writes each
call's request file exactly as a subprocess program receives it (`request-NNN.safetensors`,
docs/subprocess-protocol.md) with the reference's answer (`response-NNN.safetensors`), and a
`calls.json` listing them (component, params, files).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from . import regenerated
from .adapters.subprocess_adapter import write_request
from .config import Config
from .golden import Golden, load_verified, read_manifest
from .ids import check_case_id
from .known import get


def load_case(config: Config, case_id: str) -> Golden:
    from .errors import CaseSpecError, UsageError

    try:
        component_name, _ = check_case_id(case_id)
    except CaseSpecError as exc:
        raise UsageError(str(exc)) from None
    golden = load_verified(config.goldens, case_id, read_manifest(config.goldens), config.generate_command)
    regenerated.restore(golden, get(component_name))
    return golden


def _values(t: torch.Tensor, count: int) -> str:
    flat = t.flatten()[:count]
    if t.dtype in (torch.bfloat16, torch.float16):
        flat = flat.float()
    items = [f"{v:.6g}" if isinstance(v, float) else str(v) for v in flat.tolist()]
    more = ", ..." if t.numel() > count else ""
    return f"[{', '.join(items)}{more}]"


def render_case(config: Config, case_id: str, values: int = 6) -> str:
    golden = load_case(config, case_id)
    component = get(golden.meta["component"])
    lines = [f"{case_id}  ({component.name}: {component.summary})"]
    if component.steps:
        lines.append(f"stepped: {component.steps}")
    lines.append("params:")
    for key, value in golden.meta["params"].items():
        spec = component.param_spec(key)
        kind = spec.type if spec else "?"
        shown = json.dumps(value)
        lines.append(f"  {key} ({kind}) = {shown if len(shown) <= 200 else shown[:200] + ' ...'}")
    for prefix, tensors in (("in", golden.inputs), ("out", golden.outputs), ("aux", golden.aux)):
        for name, t in sorted(tensors.items()):
            dtype = str(t.dtype).replace("torch.", "")
            lines.append(f"  {prefix}.{name}: {dtype} {list(t.shape)} {_values(t, values)}")
    return "\n".join(lines) + "\n"


def dump_requests(config: Config, case_id: str, folder: Path) -> list[dict]:
    """Write every call's request and the reference's response; returns the calls.json entries."""
    golden = load_case(config, case_id)
    component = get(golden.meta["component"])
    folder.mkdir(parents=True, exist_ok=True)
    calls: list[dict] = []

    def call(inputs: dict[str, torch.Tensor], params: dict) -> dict[str, torch.Tensor]:
        n = len(calls)
        request, response = folder / f"request-{n:03d}.safetensors", folder / f"response-{n:03d}.safetensors"
        write_request(request, component.name, inputs, params)
        outputs = component.reference(inputs, params)
        save_file({k: v.detach().cpu().contiguous() for k, v in outputs.items()}, str(response))
        calls.append(
            {"component": component.name, "params": params, "request": request.name, "response": response.name}
        )
        return outputs

    component.execute(call, {k: v.clone() for k, v in golden.inputs.items()}, dict(golden.meta["params"]))
    (folder / "calls.json").write_text(json.dumps({"case": case_id, "calls": calls}, indent=1) + "\n")
    return calls
