"""Tie-order evidence gathered across a run's cases (docs/diagnosis.md, "Evidence across a run").

A tie order reproduces a tied row by chance, so one case names it only when the rows it decides hold
enough choice (`Variant.evidence` bits). A port whose tie rule differs from torch's fails several cases
that each hold a bit or two: each is rightly left unnamed alone, yet one rule reproducing every tied row
of seven cases could come out so by chance about 1 time in 2^9. So the run sums what its cases gathered
(`Diagnosis.tie_support`: per variant, the digests of the tied rows it reproduces, with their bits) and
names the rule once the sum of distinct rows reaches the same threshold:
- a row read by two cases (a schedule's shared prefix, one layer read twice) has one digest: it counts once;
- one case that contradicts the rule (`Diagnosis.tie_contradicts`) withholds the name for the whole run;
- a single case is named, or not, by itself, as without this.
Pure: it reads and amends the cases' result records (dicts), and returns what it named.
"""

from __future__ import annotations

from .variants import VARIANTS

BY_NAME = {v.name: v for v in VARIANTS}
LINE_START = "diagnosis (run level):"


def name_across_cases(cases: list[dict]) -> list[dict]:
    """Name the tie orders the run's cases support together; each supporting case's record gains
    `diagnosis.run_level` and a line in its message. Returns one entry per named variant."""
    support: dict[str, list[dict]] = {}
    contradicted: dict[str, list[str]] = {}
    for case in cases:
        diagnosis = case.get("diagnosis") or {}
        if diagnosis.pop("run_level", None) is not None:  # named by a part of this run (a shard): again, over all
            lines = (case.get("message") or "").split("\n")
            case["message"] = "\n".join(line for line in lines if not line.startswith(LINE_START))
        for variant in diagnosis.get("tie_support") or {}:
            support.setdefault(variant, []).append(case)
        for variant in diagnosis.get("tie_contradicts") or []:
            contradicted.setdefault(variant, []).append(case["id"])
    named = []
    for variant, backing in sorted(support.items()):
        known = BY_NAME.get(variant)
        if known is None or len(backing) < 2 or variant in contradicted:
            continue
        rows: dict[str, float] = {}
        for case in backing:
            rows.update(case["diagnosis"]["tie_support"][variant])
        bits = sum(rows.values())
        if bits < known.evidence:
            continue
        ids = sorted(case["id"] for case in backing)
        entry = {"variant": variant, "summary": known.summary, "cases": ids, "rows": len(rows), "bits": round(bits, 3)}
        named.append(entry)
        line = (
            f"{LINE_START} matches: {known.summary} [{variant}]; named from {len(ids)} cases of this "
            f"run: {bits:.3g} bits over {len(rows)} distinct tied row(s) (docs/diagnosis.md, \"Evidence across a run\")"
        )
        for case in backing:
            case["diagnosis"]["run_level"] = entry
            case["message"] = f"{case.get('message') or ''}\n{line}".strip("\n")
    return named
