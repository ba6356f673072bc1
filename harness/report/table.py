"""The per-component terminal table."""

from __future__ import annotations

from ..differences import DIFFERENCES

COLUMNS = ("pass", "fail", "error", "crash", "timeout", "unsupported", "xfail", "xpass")
SHORT = {"unsupported": "unsup"}


def render_table(doc: dict, failures: int = 5) -> str:
    head = ["component", "verdict", "cases"] + [SHORT.get(c, c) for c in COLUMNS] + [d.column for d in DIFFERENCES]
    rows = []
    for name, entry in doc["components"].items():
        rows.append([name, entry["verdict"].upper(), str(entry["cases"])] + [str(entry.get(c, 0) or "") or "." for c in COLUMNS]
                    + [str(entry.get(d.count) or ".") for d in DIFFERENCES])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines = [f"impl {doc['impl']} ({doc['impl_kind']}, device {doc['device']}): "
             f"{'PASS' if doc['exit_code'] == 0 else 'FAIL'}", fmt(head), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in rows]
    bad = [c for c in doc["cases"] if c["status"] in ("fail", "error", "crash", "timeout", "xpass")]
    if bad:
        lines.append("")
        lines.append(f"{len(bad)} case(s) did not pass" + (f"; first {failures}:" if len(bad) > failures else ":"))
        for case in bad[:failures]:
            first = (case.get("message") or "").strip().splitlines()[:4]
            lines.append(f"  {case['status'].upper()} {case['id']}")
            lines += [f"      {line}" for line in first]
            lines.append(f"      re-run: {case.get('repro', '')}")
    for d in DIFFERENCES:
        shown = [c for c in doc["cases"] if c.get(d.count)]
        if shown:
            lines.append("")
            lines.append(f"{sum(c[d.count] for c in shown)} {d.what} in {len(shown)} case(s); e.g. {shown[0]['id']}:")
            example = (shown[0].get(d.example) or shown[0].get("message") or "").strip().splitlines()
            lines += [f"      {line}" for line in example[:8]]
    for problem in doc.get("problems", []):
        lines.append(f"PROBLEM: {problem}")
    for stale in doc.get("stale_expectations", []):
        lines.append(f"note: expectation matched no case: {stale}")
    return "\n".join(lines) + "\n"
