"""Case ids and `--select` patterns.

A case id is `<component>/<case>`: the component name (dotted lowercase words) and a case part
of letters, digits, `-`, `_`, `.` and `=`. The same id names the golden file
(`goldens/<component>/<case>.safetensors`), the pytest item, report rows and expectation
entries. `--select` takes shell-style patterns (`fnmatch`), comma separated; a pattern without
`/` also matches the whole component (`compressor*` selects every compressor case).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from .errors import CaseSpecError

COMPONENT_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
CASE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$")


def make_case_id(component: str, case: str) -> str:
    if not COMPONENT_RE.match(component):
        raise CaseSpecError(f"invalid component name {component!r}: use dotted lowercase words")
    if not CASE_RE.match(case):
        raise CaseSpecError(f"invalid case name {case!r} in {component}: use letters, digits, '-', '_', '.', '='")
    return f"{component}/{case}"


def split_case_id(case_id: str) -> tuple[str, str]:
    component, sep, case = case_id.partition("/")
    if not sep:
        raise CaseSpecError(f"case id {case_id!r} has no '/': expected <component>/<case>")
    return component, case


def check_case_id(case_id: str) -> tuple[str, str]:
    """(component, case) of a well-formed id; CaseSpecError for anything else (an id names a file
    under the golden store, so `..`, extra slashes and the like never get that far)."""
    if not isinstance(case_id, str):
        raise CaseSpecError(f"case id {case_id!r} is not a string")
    component, case = split_case_id(case_id)
    if not COMPONENT_RE.match(component) or not CASE_RE.match(case) or case in (".", ".."):
        raise CaseSpecError(
            f"invalid case id {case_id!r}: expected <component>/<case> with a dotted lowercase "
            "component and a case of letters, digits, '-', '_', '.', '='"
        )
    return component, case


def parse_select(select: str | Iterable[str] | None) -> list[str]:
    """Split a comma separated selection into patterns; empty means everything."""
    if select is None:
        return []
    items = [select] if isinstance(select, str) else list(select)
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def matches(case_id: str, patterns: list[str]) -> bool:
    if not patterns:
        return True
    component, _ = split_case_id(case_id)
    for pattern in patterns:
        if fnmatch.fnmatchcase(case_id, pattern):
            return True
        if "/" not in pattern and fnmatch.fnmatchcase(component, pattern):
            return True
    return False


def may_select(component: str, patterns: list[str]) -> bool:
    """Whether some case of `component` could match `patterns` (False only when none can). An id
    has one `/`: a pattern's part before its first `/` (its whole, without one) must match the
    component, so its characters before the first wildcard must begin it; without a `*` (and with a
    `/`) each of its characters matches one of the component's."""
    if not patterns:
        return True
    for pattern in patterns:
        head, sep, _ = pattern.partition("/")
        wild = next((i for i, c in enumerate(head) if c in "*?["), None)
        if wild is None or (sep and "*" not in head):
            if fnmatch.fnmatchcase(component, head):
                return True
        elif component.startswith(head[:wild]):
            return True
    return False
