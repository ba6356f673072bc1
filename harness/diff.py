"""`conformance diff BASE NEW`: what changed between two runs, case by case. Pure; no I/O.

A case is the same case in both runs when its id and its golden's SHA-256 agree. Then:

- regressed: it passed (pass or xfail) and now fails, errors, crashes, times out or xpasses;
- fixed: it did not pass and now passes;
- still failing: it did not pass either time (its status may have changed, fail -> crash);
- unjudged: it passed and is now unsupported or not run (nothing was learnt about it this time).

A case only NEW has is `new`; one only BASE has is `gone`; one whose golden changed
(`conformance generate` rewrote it) is `golden_changed` and judged as a new case: a difference
there says the reference moved, not that the implementation did. A component that met its case
floor and now misses it is a component regression.

Headroom: per component and output, the largest fraction of each tolerance bound used over the
cases both runs judged against the same golden, before and after (harness/report/headroom.py).
"""

from __future__ import annotations

from typing import Any

from .report.headroom import BOUNDS, per_case
from .store import describe, same_store
from .report.text import failing_lines

DIFF_SCHEMA = 1
PASSED = ("pass", "partial", "xfail")
UNJUDGED = ("unsupported", "not_run")
KINDS = ("regressed", "fixed", "golden_changed", "new", "gone", "still_failing", "unjudged")
GATES = ("regressions", "new-failures", "any")
MOVE = 0.05  # headroom moves smaller than this (in fractions of the bound) are not listed


def diff_results(base: dict, new: dict, base_label: str = "base", new_label: str = "new") -> dict:
    """The difference document; `exit_code` for every gate is in `gates`."""
    before = {c["id"]: c for c in base["cases"]}
    after = {c["id"]: c for c in new["cases"]}
    changes: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    moves: list[dict] = []
    for case_id in sorted(set(before) | set(after)):
        b, a = before.get(case_id), after.get(case_id)
        kind = _kind(b, a)
        if kind:
            changes[kind].append(_entry(case_id, b, a))
        if b is not None and a is not None and kind != "golden_changed":
            moves += _moves(case_id, b, a)
    components = _components(base, new, changes, moves)
    regressed_components = sorted(n for n, c in components.items() if c["floor_ok"] == [True, False])
    new_failures = [e for e in changes["new"] + changes["golden_changed"] if _bad(e["after"])]
    still = changes["still_failing"]
    gates = {
        "regressions": int(bool(changes["regressed"] or regressed_components)),
        "new-failures": int(bool(changes["regressed"] or regressed_components or new_failures)),
        "any": int(bool(new.get("exit_code"))),
    }
    return {
        "schema": DIFF_SCHEMA,
        "runs": {"base": _run_of(base, base_label), "new": _run_of(new, new_label)},
        "stores": compare_stores(base, new),
        **changes,
        "component_regressions": regressed_components,
        "new_failures": len(new_failures),
        "still_failing_count": len(still),
        "headroom": sorted(moves, key=lambda m: -abs(m["after"] - m["before"])),
        "components": components,
        "gates": gates,
    }


def compare_stores(base: dict, new: dict) -> dict:
    """Whether the two runs judged the same golden store, and a sentence saying so when they did not."""
    a, b = base.get("store"), new.get("store")
    same = same_store(a, b)
    note = (
        ""
        if same
        else (
            f"the runs judged different golden stores: base {describe(a)}, new {describe(b)}; "
            "a case whose golden changed is judged as new, and a difference may be the store's"
        )
    )
    return {"same": same, "base": a, "new": b, "note": note}


def _bad(status: str | None) -> bool:
    return status is not None and status not in PASSED and status not in UNJUDGED


def _kind(b: dict | None, a: dict | None) -> str:
    if b is None:
        return "new"
    if a is None:
        return "gone"
    if b.get("golden_sha256") and a.get("golden_sha256") and b["golden_sha256"] != a["golden_sha256"]:
        return "golden_changed"
    was, now = b["status"], a["status"]
    if was in PASSED and _bad(now):
        return "regressed"
    if _bad(was) and now in PASSED:
        return "fixed"
    if _bad(was) and _bad(now):
        return "still_failing"
    if was in PASSED and now in UNJUDGED:
        return "unjudged"
    return ""


def _entry(case_id: str, b: dict | None, a: dict | None) -> dict:
    some = a or b
    assert some is not None  # the case is in one run at least
    entry: dict[str, Any] = {
        "id": case_id,
        "component": some["component"],
        "before": b["status"] if b else None,
        "after": a["status"] if a else None,
    }
    if a is not None and _bad(a["status"]):
        entry["why"] = "; ".join(failing_lines(a, most=2))
    if b is not None and a is not None and b.get("golden_sha256") != a.get("golden_sha256"):
        entry["golden"] = [b.get("golden_sha256", "")[:12], a.get("golden_sha256", "")[:12]]
    return entry


def _moves(case_id: str, b: dict, a: dict) -> list[dict]:
    was, now = per_case(b), per_case(a)
    out = []
    for (group, bound), value in now.items():
        if (group, bound) in was:
            out.append(
                {
                    "id": case_id,
                    "component": a["component"],
                    "output": group,
                    "bound": bound,
                    "before": was[(group, bound)],
                    "after": value,
                }
            )
    return out


def _components(base: dict, new: dict, changes: dict[str, list[dict]], moves: list[dict]) -> dict[str, dict]:
    names = sorted(set(base.get("components", {})) | set(new.get("components", {})))
    out: dict[str, dict] = {}
    for name in names:
        entry: dict[str, Any] = {kind: sum(1 for e in changes[kind] if e["component"] == name) for kind in KINDS}
        for key in ("verdict", "floor_ok"):
            entry[key] = [doc.get("components", {}).get(name, {}).get(key) for doc in (base, new)]
        worst: dict[tuple[str, str], list[float]] = {}
        for m in moves:
            if m["component"] != name:
                continue
            pair = worst.setdefault((m["output"], m["bound"]), [0.0, 0.0])
            pair[0], pair[1] = max(pair[0], m["before"]), max(pair[1], m["after"])
        entry["headroom"] = [
            {"output": o, "bound": b, "before": v[0], "after": v[1]} for (o, b), v in sorted(worst.items())
        ]
        out[name] = entry
    return out


def _run_of(doc: dict, label: str) -> dict:
    return {
        "label": label,
        "impl": doc.get("impl"),
        "started": doc.get("started"),
        "cases": len(doc.get("cases", [])),
        "exit_code": doc.get("exit_code"),
        "goldens": (doc.get("goldens") or {}).get("manifest_sha256"),
    }


def headroom_line(move: dict, arrow: str = "->") -> str:
    """`out rel L2 0.31 -> 0.74 of the bound`."""
    return (
        f"{move['output']} {BOUNDS.get(move['bound'], move['bound'])} {move['before']:.2f} {arrow} "
        f"{move['after']:.2f} of the bound"
    )


def component_moves(entry: dict, least: float = MOVE) -> list[dict]:
    """A component's headroom moves worth showing (at least `least` of the bound either way)."""
    return [h for h in entry["headroom"] if abs(h["after"] - h["before"]) >= least]
