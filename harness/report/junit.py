"""`junit.xml`: one testsuite per component, one testcase per case (CI test tabs read this)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from .header import override_lines, verdict
from .text import clean

TEXT_CHARS = 8000  # per failing case; the full message stays in results.json
KIND = {"fail": "failure", "xpass": "failure", "error": "error", "crash": "error", "timeout": "error"}


def render_junit(doc: dict) -> str:
    root = ET.Element("testsuites", name=clean(f"conformance {doc['impl']}"))
    by_component: dict[str, list[dict]] = {}
    for case in doc["cases"]:
        by_component.setdefault(case["component"], []).append(case)
    for name, cases in by_component.items():
        suite = ET.SubElement(
            root,
            "testsuite",
            name=name,
            tests=str(len(cases)),
            failures=str(sum(c["status"] in ("fail", "xpass") for c in cases)),
            errors=str(sum(c["status"] in ("error", "crash", "timeout") for c in cases)),
            skipped=str(sum(c["status"] in ("unsupported", "xfail", "not_run") for c in cases)),
        )
        props = ET.SubElement(suite, "properties")
        run = [
            ("impl", doc["impl"]),
            ("device", doc["device"]),
            ("torch", doc["versions"]["torch"]),
            ("verdict", verdict(doc)),
        ]
        run += [("stopped", f"{doc['stopped']}; {doc.get('not_run', 0)} case(s) not run")] if doc.get("stopped") else []
        run += [("override", line) for line in override_lines(doc)]
        for key, value in run:
            ET.SubElement(props, "property", name=key, value=clean(str(value)))
        for case in cases:
            tc = ET.SubElement(
                suite, "testcase", classname=name, name=case["id"], time=f"{case.get('duration_s') or 0:.4f}"
            )
            status = case["status"]
            if status in KIND:
                el = ET.SubElement(tc, KIND[status], message=f"{status}: {clean(case.get('message') or '', 200)}")
                el.text = clean(case.get("message") or "", TEXT_CHARS)
            elif status == "partial":  # passed what it returned; the declined outputs are said, not judged
                ET.SubElement(tc, "system-out").text = clean(case.get("message") or "", TEXT_CHARS)
            elif status in ("unsupported", "xfail", "not_run"):
                reason = case.get("expectation") or case.get("message") or ""
                ET.SubElement(tc, "skipped", message=f"{status}: {clean(reason, 500)}")
    return ET.tostring(root, encoding="unicode") + "\n"
