"""Swap a reference function for one call: how the wrong implementations inject their bug."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def patched(module, name: str, replacement):
    """Swap `module.name` for the duration of one call (the runner runs one case at a time)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)
