"""Rendering a diff document (harness/diff.py): the terminal, Markdown and an HTML section."""

from __future__ import annotations

from html import escape

from ..diff import KINDS, component_moves, headroom_line
from .text import clean

TITLES = {
    "regressed": "regressed",
    "fixed": "fixed",
    "golden_changed": "golden changed",
    "new": "new",
    "gone": "gone",
    "still_failing": "still failing",
    "unjudged": "not judged now",
}
SHOWN = 20  # cases listed per kind; the JSON keeps them all


def headline(diff: dict, arrow: str = "->") -> str:
    counts = ", ".join(f"{len(diff[k])} {TITLES[k]}" for k in KINDS)
    extra = (
        f"; components below their floor now: {', '.join(diff['component_regressions'])}"
        if diff["component_regressions"]
        else ""
    )
    return f"{_side(diff['runs']['base'])} {arrow} {_side(diff['runs']['new'])}: {counts}{extra}"


def _side(run: dict) -> str:
    return f"{run['impl']} ({run['label']}, {run['cases']} cases)"


ARROW = "→"


def _status(entry: dict, arrow: str = "->") -> str:
    return f"{entry['before'] or '-'} {arrow} {entry['after'] or '-'}"


def store_note(diff: dict) -> str:
    return (diff.get("stores") or {}).get("note", "")


def render_diff_text(diff: dict) -> str:
    lines = [headline(diff)] + ([f"WARNING: {store_note(diff)}"] if store_note(diff) else [])
    head = ["component", *(TITLES[k] for k in KINDS), "verdict"]
    rows = [
        [name, *(str(c[k] or ".") for k in KINDS), _status({"before": c["verdict"][0], "after": c["verdict"][1]})]
        for name, c in diff["components"].items()
    ]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for kind in KINDS:
        if kind == "still_failing" or not diff[kind]:
            continue
        listed, rest = listing(kind, diff[kind])
        lines.append("")
        lines.append(f"{TITLES[kind].upper()} ({len(diff[kind])}{', by component: ' + rest if rest else ''}):")
        for entry in listed:
            lines.append(
                f"  {entry['id']}: {_status(entry)}" + (f"  ({_golden(entry)})" if entry.get("golden") else "")
            )
            if entry.get("why"):
                lines.append(f"      {clean(entry['why'], 300)}")
        if listed and len(diff[kind]) > len(listed):
            lines.append(f"  ... and {len(diff[kind]) - len(listed)} more (--format json lists them all)")
    moves = [(name, m) for name, c in diff["components"].items() for m in component_moves(c)]
    if moves:
        lines.append("")
        lines.append("HEADROOM (worst case per output; the fraction of each bound used, 1.0 = at the bound):")
        lines += [f"  {name} {headroom_line(m)}" for name, m in moves]
    lines.append("")
    lines.append(f"gates: {', '.join(f'{g}={code}' for g, code in diff['gates'].items())}")
    return "\n".join(lines) + "\n"


def listing(kind: str, entries: list[dict], shown: int = SHOWN) -> tuple[list[dict], str]:
    """The entries worth naming one by one, and a count per component for the others. Cases
    that appear, disappear or go unjudged are named only when they fail (a run over another
    selection would otherwise list every case it left out)."""
    if kind not in ("new", "gone", "unjudged"):
        return entries[:shown], ""
    per: dict[str, int] = {}
    for entry in entries:
        per[entry["component"]] = per.get(entry["component"], 0) + 1
    failing = [e for e in entries if e.get("why")]
    return failing[:shown], ", ".join(f"{name} {count}" for name, count in per.items())


def _golden(entry: dict) -> str:
    return f"golden {entry['golden'][0]} -> {entry['golden'][1]}: judged as a new case"


def _md(text: str, limit: int = 300) -> str:
    return clean(text, limit).replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def render_diff_markdown(diff: dict, shown: int = SHOWN) -> str:
    """A section for the job summary: counts, the regressions first, headroom moves."""
    lines = ["### Changes since the baseline", "", _md(headline(diff, ARROW), 2000), ""]
    if store_note(diff):
        lines += [f"> **Warning:** {_md(store_note(diff), 1000)}", ""]
    rows = [
        (n, c)
        for n, c in diff["components"].items()
        if any(c[k] for k in KINDS if k != "still_failing") or component_moves(c) or c["verdict"][0] != c["verdict"][1]
    ]
    if rows:
        lines += [
            "| component | " + " | ".join(TITLES[k] for k in KINDS) + " | verdict | headroom |",
            "|---|" + "---:|" * len(KINDS) + "---|---|",
        ]
        for name, c in rows:
            moves = "; ".join(headroom_line(m, ARROW) for m in component_moves(c)[:4])
            lines.append(
                f"| `{name}` | "
                + " | ".join(str(c[k] or "·") for k in KINDS)
                + f" | {_status({'before': c['verdict'][0], 'after': c['verdict'][1]}, ARROW)} | {_md(moves)} |"
            )
        lines.append("")
    for kind in ("regressed", "golden_changed", "fixed", "new", "gone"):
        entries = diff[kind]
        if not entries:
            continue
        listed, rest = listing(kind, entries, shown)
        lines.append(f"**{TITLES[kind]}** ({len(entries)}{', by component: ' + _md(rest) if rest else ''}):")
        for entry in listed:
            why = f": {_md(entry['why'])}" if entry.get("why") else ""
            lines.append(f"- `{_md(entry['id'], 200)}` {_status(entry, ARROW)}{why}")
        if listed and len(entries) > len(listed):
            lines.append(f"- … and {len(entries) - len(listed)} more")
        lines.append("")
    return "\n".join(lines) + "\n"


def render_diff_html(diff: dict) -> str:
    out = [
        "<section id='changes'><h2>Changes since the baseline</h2>",
        f"<p>{escape(clean(headline(diff, ARROW)))}</p>",
        *([f"<p class='warning'><b>Warning:</b> {escape(store_note(diff))}</p>"] if store_note(diff) else []),
        "<table><tr><th>component</th>"
        + "".join(f"<th>{TITLES[k]}</th>" for k in KINDS)
        + "<th>verdict</th><th>headroom (fraction of the bound used)</th></tr>",
    ]
    for name, c in diff["components"].items():
        cells = "".join(f"<td class='{'zero' if not c[k] else k}'>{c[k] or '·'}</td>" for k in KINDS)
        moves = "<br>".join(escape(headroom_line(m, ARROW)) for m in component_moves(c))
        out.append(
            f"<tr><td>{escape(name)}</td>{cells}<td>{escape(_status({'before': c['verdict'][0], 'after': c['verdict'][1]}, ARROW))}"
            f"</td><td style='text-align:left'>{moves}</td></tr>"
        )
    out.append("</table>")
    for kind in ("regressed", "golden_changed", "fixed", "new", "gone", "unjudged"):
        if diff[kind]:
            listed, rest = listing(kind, diff[kind], 200)
            items = "".join(
                f"<li><code>{escape(e['id'])}</code> {escape(_status(e, ARROW))}"
                + (f": {escape(clean(e['why'], 400))}" if e.get("why") else "")
                + "</li>"
                for e in listed
            )
            more = (
                f"<li>… and {len(diff[kind]) - len(listed)} more</li>"
                if listed and len(diff[kind]) > len(listed)
                else ""
            )
            by = f", by component: {escape(rest)}" if rest else ""
            out.append(f"<h3>{TITLES[kind]} ({len(diff[kind])}{by})</h3><ul>{items}{more}</ul>")
    out.append("</section>")
    return "\n".join(out)
