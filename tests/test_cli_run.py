"""`conformance run` end to end through the real CLI: statuses, reports, exit codes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import yaml

from conftest import ROOT, make_project, results, run_cli, statuses
from v41_conformance.ids import matches, parse_select

NUMERIC = [
    "quant.e2m1",
    "quant.fp4_e4m3",
    "quant.fp4_e8m0",
    "quant.fp8_ue8m0",
    "linear.f32",
    "norm.rms",
    "rope.apply",
    "rope.yarn_table",
]


def test_reference_passes_and_writes_all_reports(tmp_path):
    # every golden: tests/test_package.py, from the installed package (the CLI and the pytest plugin);
    # -n 2 over pytest workers: tests/test_ci_conditions.py
    report = tmp_path / "rep"
    select = "quant.*,norm.rms,compressor/r2-tiny-chunks-*,indexer/r1-*"
    proc = run_cli("run", "--impl", "reference", "--select", select, "--report-dir", str(report), "--no-isolate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = results(report)
    assert doc["exit_code"] == 0 and doc["impl"] == "reference" and doc["store"]["origin"] == "checkout"
    assert doc["cases"] and all(c["status"] == "pass" for c in doc["cases"])
    manifest = json.loads((ROOT / "goldens" / "MANIFEST.json").read_text())
    assert {c["id"] for c in doc["cases"]} == {c for c in manifest["cases"] if matches(c, parse_select([select]))}
    for name in ("summary.md", "junit.xml", "report.html"):
        assert (report / name).stat().st_size > 0
    ET.fromstring((report / "junit.xml").read_text())  # well-formed
    assert "component" in proc.stdout and "PASS" in proc.stdout


def test_select_and_report_rerender(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", "reference", "--select", "quant.*", "--report-dir", str(report), "--no-isolate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = results(report)
    assert doc["cases"] and all(c["component"].startswith("quant.") for c in doc["cases"])
    (report / "report.html").unlink()
    again = run_cli("report", str(report))
    assert again.returncode == 0 and (report / "report.html").exists()


def test_ties_away_from_zero_fails_exactly_the_e2m1_components(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong.py:TiesAwayE2M1",
        "--report-dir",
        str(report),
        "--select",
        ",".join(NUMERIC),
        "--no-isolate",
    )
    assert proc.returncode == 1
    doc = results(report)
    verdicts = {name: e["verdict"] for name, e in doc["components"].items()}
    assert {n for n, v in verdicts.items() if v == "fail"} == {"quant.e2m1", "quant.fp4_e4m3", "quant.fp4_e8m0"}
    midpoints = next(c for c in doc["cases"] if c["id"] == "quant.e2m1/midpoints")
    assert midpoints["status"] == "fail"
    # The message shows a midpoint rounded the wrong way: 0.25 -> code 1 instead of 0, etc.
    assert "codes" in midpoints["message"] and "not bit-identical" in midpoints["message"]
    assert "| 1 | 0" in midpoints["message"] or "| 9 | 8" in midpoints["message"]


def test_numpy_example_passes_its_components_and_declares_the_rest_unsupported(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run", "--impl", "numpy-example", "--report-dir", str(report), "--select", ",".join(NUMERIC), "--no-isolate"
    )
    assert proc.returncode == 0, proc.stdout
    doc = results(report)
    verdicts = {n: e["verdict"] for n, e in doc["components"].items()}
    assert verdicts["quant.e2m1"] == verdicts["linear.f32"] == verdicts["norm.rms"] == "pass"
    assert verdicts["rope.apply"] == "unsupported"


def test_bad_implementations_each_get_a_clear_status_and_the_run_goes_on(tmp_path):
    expected = {
        "norm.rms": ("error", "implementation raised RuntimeError: kernel launch failed"),
        "quant.fp8_ue8m0": ("error", "missing output(s) ['scale_bytes']"),
        "quant.fp4_e4m3": ("error", "unexpected output(s) ['debug']"),
        "linear.f32": ("error", "output 'y': shape"),
        "quant.fp4_e8m0": ("error", "output 'y': dtype float16 != expected bfloat16"),
        "rope.apply": ("fail", "NaN positions differ"),
    }
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong.py:ManyBugs",
        "--report-dir",
        str(report),
        "--select",
        ",".join(NUMERIC),
        "--no-isolate",
    )
    assert proc.returncode == 1, proc.stdout
    doc = results(report)
    for component, (status, text) in expected.items():
        cases = [c for c in doc["cases"] if c["component"] == component]
        assert cases and all(c["status"] == status for c in cases), (component, [c["status"] for c in cases])
        assert all(text in c["message"] for c in cases), (component, cases[0]["message"])
        assert all(c["id"] in c["repro"] for c in cases)
    for component in ("quant.e2m1", "rope.yarn_table"):
        assert doc["components"][component]["verdict"] == "pass"


def test_unknown_impl_is_a_usage_error():
    proc = run_cli("run", "--impl", "no-such-impl", "--report-dir", "/tmp/unused-report")
    assert proc.returncode == 2
    assert "unknown --impl 'no-such-impl'" in proc.stderr and "numpy-example" in proc.stderr


def test_an_impl_path_that_is_no_python_source_is_a_usage_error(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "notes.txt").write_text("x = 1\n")
    for target in ("./kernels:Impl", "./notes.txt:Impl"):  # the path form: a folder, a file of another kind
        proc = run_cli("run", "--impl", target, "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
        assert proc.returncode == 2 and "is not a Python source file" in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr


def test_malformed_config_is_a_usage_error_naming_the_file(tmp_path):
    project = make_project(tmp_path, ["quant.e2m1"])
    (project / "conformance.yaml").write_text("tolerances: [this is: not a mapping\n")
    proc = run_cli("run", "--impl", "reference", "--config", str(project / "conformance.yaml"))
    assert proc.returncode == 2 and "conformance.yaml" in proc.stderr and "malformed YAML" in proc.stderr
    (project / "conformance.yaml").write_text("tolerances:\n  defaults:\n    bf16: {ulps: -1}\n")
    proc = run_cli("run", "--impl", "reference", "--config", str(project / "conformance.yaml"))
    assert proc.returncode == 2 and "ulps must be a non-negative number" in proc.stderr


def test_half_supported_implementation_is_unsupported_not_failed(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong.py:HalfSupported",
        "--report-dir",
        str(report),
        "--select",
        ",".join(NUMERIC),
        "--no-isolate",
    )
    assert proc.returncode == 0, proc.stdout
    doc = results(report)
    assert {c["status"] for c in doc["cases"] if not c["component"].startswith("quant.")} == {"unsupported"}
    assert doc["components"]["norm.rms"]["verdict"] == "unsupported"


def test_a_full_run_fails_components_below_their_floor(tmp_path):
    project = make_project(tmp_path, ["quant.e2m1", "norm.rms"])
    config = project / "conformance.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["floors"]["norm.rms"] = 9
    config.write_text(yaml.safe_dump(doc))
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", "reference", "--config", str(config), "--report-dir", str(report), "--no-isolate")
    assert proc.returncode == 1
    doc = results(report)
    assert all(c["status"] == "pass" for c in doc["cases"])
    assert doc["components"]["norm.rms"]["verdict"] == "fail"
    assert any("norm.rms: ran 5 case(s), fewer than its floor of 9" in p for p in doc["problems"])
    # components with no goldens at all fail too: nothing goes green on empty
    assert doc["components"]["rope.apply"]["verdict"] == "fail"


def test_nothing_supported_does_not_pass(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong.py:HalfSupported",
        "--report-dir",
        str(report),
        "--select",
        "norm.rms",
        "--no-isolate",
    )
    assert proc.returncode == 1
    assert any("no case was executed" in p for p in results(report)["problems"])


def test_statuses_table_in_terminal_output(tmp_path):
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong.py:Raises",
        "--report-dir",
        str(tmp_path / "r"),
        "--select",
        "norm.rms",
        "--no-isolate",
    )
    assert "ERROR norm.rms/" in proc.stdout and "re-run: conformance run --impl" in proc.stdout
    assert statuses(results(tmp_path / "r"))
