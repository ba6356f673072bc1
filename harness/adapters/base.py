"""The implementation protocol every adapter presents to the runner."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


class Unsupported(Exception):
    """Raised by `run` for a case the implementation does not handle: that case is `unsupported`.

    >>> raise Unsupported("chunked decode steps are not implemented")
    """


@runtime_checkable
class Implementation(Protocol):
    """An implementation under test.

    `supports` says which components it implements: the others are reported `unsupported`,
    never `fail`. `run` receives named input tensors (CPU, or the `--device` when the adapter
    moves them) and the case params, and returns named output tensors. `run` may raise
    `Unsupported("reason")` for one case it does not handle (a shape, a schedule, a top-k
    branch): that case alone is reported `unsupported`, with the reason.
    """

    def supports(self, component: str) -> bool: ...

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]: ...
