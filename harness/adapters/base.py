"""The implementation protocol every adapter presents to the runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch

    # What `run` returns: named output tensors, some of them `Declined` (a dict: the runner refuses
    # anything else). Two dicts, as a dict's value type is invariant: a port annotated
    # `-> dict[str, torch.Tensor]` is an Implementation too.
    Outputs: TypeAlias = "dict[str, torch.Tensor] | dict[str, torch.Tensor | Declined]"


class Unsupported(Exception):
    """Raised by `run` for a case the implementation does not handle: that case is `unsupported`.

    >>> raise Unsupported("chunked decode steps are not implemented")
    """


class Declined:
    """Returned in place of one output the implementation does not compute (a port that selects ids
    without materialising their scores, say): the case is judged on its other outputs and reported
    `partial`, never as a pass of the declined one.

    >>> return {"ids": ids, "scores": Declined("ids only: the scores are never materialised")}
    """

    def __init__(self, reason: str = ""):
        self.reason = str(reason) or "declined by the implementation"

    def __repr__(self) -> str:
        return f"Declined({self.reason!r})"

    def __reduce__(self):  # crosses the isolation boundary like a tensor
        return (Declined, (self.reason,))


@runtime_checkable
class Implementation(Protocol):
    """An implementation under test.

    `supports` says which components it implements: the others are reported `unsupported`,
    never `fail`. `run` receives named input tensors (CPU, or the `--device` when the adapter
    moves them) and the case params, and returns named output tensors. `run` may raise
    `Unsupported("reason")` for one case it does not handle (a shape, a schedule, a top-k
    branch): that case alone is reported `unsupported`, with the reason; and it may return
    `Declined("reason")` for one output it does not compute (the case is then `partial`).
    """

    def supports(self, component: str) -> bool: ...

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> Outputs: ...
