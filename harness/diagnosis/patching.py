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
    replacement = make(original)
    bound = _bound_to(target, original)
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
