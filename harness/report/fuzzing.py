"""The fuzz section of the reports (results.json `fuzz`, harness/fuzz.py): what was tried, what
failed, the smallest failing case as a case-file entry and the command that re-creates it."""

from __future__ import annotations

from html import escape

from .text import clean


def _heading(fuzz: dict) -> str:
    size = (
        f"{fuzz['cases_requested']} case(s)" if fuzz.get("cases_requested") else f"a budget of {fuzz['budget_s']:g} s"
    )
    tried = sum(c["tried"] for c in fuzz["components"].values())
    failed = sum(c["failed"] for c in fuzz["components"].values())
    return f"fuzz seed {fuzz['seed']}, {size}: {tried} case(s) tried, {failed} failed"


def render_fuzz_text(doc: dict) -> str:
    fuzz = doc.get("fuzz")
    if not fuzz:
        return ""
    lines = [_heading(fuzz), f"{'component':<22} {'tried':>6} {'failed':>6} {'cases/s':>8}"]
    for name, c in fuzz["components"].items():
        rate = f"{c['cases_per_s']:.1f}" if c["cases_per_s"] else "."
        lines.append(
            f"{name:<22} {c['tried']:>6} {c['failed'] or '.':>6} {rate:>8}"
            + (f"  ({c['invalid']} invalid draws)" if c["invalid"] else "")
        )
    for failure in fuzz["failures"]:
        shrunk = failure["shrunk"]
        lines += [
            "",
            f"FAILED {failure['id']} ({failure['status']}): {clean(failure['why'], 300)}",
            f"  re-create: {failure['command']}",
            f"  shrunk in {shrunk['steps']} step(s) ({shrunk['attempts']} tried) to {shrunk['id']}: "
            f"{clean(shrunk['why'], 300)}",
            "  as a case (add to cases/, or run with --promote):",
        ]
        lines += ["    " + line for line in shrunk["entry"].rstrip().splitlines()]
        if failure.get("promoted"):
            promoted = failure["promoted"]
            if promoted.startswith("not promoted"):
                lines.append(f"  {promoted}")
            else:
                lines.append(
                    f"  promoted: {promoted}; reproduce with: conformance run --impl {doc['impl']} "
                    f"--select {promoted.split(', ')[0]}"
                )
    return "\n".join(lines) + "\n"


def render_fuzz_markdown(doc: dict) -> str:
    fuzz = doc["fuzz"]
    lines = [f"### {_heading(fuzz)}", "", "| component | tried | failed | cases/s |", "|---|---:|---:|---:|"]
    for name, c in fuzz["components"].items():
        lines.append(f"| `{name}` | {c['tried']} | {c['failed'] or '·'} | {c['cases_per_s'] or '·'} |")
    for failure in fuzz["failures"][:10]:
        lines += [
            "",
            f"**{failure['status']}** `{failure['id']}`: {clean(failure['why'], 300)}",
            "",
            f"re-create: `{failure['command']}`; shrunk to:",
            "",
            "```yaml",
            failure["shrunk"]["entry"].rstrip(),
            "```",
        ]
    return "\n".join(lines) + "\n"


def render_fuzz_html(doc: dict) -> str:
    fuzz = doc["fuzz"]
    rows = "".join(
        f"<tr><td>{escape(n)}</td><td>{c['tried']}</td><td>{c['failed'] or '·'}</td>"
        f"<td>{c['cases_per_s'] or '·'}</td></tr>"
        for n, c in fuzz["components"].items()
    )
    out = [
        f"<section id='fuzz'><h2>{escape(_heading(fuzz))}</h2><table><tr><th>component</th><th>tried</th>"
        f"<th>failed</th><th>cases/s</th></tr>{rows}</table>"
    ]
    for failure in fuzz["failures"]:
        out.append(
            f"<h3>{escape(failure['status'])} {escape(failure['id'])}</h3><p>{escape(clean(failure['why'], 600))}</p>"
            f"<p>re-create: <code>{escape(failure['command'])}</code></p><p>shrunk to:</p>"
            f"<pre>{escape(failure['shrunk']['entry'])}</pre>"
        )
    out.append("</section>")
    return "\n".join(out)
