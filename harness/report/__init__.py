"""Renderers: each reads a results document (see `v41_conformance.session`) and writes one format."""

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
    for name, text in (
        ("results.json", json.dumps(doc, indent=1) + "\n"),
        ("summary.md", render_summary(doc)),
        ("junit.xml", render_junit(doc)),
        ("report.html", render_html(doc)),
    ):
        write_atomic(report_dir / name, text.encode("utf-8"))


def read_results(where: Path) -> dict:
    """The results document of a report dir, or of a results.json given directly."""
    from ..errors import UsageError

    where = Path(where)
    path = where if where.suffix == ".json" or where.is_file() else where / "results.json"
    if not path.exists():
        hint = (
            ""
            if path.name != "results.json" or where.suffix == ".json"
            else f": run `conformance run --report-dir {where}` first"
        )
        raise UsageError(f"{path} not found{hint}")
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("cases"), list)
        or not isinstance(doc.get("components"), dict)
    ):
        raise UsageError(
            f"{path}: not a conformance results document (no 'cases' list or 'components' table); "
            "give a report dir written by `conformance run` or its results.json"
        )
    for i, case in enumerate(doc["cases"]):
        if not isinstance(case, dict) or not all(isinstance(case.get(k), str) for k in ("id", "component", "status")):
            raise UsageError(f"{path}: cases[{i}] lacks an id, component or status; the file is damaged")
    return doc
