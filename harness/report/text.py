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
    if limit is not None and len(text) > limit + SLACK:  # a short overshoot is shown rather than cut
        cut = text.rfind(" ", limit - SLACK, limit)  # at a word, where there is one near the limit
        cut = cut if cut > 0 else limit
        text = text[:cut] + f" [... {len(text) - cut} more characters in results.json]"
    return text


SLACK = 40  # characters: about the length of the note that says how many more there are


def first_line(text: str, limit: int = 300) -> str:
    lines = clean(text).strip().splitlines()
    return clean(lines[0], limit) if lines else ""


EVIDENCE = 8  # lines of the first failing output's evidence the terminal shows


def failing_lines(case: dict, most: int = 8, evidence: int = 0) -> list[str]:
    """A case that did not pass in a few lines, in the order its message leads with: the first
    divergent step and stage; the first failing output with up to `evidence` lines of its evidence
    (the worst element with its index and values, the table of differing ids or rows) and what to
    return to settle it; the chain; the diagnosis; then the first line of the other failing outputs
    (`most` outputs in all). The message's first lines when no output is to blame; an xpass says
    which expectation it contradicts."""
    if case["status"] == "xpass":
        return [first_line(case.get("expectation") or "passed, but an expectation said it fails")]
    message = clean(case.get("message") or "")
    sections = _sections(message.splitlines())
    outputs = [body for head, body in sections if head == "output"]
    if not outputs:
        return [clean(line, 300) for line in _unjudged(message.strip().splitlines())]
    first, *others = outputs
    settle = [line for line in first[1:] if line.startswith("  to settle it: ")]
    shown = [line for head, body in sections if head == "head" for line in body]
    shown += first[:1] + [line for line in first[1:] if line not in settle][:evidence] + settle
    shown += [line for head, body in sections if head in ("chain", "diagnosis") for line in body]
    shown += [body[0] for body in others[: max(most - 1, 0)]]
    shown = [clean(line.rstrip(), 300) for line in shown]
    failing = sum(1 for m in (case.get("outputs") or {}).values() if m.get("ok") is False)
    if failing > most:
        shown.append(f"... and {failing - most} more failing output(s) (report.html lists them all)")
    return shown


TRACEBACK = "Traceback of the implementation"
PRINTED = "--- the implementation printed"


def _unjudged(lines: list[str]) -> list[str]:
    """A message no output is to blame for (an exception, a crash, a timeout): its first lines, the
    innermost frame of the implementation's traceback, and the last lines it printed."""
    head = next((i for i, line in enumerate(lines) if line.startswith((TRACEBACK, PRINTED))), len(lines))
    shown = lines[: min(head, 3)]
    for start, keep in ((TRACEBACK, 2), (PRINTED, 3)):
        at = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
        if at is None:
            continue
        block = lines[at + 1 :]
        end = (
            next((i for i, line in enumerate(block) if line.startswith(PRINTED)), len(block))
            if start == TRACEBACK
            else len(block)
        )
        shown += [lines[at]] + block[:end][-keep:]
    return shown


# How a message's lines begin: the sections failing_lines picks from (anything else is "other").
SECTION_STARTS = (
    ("first divergent ", "head"),
    ("output '", "output"),
    ("chain at ", "chain"),
    ("diagnosis", "diagnosis"),
)


def _sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The message cut into sections, each a line that starts one (SECTION_STARTS) with the
    indented lines under it."""
    sections: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith(" ") and sections:
            sections[-1][1].append(line)
            continue
        kind = next((k for start, k in SECTION_STARTS if line.startswith(start)), "other")
        sections.append((kind, [line]))
    return sections


def kind_of(case: dict) -> str:
    """What kind of problem a case that did not pass has: an error's kind (dtype error, shape error,
    exception, ...), a failed comparison's first divergent output ("failure at out"), or its status."""
    status = case["status"]
    if status == "error":
        return case.get("kind") or "error"
    if status == "fail":
        from .headroom import output_group

        first = case.get("first_divergent_stage") or next(
            (n for n, m in (case.get("outputs") or {}).items() if m.get("ok") is False), ""
        )
        return f"failure at {output_group(first)}" if first else "failure"
    return {"xpass": "unexpected pass"}.get(status, status)


def plural(kind: str, count: int) -> str:
    """`5 dtype errors`, `1 timeout`, `2 failures at out`, `3 crashes`."""
    if count == 1:
        return f"1 {kind}"
    noun, at, where = kind.partition(" at ")
    words = noun.split(" ")
    last = words[-1]
    words[-1] = last + ("es" if last.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{count} {' '.join(words)}{at}{where}"


def kinds_first(cases: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """The cases with the first of each kind ahead of the repeats, and how many there are of each
    kind (most first): a summary that shows a few cases shows every kind."""
    counts: dict[str, int] = {}
    first: list[dict] = []
    repeats: list[dict] = []
    for case in cases:
        kind = kind_of(case)
        (repeats if kind in counts else first).append(case)
        counts[kind] = counts.get(kind, 0) + 1
    return first + repeats, dict(sorted(counts.items(), key=lambda kv: -kv[1]))  # stable among equals


def kinds_line(counts: dict[str, int]) -> str:
    """ "5 dtype errors, 1 timeout, 1 exception"."""
    return ", ".join(plural(kind, n) for kind, n in counts.items())
