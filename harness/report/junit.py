"""`junit.xml`: one testsuite per component, one testcase per case (CI test tabs read this)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

KIND = {"fail": "failure", "xpass": "failure", "error": "error", "crash": "error", "timeout": "error"}


def render_junit(doc: dict) -> str:
    root = ET.Element("testsuites", name=f"conformance {doc['impl']}")
    by_component: dict[str, list[dict]] = {}
    for case in doc["cases"]:
        by_component.setdefault(case["component"], []).append(case)
    for name, cases in by_component.items():
        suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(cases)),
                              failures=str(sum(c["status"] in ("fail", "xpass") for c in cases)),
                              errors=str(sum(c["status"] in ("error", "crash", "timeout") for c in cases)),
                              skipped=str(sum(c["status"] in ("unsupported", "xfail") for c in cases)))
        props = ET.SubElement(suite, "properties")
        for key, value in (("impl", doc["impl"]), ("device", doc["device"]), ("torch", doc["versions"]["torch"])):
            ET.SubElement(props, "property", name=key, value=str(value))
        for case in cases:
            tc = ET.SubElement(suite, "testcase", classname=name, name=case["id"], time=f"{case.get('duration_s', 0):.4f}")
            status = case["status"]
            if status in KIND:
                el = ET.SubElement(tc, KIND[status], message=f"{status}: {(case.get('message') or '')[:200]}")
                el.text = case.get("message") or ""
            elif status in ("unsupported", "xfail"):
                ET.SubElement(tc, "skipped", message=f"{status}: {case.get('expectation') or case.get('message') or ''}")
    return ET.tostring(root, encoding="unicode") + "\n"
