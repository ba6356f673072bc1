"""The component catalogue: the contract an implementation must meet, generated from the registry.

Per component: the inputs a call receives, what a call returns, the outputs compared (and how
the harness derives those it does not receive), the intermediates a call may also return (each
judged, and what follows it judged given it), each with dtype and symbolic shape; every
parameter with its type, unit and meaning; whether the component is stepped and what a step is.
`conformance list --components [--json | --markdown]` prints it; `docs/catalogue.md` is the
Markdown form, kept equal to the registry by a test. Nothing here is written by hand twice.
"""

from __future__ import annotations

from typing import Any

from .config import Config
from .registry import Component, OutputSpec, TensorSpec

SCHEMA = 1
# How a param reaches a subprocess implementation (docs/subprocess-protocol.md).
PARAM_ENCODING = {
    "int": "param.<name>: I64 []",
    "float": "param.<name>: F64 []",
    "bool": "param.<name>: BOOL []",
    "str": "param.<name>: U8 [n], UTF-8 bytes",
    "int_list": "param.<name>: I64 [n]",
    "int_pairs": "param.<name>: I64 [n, 2]",
    "mapping": "param.<name>.<field>: one tensor per field, by the field's JSON type (the same rules)",
}
SAFETENSORS_DTYPE = {
    "bf16": "BF16",
    "f16": "F16",
    "f32": "F32",
    "f64": "F64",
    "int64": "I64",
    "int32": "I32",
    "uint8": "U8",
    "bool": "BOOL",
}


def _tensor(t: TensorSpec | OutputSpec) -> dict[str, Any]:
    out = {"name": t.name, "dtype": t.dtype, "shape": t.shape.split() if t.shape else [], "doc": t.doc}
    if getattr(t, "when", ""):
        out["when"] = t.when
    return out


def returned(component: Component) -> list[dict[str, Any]]:
    """What one call of `run` returns (per step for a stepped component)."""
    if component.returns is not None:
        return [_tensor(t) for t in component.returns]
    return [_tensor(o) for o in component.outputs if o.name not in component.derived]


def describe(component: Component, config: Config) -> dict[str, Any]:
    compared = []
    for o in component.outputs:
        entry = {**_tensor(o), "kind": o.kind}
        if o.kind in ("bf16", "f32", "quantised", "index", "exact"):
            dtype = {"bf16": "bf16", "f32": "f32"}.get(o.dtype) if o.kind in ("bf16", "f32") else None
            entry["policy"] = config.policy(component, o.name, dtype=_torch_dtype(dtype)).describe()
        if o.name in component.derived:
            entry["derived"] = component.derived[o.name]
        compared.append(entry)
    intermediates = [
        {
            **_tensor(o),
            "feeds": o.feeds,
            "policy": config.policy(component, o.name, dtype=_torch_dtype(o.dtype)).describe(),
        }
        for o in component.intermediates
    ]
    return {
        "summary": component.summary,
        "upstream": component.upstream,
        "stepped": bool(component.steps),
        "steps": component.steps,
        "inputs": [_tensor(t) for t in component.inputs],
        "returns": returned(component),
        "compared": compared,
        "intermediates": intermediates,
        "params": [
            {
                "name": p.name,
                "type": p.type,
                "unit": p.unit,
                "doc": p.doc,
                "required": p.required,
                "choices": list(p.choices),
                "set_by": "driver" if p.driver else "case",
                "default": (None if p.derive is not None else p.default) if p.has_default else None,
                "default_doc": p.describe_default(),
                "encoding": PARAM_ENCODING[p.type].replace("<name>", p.name),
            }
            for p in component.params
        ],
        "dims": dict(component.dims),
        "notes": component.notes,
    }


def _torch_dtype(name: str | None):
    import torch

    return {"bf16": torch.bfloat16, "f32": torch.float32}.get(name or "")


def catalogue(config: Config, registry: dict[str, Component]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "param_encoding": PARAM_ENCODING,
        "safetensors_dtypes": SAFETENSORS_DTYPE,
        "components": {name: describe(c, config) for name, c in sorted(registry.items())},
    }


def _shape(entry: dict) -> str:
    return "[" + ", ".join(entry["shape"]) + "]"


def _when(entry: dict) -> str:
    return f" (only {entry['when']})" if entry.get("when") else ""


