"""Renderers: each reads a results document (see `harness.session`) and writes one format."""

from __future__ import annotations

import json
from pathlib import Path

from .html import render_html
from .junit import render_junit
from .markdown import render_summary
from .table import render_table

__all__ = ["render_table", "render_summary", "render_junit", "render_html", "write_reports", "read_results"]


def write_reports(doc: dict, report_dir: Path) -> None:
    """Every format, each file replaced atomically (a reader never sees half a report)."""
    from ..golden import write_atomic

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("results.json", json.dumps(doc, indent=1) + "\n"), ("summary.md", render_summary(doc)),
                       ("junit.xml", render_junit(doc)), ("report.html", render_html(doc))):
        write_atomic(report_dir / name, text.encode("utf-8"))


def read_results(report_dir: Path) -> dict:
    from ..errors import UsageError

    path = Path(report_dir) / "results.json"
    if not path.exists():
        raise UsageError(f"{path} not found: run `conformance run --report-dir {report_dir}` first")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from None
