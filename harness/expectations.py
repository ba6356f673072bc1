"""Per-implementation expectations: case patterns with an expected status and a reason.

In `conformance.yaml`::

    impls:
      mykernel:
        python: mykernel.conformance:Impl
        expectations:            # or: expectations: path/to/expectations.yaml (a list)
          - pattern: "sparse_attn/*"
            status: fail         # fail | error | crash | timeout (anything not passing)
            reason: "tile order differs; tracked in #123"

A case that matches and ends with that status is `xfail`; one that matches and passes is
`xpass` (the entry is stale: remove it; the run fails so nobody forgets). Entries that matched no
case are listed in the report.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .yamlio import safe_load

EXPECTABLE = ("fail", "error", "crash", "timeout")
ENTRY_KEYS = ("pattern", "status", "reason")


@dataclass(frozen=True)
class Expectation:
    pattern: str
    status: str
    reason: str

    def matches(self, case_id: str) -> bool:
        return fnmatch.fnmatchcase(case_id, self.pattern)


def load_expectations(impl_conf: dict[str, Any], root: Path, where: str) -> list[Expectation]:
    raw = impl_conf.get("expectations") or []
    if isinstance(raw, str):
        path = root / raw
        if not path.exists():
            raise UsageError(f"{where}: expectations file {path} not found")
        try:
            raw = safe_load(path.read_text()) or []
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: malformed YAML: {exc}") from None
        where = str(path)
    if not isinstance(raw, list):
        raise UsageError(f"{where}: expectations must be a list of {{pattern, status, reason}}")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not set(ENTRY_KEYS) <= set(entry):
            raise UsageError(f"{where}: expectations[{i}] needs pattern, status and reason")
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise UsageError(f"{where}: expectations[{i}]: unknown key(s) {unknown}; allowed: {', '.join(ENTRY_KEYS)}")
        if entry["status"] not in EXPECTABLE:
            raise UsageError(f"{where}: expectations[{i}].status {entry['status']!r} must be one of {EXPECTABLE}")
        out.append(Expectation(str(entry["pattern"]), entry["status"], str(entry["reason"])))
    return out


def apply_expectations(results: list[dict], expectations: list[Expectation]) -> list[str]:
    """Rewrite statuses in place; return the patterns that matched nothing."""
    used = set()
    for result in results:
        for exp in expectations:
            if not exp.matches(result["id"]):
                continue
            used.add(exp)
            actual = result["status"]
            note = f"expected {exp.status}: {exp.reason}"
            if actual == exp.status:
                result["status"], result["expectation"] = "xfail", note
            elif actual == "pass":
                result["status"], result["expectation"] = "xpass", note + " (but it passed: remove the entry)"
                result["message"] = (
                    f"passed, but conformance.yaml expects {exp.status} ({exp.pattern}: {exp.reason}); "
                    "remove the expectation so a regression is noticed"
                )
            else:
                result["expectation"] = note + f" (but it ended {actual})"
            break
    return [f"{e.pattern} ({e.status}: {e.reason})" for e in expectations if e not in used]