def render_text(doc: dict[str, Any]) -> str:
    lines = []
    for name, c in doc["components"].items():
        lines.append(f"{name}: {c['summary']} [{c['upstream']}]")
        if c["stepped"]:
            lines.append(f"  stepped: {c['steps']}")
        for label, key in (("in", "inputs"), ("returns", "returns")):
            for t in c[key]:
                lines.append(f"  {label} {t['name']}: {t['dtype']} {_shape(t)}{_when(t)}  {t['doc']}".rstrip())
        for t in c["compared"]:
            how = f"; derived: {t['derived']}" if t.get("derived") else ""
            lines.append(f"  compared {t['name']}: {t['dtype']} {_shape(t)}: {t.get('policy', t['kind'])}{how}")
        for t in c.get("intermediates", ()):
            lines.append(
                f"  may return {t['name']}: {t['dtype']} {_shape(t)}{_when(t)}  {t['doc']}; feeds "
                f"{t['feeds']}; {t['policy']}"
            )
        for p in c["params"]:
            flag = (
                ""
                if p["required"]
                else f" (optional, default {p['default_doc']})"
                if p["default_doc"]
                else " (optional)"
            )
            flag += " (set per call)" if p["set_by"] == "driver" else ""
            unit = f" [{p['unit']}]" if p["unit"] else ""
            choices = f" one of {p['choices']}" if p["choices"] else ""
            lines.append(f"  param {p['name']}: {p['type']}{unit}{flag}{choices}  {p['doc']}")
        if c["dims"]:
            lines.append("  dims: " + "; ".join(f"{k} = {v}" for k, v in c["dims"].items()))
    return "\n".join(lines) + "\n"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|")


def render_markdown(doc: dict[str, Any]) -> str:
    out = [
        "# Component catalogue",
        "",
        "Generated from the registry by `conformance list --components --markdown`; a test keeps it equal. "
        "Machine-readable: `conformance list --components --json`. dtypes are the harness's names (safetensors: "
        + ", ".join(f"{k} = {v}" for k, v in doc["safetensors_dtypes"].items())
        + "). Shapes are symbolic; "
        "each component lists what its symbols mean. Every param reaches the implementation, an optional one "
        "left out by its case with the default stated here. A subprocess implementation receives every param as "
        "tensors: " + "; ".join(f"{k}: `{v}`" for k, v in doc["param_encoding"].items()) + ".",
        "",
    ]
    for name, c in doc["components"].items():
        out += [f"## `{name}`", "", f"{c['summary']} (upstream {c['upstream']})", ""]
        if c["stepped"]:
            out += [f"**Stepped:** {c['steps']}.", ""]
        out += ["| | name | dtype | shape | meaning |", "|---|---|---|---|---|"]
        for label, key in (("input", "inputs"), ("returns", "returns")):
            for t in c[key]:
                out.append(
                    f"| {label} | `{t['name']}` | {_cell(t['dtype'])} | `{_cell(_shape(t))}` | "
                    f"{_cell(t['doc'])}{_when(t)} |"
                )
        for t in c["compared"]:
            how = f" Derived: {t['derived']}." if t.get("derived") else ""
            out.append(
                f"| compared | `{t['name']}` | {_cell(t['dtype'])} | `{_cell(_shape(t))}` | {_cell(t['doc'])}. "
                f"{_cell(t.get('policy', t['kind']))}.{_cell(how)} |"
            )
        for t in c.get("intermediates", ()):
            out.append(
                f"| may return | `{t['name']}` | {_cell(t['dtype'])} | `{_cell(_shape(t))}` | {_cell(t['doc'])}"
                f"{_when(t)}; feeds {_cell(t['feeds'])}. {_cell(t['policy'])}. |"
            )
        if c["params"]:
            out += ["", "| param | type | unit | set by | default | meaning |", "|---|---|---|---|---|---|"]
            for p in c["params"]:
                req = "" if p["required"] else " (optional)"
                default = (
                    f"`{_cell(p['default_doc'])}`"
                    if p["default_doc"] and p["default"] is not None
                    else _cell(p["default_doc"])
                    if p["default_doc"]
                    else "per call"
                    if p["set_by"] == "driver"
                    else "required"
                    if p["required"]
                    else ""
                )
                choices = f" One of {', '.join(map(str, p['choices']))}." if p["choices"] else ""
                out.append(
                    f"| `{p['name']}` | {p['type']} | {p['unit']} | {p['set_by']}{req} | {default} | "
                    f"{_cell(p['doc'])}.{_cell(choices)} |"
                )
        if c["dims"]:
            out += ["", "Dims: " + "; ".join(f"`{k}` {v}" for k, v in c["dims"].items()) + "."]
        out.append("")
    return "\n".join(out)
