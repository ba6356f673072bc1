"""Our own test helpers, in a module we called `harness`: it lives beside the installed
v41-conformance (import name `v41_conformance`) and its pytest plugin without either shadowing the other."""

from __future__ import annotations


def bench(fn, *args, repeat: int = 3):
    """Call `fn(*args)` `repeat` times; its result (the timing itself is for humans, never asserted)."""
    result = None
    for _ in range(repeat):
        result = fn(*args)
    return result
