"""Replacing one reference function everywhere the harness holds it, for the span of a `with`.

The reference modules import each other's functions by name (`from .numerics import rms_norm`), so a
variant that changes one function must reach every module-level name bound to that same object.
Single-threaded by design: the runner judges one case at a time per process.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

PREFIX = __package__.rpartition(".")[0] + "."  # the package these modules live in


def resolve(target: str) -> tuple[Any, str, Any]:
    """(module, attribute, current value) of "package.module:attribute"."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return module, attribute, getattr(module, attribute)


@contextlib.contextmanager
def replaced(target: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Every harness module attribute bound to `target`'s object is `make(original)` inside the block."""
    _, _, original = resolve(target)
    replacement = make(original)
    bound = [
        (module, name)
        for module_name, module in list(sys.modules.items())
        if module is not None and (module_name == PREFIX[:-1] or module_name.startswith(PREFIX))
        for name, value in list(vars(module).items())
        if value is original
    ]
    for module, name in bound:
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name in bound:
            setattr(module, name, original)


@contextlib.contextmanager
def constant(target: str, value: Any) -> Iterator[None]:
    """The module constant `target` is `value` inside the block (in its own module only)."""
    module, attribute, original = resolve(target)
    setattr(module, attribute, value)
    try:
        yield
    finally:
        setattr(module, attribute, original)
