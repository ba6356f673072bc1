"""The per-component terminal table, then what did not pass and what was accepted."""

from __future__ import annotations

from ..differences import DIFFERENCES
from .header import children_line, override_lines, verdict
from .text import EVIDENCE, clean, failing_lines, kinds_first, kinds_line

COLUMNS = ("pass", "partial", "fail", "error", "crash", "timeout", "unsupported", "xfail", "xpass", "not_run")
SHORT = {"unsupported": "unsup", "not_run": "not run"}
BAD = ("fail", "error", "crash", "timeout", "xpass")


def render_table(doc: dict, failures: int = 5) -> str:
    head = ["component", "verdict", "cases"] + [SHORT.get(c, c) for c in COLUMNS] + [d.column for d in DIFFERENCES]
    rows = []
    for name, entry in doc["components"].items():
        rows.append(
            [name, entry["verdict"].upper(), str(entry["cases"])]
            + [str(entry.get(c, 0) or "") or "." for c in COLUMNS]
            + [str(entry.get(d.count) or ".") for d in DIFFERENCES]
        )
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines = [f"impl {doc['impl']} ({doc['impl_kind']}, device {doc['device']}): {verdict(doc)}"]
    if children_line(doc):
        lines.append(clean(children_line(doc)))
    changed = override_lines(doc)
    if changed:
        lines.append(f"configuration changes {len(changed)} packaged default(s):")
        lines += [f"  {clean(line)}" for line in changed]
    lines += [fmt(head), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in rows]
    bad, kinds = kinds_first([c for c in doc["cases"] if c["status"] in BAD])
    if bad:
        shown = bad[: max(failures, len(kinds))]  # at least one of each kind
        lines.append("")
        lines.append(
            f"{len(bad)} case(s) did not pass: {kinds_line(kinds)}"
            + ("; one of each kind first:" if len(bad) > len(shown) else ":")
        )
        for case in shown:
            lines.append(f"  {case['status'].upper()} {case['id']}")
            lines += [f"      {line}" for line in failing_lines(case, evidence=EVIDENCE)]
            lines.append(f"      re-run: {case.get('repro', '')}")
        if len(bad) > len(shown):
            lines.append(f"  ... and {len(bad) - len(shown)} more (results.json and report.html hold them all)")
    for d in DIFFERENCES:
        shown = [c for c in doc["cases"] if c.get(d.count)]
        if shown:
            lines.append("")
            lines.append(f"{sum(c[d.count] for c in shown)} {d.what} in {len(shown)} case(s); e.g. {shown[0]['id']}:")
            example = clean(shown[0].get(d.example) or shown[0].get("message") or "").strip().splitlines()
            lines += [f"      {line}" for line in example[:8]]
    partial = [c for c in doc["cases"] if c["status"] == "partial"]
    if partial:
        lines.append("")
        lines.append(
            f"{len(partial)} case(s) partial: every output judged passes, the implementation declined "
            f"{sorted({n for c in partial for n in c.get('declined') or ()})}; e.g. {partial[0]['id']}"
        )
    if doc.get("stopped"):
        lines.append("")
        lines.append(
            f"STOPPED: {doc['stopped']}; {doc.get('not_run', 0)} case(s) not run (they count for nothing, "
            "neither pass nor fail)"
        )
    for problem in doc.get("problems", []):
        lines.append(f"PROBLEM: {clean(problem)}")
    for named in doc.get("run_diagnosis") or []:
        lines.append(run_level_line(named))
    for stale in doc.get("stale_expectations", []):
        lines.append(f"note: expectation matched no case: {clean(stale)}")
    return "\n".join(lines) + "\n"


def run_level_line(named: dict) -> str:
    """A tie order the run named from several cases' evidence together (diagnosis/across_cases.py)."""
    return (
        f"diagnosis across {len(named['cases'])} cases: [{named['variant']}] {named['summary']} "
        f"({named['bits']:.3g} bits over {named['rows']} distinct tied rows; each case says so)"
    )
