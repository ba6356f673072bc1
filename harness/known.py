"""The components the harness knows: every definition of `v41_conformance.components` imported, then
looked up in the registry (`components()`, `get(name)`). The definitions import the registry; the
registry imports none of them."""

from __future__ import annotations

from .registry import Component, registered


def components() -> dict[str, Component]:
    """All registered components, importing their definitions on first use."""
    from . import components as _definitions  # noqa: F401  (registers on import)

    return registered()


def get(name: str) -> Component:
    registry = components()
    if name not in registry:
        raise KeyError(f"unknown component {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]
