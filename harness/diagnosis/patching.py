"""Replacing one reference function everywhere the harness holds it, for the span of a `with`.

The reference modules import each other's functions by name (`from .numerics import rms_norm`), so a
variant that changes one function must reach every module-level name bound to that same object.
Single-threaded by design: the runner judges one case at a time per process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch

PREFIX = __package__.rpartition(".")[0] + "."  # the package these modules live in


class Trace:
    """The replaced functions called, and those whose result differed from the original's on the same
    arguments: what the diagnosis's confirmation along a chain reads to tell the stages a variant reaches
    (and changes) from those it leaves as the reference computes them (harness/runner.py, `confirmed`)."""

    def __init__(self, compare: bool = True) -> None:
        self.called: set[str] = set()
        self.diverged: set[str] = set()
        self.compare = compare  # False: calls only (nothing computed twice)
        self.tainted = False  # called before any stage: what every stage reads may be the variant's

    def clear(self) -> None:
        self.called.clear()
        self.diverged.clear()


TRACE: ContextVar[Trace | None] = ContextVar("TRACE", default=None)
# The targets in force now: functions (`replaced`, traced) and constants (`constant`: a value is read
# without a call, so nothing traces it).
_FUNCTIONS: list[str] = []
_CONSTANTS: list[str] = []


def in_force() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(functions, constants) replaced now."""
    return tuple(_FUNCTIONS), tuple(_CONSTANTS)


def resolve(target: str) -> tuple[Any, str, Any]:
    """(module, attribute, current value) of "package.module:attribute"."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return module, attribute, getattr(module, attribute)


def _harness_modules() -> list[Any]:
    """The loaded modules of this package (read from sys.modules each call: imports may add some)."""
    return [
        module
        for module_name, module in list(sys.modules.items())
        if module is not None and (module_name == PREFIX[:-1] or module_name.startswith(PREFIX))
    ]


# target -> (the object found there, the modules scanned, where that object was bound). A scan
# reads every attribute of every harness module; the chain and the gates replace the same few
# functions thousands of times a run, so the scan is kept while neither the object nor the set of
# loaded modules has changed. Attributes are only ever rebound through `replaced`, which restores them.
_BOUND: dict[str, tuple[Any, tuple[int, ...], list[tuple[Any, str]]]] = {}


def _bound_to(target: str, original: Any) -> list[tuple[Any, str]]:
    modules = _harness_modules()
    key = tuple(id(module) for module in modules)
    cached = _BOUND.get(target)
    if cached is not None and cached[0] is original and cached[1] == key:
        return cached[2]
    bound = [(module, name) for module in modules for name, value in list(vars(module).items()) if value is original]
    _BOUND[target] = (original, key, bound)
    return bound


@contextlib.contextmanager
def replaced(target: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Every harness module attribute bound to `target`'s object is `make(original)` inside the block."""
    _, _, original = resolve(target)
    made = make(original)

    @functools.wraps(made)
    def replacement(*args, **kwargs):
        trace = TRACE.get()
        if trace is None:
            return made(*args, **kwargs)
        trace.called.add(target)
        result = made(*args, **kwargs)
        if trace.compare and target not in trace.diverged and not same_result(result, original(*args, **kwargs)):
            trace.diverged.add(target)
        return result

    bound = _bound_to(target, original)
    for module, name in bound:
        setattr(module, name, replacement)
    _FUNCTIONS.append(target)
    try:
        yield
    finally:
        _FUNCTIONS.remove(target)
        for module, name in bound:
            setattr(module, name, original)


@contextlib.contextmanager
def constant(target: str, value: Any) -> Iterator[None]:
    """The module constant `target` is `value` inside the block (in its own module only)."""
    module, attribute, original = resolve(target)
    setattr(module, attribute, value)
    _CONSTANTS.append(target)
    try:
        yield
    finally:
        _CONSTANTS.remove(target)
        setattr(module, attribute, original)


def same_result(a: Any, b: Any) -> bool:
    """Whether two results of a reference function are the same, bit for bit (tensors, and the tuples,
    lists, dicts and dataclasses that hold them)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point:  # NaN-safe and signed zeros told apart
            return torch.equal(
                a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8)
            )
        return torch.equal(a, b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            same_result(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same_result(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_result(a[k], b[k]) for k in a)
    return bool(a == b)
