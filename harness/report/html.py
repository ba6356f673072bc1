"""`report.html`: one self-contained file, a section per component, failures first.

Every text that came from an implementation, a golden or a path is escaped.
"""

from __future__ import annotations

from html import escape

from ..differences import DIFFERENCES
from .header import override_lines, verdict
from .headroom import worst_per_output
from .pictures import headroom_bars, step_strip, ulps_histogram
from .table import COLUMNS
from .text import clean, failing_lines

PRE_CHARS = 20000  # per message block; results.json keeps everything

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.pass{color:#060}.fail,.error,.crash,.timeout,.xpass{color:#b00;font-weight:bold}
.unsupported,.xfail,.not_run{color:#666}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:90%}
details{margin:4px 0}section{margin-top:2em}td.zero{color:#bbb}svg{display:block;margin:6px 0}
.pictures{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}"""
HISTOGRAMS = 6  # per case; the rest are named
ORDER = {
    "fail": 0,
    "error": 0,
    "crash": 0,
    "timeout": 0,
    "xpass": 0,
    "xfail": 1,
    "partial": 1,
    "not_run": 2,
    "unsupported": 2,
    "pass": 3,
}


def render_html(doc: dict) -> str:
    word = verdict(doc)
    css = "pass" if word == "PASS" else "fail"
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Conformance {escape(doc['impl'])}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Conformance of <code>{escape(doc['impl'])}</code>: <span class='{css}'>{word}</span></h1>",
        f"<p>device {escape(doc['device'])} · torch {escape(doc['versions']['torch'])} · harness "
        f"{escape(doc['versions']['harness'])} · {len(doc['cases'])} cases · {doc['duration_s']} s</p>",
    ]
    for problem in doc.get("problems", []):
        out.append(f"<p class='fail'>Problem: {escape(clean(problem))}</p>")
    if doc.get("stopped"):
        out.append(f"<p class='fail'>Stopped: {escape(doc['stopped'])}; {doc.get('not_run', 0)} case(s) not run</p>")
    changed = override_lines(doc)
    if changed:
        out.append(
            f"<p>configuration changes {len(changed)} packaged default(s):</p><ul class='overrides'>"
            + "".join(f"<li><code>{escape(clean(line))}</code></li>" for line in changed)
            + "</ul>"
        )
    if doc.get("merged_from"):
        parts = ", ".join(
            f"{escape(str(p['from']))}" + (f" (shard {p['shard'][0]}/{p['shard'][1]})" if p.get("shard") else "")
            for p in doc["merged_from"]
        )
        floors = "case floors enforced on the union" if doc.get("floors_enforced") else "case floors not enforced"
        out.append(f"<p>merged from {len(doc['merged_from'])} part(s): {parts}; {floors}</p>")
    out.append(
        "<table><tr><th>component</th><th>verdict</th><th>cases</th>"
        + "".join(f"<th>{c}</th>" for c in COLUMNS)
        + "".join(f"<th>{d.label}</th>" for d in DIFFERENCES)
        + "</tr>"
    )
    comps = sorted(doc["components"].items(), key=lambda kv: (kv[1]["verdict"] != "fail", kv[0]))
    for name, e in comps:
        out.append(
            f"<tr><td><a href='#{escape(name)}'>{escape(name)}</a></td><td class='{e['verdict']}'>{e['verdict']}</td>"
            f"<td>{e['cases']}</td>"
            + "".join(_count(e.get(c, 0)) for c in COLUMNS)
            + "".join(_count(e.get(d.count, 0)) for d in DIFFERENCES)
            + "</tr>"
        )
    out.append("</table>")
    if doc.get("fuzz"):
        from .fuzzing import render_fuzz_html

        out.append(render_fuzz_html(doc))
    if doc.get("baseline"):
        from .changes import render_diff_html

        out.append(render_diff_html(doc["baseline"]))
    by_component: dict[str, list[dict]] = {}
    for case in doc["cases"]:
        by_component.setdefault(case["component"], []).append(case)
    for name, _ in comps:
        cases = sorted(by_component.get(name, []), key=lambda c: (ORDER.get(c["status"], 0), c["id"]))
        out.append(f"<section id='{escape(name)}'><h2>{escape(name)}</h2>")
        bars = headroom_bars(name, worst_per_output(cases))
        if bars:
            out.append("<p>worst case per output, as a fraction of its tolerance:</p>" + bars)
        for case in cases:
            status = case["status"]
            open_attr = " open" if ORDER.get(status, 0) == 0 else ""
            out.append(
                f"<details{open_attr}><summary><span class='{status}'>{status}</span> {escape(case['id'])}</summary>"
            )
            if case.get("params"):
                shown = ", ".join(f"{k}={v}" for k, v in case["params"].items())
                out.append(f"<p>params: <code>{escape(shown[:600])}</code></p>")
            out += _case_pictures(case)
            if case.get("message"):
                out.append(_message(case["message"]))
            for d in DIFFERENCES:
                if case.get(d.example) and case["status"] == "pass":
                    out.append(
                        f"<p>{case.get(d.count, 0)} {escape(d.what)} (accepted):</p>"
                        f"<pre>{escape(clean(case[d.example], PRE_CHARS))}</pre>"
                    )
            if case.get("output") and case["status"] not in ("crash", "error", "fail", "timeout"):
                out.append(f"<p>the implementation printed (tail):</p><pre>{escape(clean(case['output']))}</pre>")
            if case.get("expectation"):
                out.append(f"<p>{escape(case['expectation'])}</p>")
            if case.get("outputs"):
                out.append("<table><tr><th>output</th><th>ok</th><th>policy</th><th>metrics</th></tr>")
                for out_name, m in case["outputs"].items():
                    metrics = ", ".join(
                        f"{k}={_num(v)}"
                        for k, v in m.items()
                        if k not in ("ok", "policy", "note") and isinstance(v, (int, float, str))
                    )
                    out.append(
                        f"<tr><td>{escape(out_name)}</td><td>{_verdict(m.get('ok'))}</td>"
                        f"<td>{escape(str(m.get('policy', '')))}</td><td>{escape(metrics)}</td></tr>"
                    )
                    if m.get("note"):
                        out.append(
                            f"<tr><td></td><td colspan='3'><pre>{escape(clean(m['note'], PRE_CHARS))}</pre></td></tr>"
                        )
                out.append("</table>")
            if case.get("repro"):
                out.append(f"<p>re-run: <code>{escape(case['repro'])}</code></p>")
            out.append("</details>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _message(message: str, open_lines: int = 40) -> str:
    """A short message as it is; a long one folded under its first lines."""
    text = clean(message, PRE_CHARS)
    lines = text.splitlines()
    if len(lines) <= open_lines:
        return f"<pre>{escape(text)}</pre>"
    head = "\n".join(failing_lines({"status": "fail", "message": message}, most=6))
    return (
        f"<pre>{escape(head)}</pre><details><summary>the whole message ({len(lines)} lines)</summary>"
        f"<pre>{escape(text)}</pre></details>"
    )


def _count(value: int) -> str:
    """A count cell: blank-looking dot for zero, so the eye finds the others."""
    return f"<td>{value}</td>" if value else "<td class='zero'>·</td>"


def _verdict(ok: bool | None) -> str:
    """An output's verdict in the case table: a declined output (ok None) neither passed nor failed."""
    return "declined" if ok is None else ("yes" if ok else "no")


def _case_pictures(case: dict) -> list[str]:
    """The step strip of a failing stepped case and the error histograms of its failing outputs."""
    if case["status"] not in ("fail", "xfail"):
        return []
    outputs = case.get("outputs") or {}
    pictures = [step_strip(case["id"], outputs)]
    failing = [(n, m["ulps_histogram"]) for n, m in outputs.items() if m.get("ok") is False and m.get("ulps_histogram")]
    pictures += [f"<div><p>{escape(n)}</p>{ulps_histogram(case['id'], n, h)}</div>" for n, h in failing[:HISTOGRAMS]]
    shown = [p for p in pictures if p]
    if not shown:
        return []
    more = (
        f"<p>and {len(failing) - HISTOGRAMS} more failing output(s) with histograms in results.json</p>"
        if len(failing) > HISTOGRAMS
        else ""
    )
    return [f"<div class='pictures'>{''.join(shown)}</div>{more}"]


def _num(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
