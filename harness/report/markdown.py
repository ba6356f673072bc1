"""`summary.md`: small and GitHub job-summary friendly (well under the 1 MiB cap)."""

from __future__ import annotations

from ..differences import DIFFERENCES
from .header import children_line, override_lines, verdict
from .table import BAD, COLUMNS, run_level_line
from .text import clean, failing_lines, kinds_first, kinds_line

MAX_FAILURES = 20
LIMIT = 64 * 1024  # bytes; GitHub refuses step summaries over 1 MiB (all steps' together)


def _cell(text: str, limit: int = 300) -> str:
    return clean(text, limit).replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def render_summary(doc: dict) -> str:
    lines = [
        f"## Conformance: `{_cell(doc['impl'])}` — {verdict(doc)}",
        "",
        f"device `{doc['device']}` · torch {doc['versions']['torch']} · harness {doc['versions']['harness']} · "
        f"{len(doc['cases'])} case(s) in {doc['duration_s']} s",
        "",
    ]
    if children_line(doc):
        lines += [_cell(children_line(doc)), ""]
    if doc.get("stopped"):
        lines += [f"**stopped**: {_cell(doc['stopped'])}; {doc.get('not_run', 0)} case(s) not run", ""]
    changed = override_lines(doc)
    if changed:
        lines += [f"configuration changes {len(changed)} packaged default(s):", ""]
        lines += [f"- `{_cell(line)}`" for line in changed] + [""]
    lines += [
        "| component | verdict | cases | " + " | ".join(COLUMNS + tuple(d.label for d in DIFFERENCES)) + " |",
        "|---|---|---:|" + "---:|" * (len(COLUMNS) + len(DIFFERENCES)),
    ]
    for name, e in doc["components"].items():
        cells = [str(e.get(c) or "·") for c in COLUMNS] + [str(e.get(d.count) or "·") for d in DIFFERENCES]
        lines.append(f"| `{name}` | {e['verdict']} | {e['cases']} | " + " | ".join(cells) + " |")
    if doc.get("merged_from"):
        floors = (
            "enforced on the union" if doc.get("floors_enforced") else "not enforced (not the shards of one full run)"
        )
        lines += ["", f"merged from {len(doc['merged_from'])} part(s); case floors {floors}"]
    if doc.get("fuzz"):
        from .fuzzing import render_fuzz_markdown

        lines += ["", render_fuzz_markdown(doc).rstrip()]
    if doc.get("baseline"):
        from .changes import render_diff_markdown

        lines += ["", render_diff_markdown(doc["baseline"], shown=MAX_FAILURES).rstrip()]
    bad, kinds = kinds_first([c for c in doc["cases"] if c["status"] in BAD])
    if bad:
        lines += ["", f"### {len(bad)} case(s) did not pass: {kinds_line(kinds)}", ""]
        for case in bad[:MAX_FAILURES]:
            first = failing_lines(case, most=3)
            lines.append(f"- **{case['status']}** `{case['id']}`: {_cell('; '.join(first), 600)}")
        if len(bad) > MAX_FAILURES:
            lines.append(f"- … and {len(bad) - MAX_FAILURES} more (see report.html)")
    for problem in doc.get("problems", [])[:MAX_FAILURES]:
        lines.append(f"- **problem**: {_cell(problem)}")
    for named in doc.get("run_diagnosis") or []:
        lines.append(f"- **{_cell(run_level_line(named))}**")
    return bounded("\n".join(lines) + "\n")


def bounded(text: str, limit: int = LIMIT) -> str:
    """At most `limit` bytes of UTF-8, cut at a line, saying where the rest is."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    cut = data[: limit - 200].decode("utf-8", "ignore").rsplit("\n", 1)[0]
    return cut + "\n\n… the summary was cut at 64 KiB; report.html and results.json hold everything\n"
