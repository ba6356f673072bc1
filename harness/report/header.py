"""What every report says first: the run's verdict word and the settings its configuration changed."""

from __future__ import annotations


def verdict(doc: dict) -> str:
    """PASS, FAIL, or STOPPED (the run ended before its cases did: SIGINT, SIGTERM, -x)."""
    if doc["exit_code"] == 0:
        return "PASS"
    return "STOPPED" if doc.get("stopped") else "FAIL"


def _shown(value) -> str:
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def override_lines(doc: dict) -> list[str]:
    """One line per tolerance, floor, timeout or switch the configuration changed from the packaged
    defaults: `key: value (packaged: default)`."""
    return [f"{o['key']}: {_shown(o['value'])} (packaged: {_shown(o['default'])})" for o in doc.get("overrides") or ()]


def children_line(doc: dict) -> str:
    """How the run's isolation children started and why (results.json's `children`), '' without it."""
    how = doc.get("children")
    if not how:
        return ""
    if how["start"] == "none":
        return f"children: none ({how['why']})"
    return f"children: {how['start']}, the server {how['server']}: {how['why']}"
