"""The per-component terminal table."""

from __future__ import annotations

COLUMNS = ("pass", "fail", "error", "crash", "timeout", "unsupported", "xfail", "xpass")
SHORT = {"unsupported": "unsup"}


def render_table(doc: dict, failures: int = 5) -> str:
    head = ["component", "verdict", "cases"] + [SHORT.get(c, c) for c in COLUMNS] + ["ties"]
    rows = []
    for name, entry in doc["components"].items():
        rows.append([name, entry["verdict"].upper(), str(entry["cases"])] + [str(entry.get(c, 0) or "") or "." for c in COLUMNS]
                    + [str(entry.get("tie_rows") or ".")])
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
    tied = [c for c in doc["cases"] if c.get("tie_rows")]
    if tied:
        lines.append("")
        lines.append(f"{sum(c['tie_rows'] for c in tied)} row(s) in {len(tied)} case(s) differ only in tie order; e.g. {tied[0]['id']}:")
        example = (tied[0].get("tie_example") or tied[0].get("message") or "").strip().splitlines()
        lines += [f"      {line}" for line in example[:6]]
    for problem in doc.get("problems", []):
        lines.append(f"PROBLEM: {problem}")
    for stale in doc.get("stale_expectations", []):
        lines.append(f"note: expectation matched no case: {stale}")
    return "\n".join(lines) + "\n"
