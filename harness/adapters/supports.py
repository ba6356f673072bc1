"""`supports:` of an implementation's conformance.yaml entry: the component-name patterns that narrow
what it is asked for (a Python implementation and a program alike)."""

from __future__ import annotations

import fnmatch
from typing import Any

from ..errors import UsageError


def supports_patterns(conf: dict[str, Any], name: str) -> list[str] | None:
    """`supports:` of an implementation's conformance.yaml entry: shell patterns over component
    names (`quant.*`, `indexer.select`), or None when the entry has none."""
    patterns = conf.get("supports")
    if patterns is None:
        return None
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise UsageError(
            f"conformance.yaml: impls.{name}.supports must be a list of component name patterns, "
            f"such as [quant.*, indexer.select]; got {patterns!r}"
        )
    return patterns


def matches_any(component: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(component, p) for p in patterns)
