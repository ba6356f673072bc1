"""The implementation protocol every adapter presents to the runner."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Implementation(Protocol):
    """An implementation under test.

    `supports` says which components it implements: the others are reported `unsupported`,
    never `fail`. `run` receives named input tensors (CPU, or the `--device` when the adapter
    moves them) and the case params, and returns named output tensors.
    """

    def supports(self, component: str) -> bool: ...

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]: ...
