"""Making any text an implementation produced safe to show: every report stays valid and small.

Messages can carry what an implementation printed (ANSI colour codes from a C program's stderr,
NUL bytes, megabytes of logs). Terminals, Markdown, HTML and XML each get a clean, bounded copy.
"""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
# Characters XML 1.0 forbids (and lone surrogates); tab, newline and carriage return are allowed.
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean(text: str, limit: int | None = None) -> str:
    """ANSI escapes and control characters removed; at most `limit` characters (noted)."""
    text = CONTROL.sub("", ANSI.sub("", str(text)))
    text = NOT_XML.sub("\ufffd", text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + f" [... {len(text) - limit} more characters in results.json]"
    return text


def first_line(text: str, limit: int = 300) -> str:
    lines = clean(text).strip().splitlines()
    return clean(lines[0], limit) if lines else ""


def failing_lines(case: dict, most: int = 8) -> list[str]:
    """A failed case in a few lines: the first line of every failing output (up to `most`), or of
    the message when no output is to blame; an xpass says which expectation it contradicts."""
    if case["status"] == "xpass":
        return [first_line(case.get("expectation") or "passed, but an expectation said it fails")]
    message = clean(case.get("message") or "")
    lines = message.splitlines()
    heads = [line.strip() for line in lines if line.startswith("first divergent ")]
    heads += [line.strip() for line in lines if line.startswith("diagnosis")]  # the likely cause, early
    heads += [line.strip() for line in lines if line.startswith("output '")]
    hint = next((line.strip() for line in message.splitlines() if line.startswith("  to settle it: ")), "")
    if hint and heads:  # the first failure's hint: what to return so the harness can attribute it
        at = next((i for i, h in enumerate(heads) if h.startswith("output '")), len(heads))
        heads.insert(at + 1, hint)
    failing = [n for n, m in (case.get("outputs") or {}).items() if not m.get("ok")]
    if not heads:
        lines = message.strip().splitlines()
        return [clean(line, 300) for line in lines[:4]]
    shown = [clean(h, 300) for h in heads[:most]]
    if len(failing) > most:
        shown.append(f"... and {len(failing) - most} more failing output(s) (report.html lists them all)")
    return shown
