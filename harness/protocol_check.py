"""`conformance check-protocol`: a program's reading of the subprocess protocol, checked before its numbers.

The program answers one extra component, `protocol.echo` (docs/subprocess-protocol.md): it reads
every input tensor and every param with the code its real components use, and writes each back
under its own name in the encoding it arrived in (tensors as they are; params as `param.<name>`,
a mapping's fields as `param.<name>.<field>`). Two requests carry every tensor dtype (0-d, 1-d,
3-d and empty shapes) and every param type with values unlike any default (each truth value of
a bool once, negative ints, a float that needs all 52 bits, UTF-8 beyond ASCII, an empty list, a
mapping): an item that comes back otherwise is named with what was sent and what came back, so a
parser that reads BOOL [] as I64 and falls back to its own default is caught by name, before a
single case fails for it. The `components` answer is checked against the catalogue too.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

import torch

from .tensorbytes import tensor_bytes

ECHO = "protocol.echo"
DTYPE_NAMES = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    """One tensor per dtype, each in another shape; values whose bits a misread would change."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64) * 3
    return {
        "x_bf16": base.to(torch.bfloat16),
        "x_f16": base[0].to(torch.float16),
        "x_f32": base[:, 0, 0].float(),
        "x_f64": base[0, 0, 0].clone(),
        "x_i64": (base * 1e6).to(torch.int64),
        "x_i32": (base[1] * -100).to(torch.int32),
        "x_u8": torch.arange(seed, seed + 7, dtype=torch.uint8) * 37,
        "x_bool": base[0] > 0,
        "x_empty": torch.zeros(0, 4, dtype=torch.float32),
    }


def requests() -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """Two echo requests: every tensor dtype and every param type, the bools flipped between them."""
    a = {
        "k": -7,
        "start": 4097,
        "eps": 1e-6,
        "softmax_scale": 0.1,
        "sorted": False,
        "largest": True,
        "mode": "chunk",
        "note": "naïve — ü",
        "ids": [3, -1, 0],
        "empty": [],
        "schedule": [[0, 5], [5, 6], [3, 9]],
        "config": {"dim": 64, "norm_eps": 1e-6, "name": "tiny-a", "fp8": True},
    }
    b = {
        "k": 2**40 + 3,
        "start": 0,
        "eps": -2.5e-300,
        "softmax_scale": 1 / 3,
        "sorted": True,
        "largest": False,
        "mode": "decode",
        "note": "",
        "ids": [-9],
        "empty": [],
        "schedule": [[7, 8]],
        "config": {"dim": 5120, "norm_eps": 1.0, "name": "production", "fp8": False},
    }
    return [(_tensors(1), a), (_tensors(2), b)]


@dataclass
class Finding:
    name: str  # the tensor or param that came back otherwise ("" for the program as a whole)
    message: str

    def line(self) -> str:
        return f"MISREAD {self.name}: {self.message}" if self.name else f"PROBLEM: {self.message}"


def _describe(t: torch.Tensor) -> str:
    shape = "[" + ", ".join(str(d) for d in t.shape) + "]"
    values = t.flatten()[:4].tolist()
    more = ", ..." if t.numel() > 4 else ""
    return f"{DTYPE_NAMES.get(t.dtype, t.dtype)} {shape} = {', '.join(map(repr, values))}{more}"


def _hint(name: str, sent: torch.Tensor, got: torch.Tensor) -> str:
    if sent.dtype == torch.bool and got.dtype != torch.bool:
        return " (a BOOL [] param is one byte, 0 or 1: read it as a bool, not as I64)"
    if sent.dtype == torch.bool and sent.shape == got.shape:
        return " (the other truth value: a parser that fell back to its own default?)"
    if sent.dtype == torch.uint8 and name.startswith("param."):
        return " (a str param is U8 [n], its UTF-8 bytes)"
    if sent.dtype != got.dtype:
        return f" (it arrived as {DTYPE_NAMES.get(sent.dtype)}; write it back in that dtype)"
    return ""


def compare(sent: dict[str, torch.Tensor], got: dict[str, Any]) -> list[Finding]:
    """Every item of one echo request that did not come back bit for bit."""
    findings = []
    for name, tensor in sorted(sent.items()):
        back = got.get(name)
        if not isinstance(back, torch.Tensor):
            findings.append(Finding(name, f"sent {_describe(tensor)}; not returned"))
            continue
        same = (
            back.dtype == tensor.dtype
            and back.shape == tensor.shape
            and bytes(tensor_bytes(back)) == bytes(tensor_bytes(tensor))
        )
        if not same:
            findings.append(
                Finding(name, f"sent {_describe(tensor)}; returned {_describe(back)}{_hint(name, tensor, back)}")
            )
    for name in sorted(set(got) - set(sent)):
        findings.append(Finding(name, "returned, but never sent (echo returns exactly what it received)"))
    return findings


def check_components(answer: list[str]) -> list[Finding]:
    from .known import components

    known = set(components())
    return [
        Finding(
            "",
            f"`components` lists {line!r}, which names no component of this harness (known: "
            f"`conformance list --components`)",
        )
        for line in answer
        if line != ECHO and not any(fnmatch.fnmatchcase(name, line) for name in known)
    ]


def check_program(adapter) -> tuple[list[Finding], int]:
    """(findings, items checked) for a SubprocessAdapter."""
    from .adapters.base import Unsupported
    from .adapters.subprocess_adapter import ImplementationError, param_tensors

    findings: list[Finding] = []
    try:
        findings += check_components(adapter.components_answer())
    except ImplementationError as exc:
        findings.append(Finding("", f"`components` failed: {exc}"))
    checked = 0
    for tensors, params in requests():
        sent = {**tensors, **param_tensors(params)}
        checked += len(sent)
        try:
            got = adapter.run(ECHO, tensors, params)
        except Unsupported as exc:
            findings.append(
                Finding(
                    "",
                    f"the program declined {ECHO} ({exc}); answer it (docs/subprocess-protocol.md, "
                    "\"Checking the protocol\") to have its parsing checked",
                )
            )
            break
        except ImplementationError as exc:
            findings.append(Finding("", f"{ECHO} failed: {exc}"))
            break
        findings += compare(sent, got)
    return findings, checked
