"""The language-neutral subprocess adapter: the C example built with gcc, both modes, and
programs that break the protocol."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import make_project, results, run_cli, statuses

COMPONENTS = ["quant.e2m1", "quant.fp4_e8m0", "address.decode"]

BROKEN = r'''
import sys
mode = sys.argv[1]
if mode == "components":
    print("quant.e2m1"); print("quant.fp4_e8m0")
elif mode == "run":
    sys.stderr.write("segment table corrupt in " + sys.argv[2] + "\n"); sys.exit(7)
elif mode == "serve":
    for line in sys.stdin:
        if "quant.e2m1" in line:
            print("this is not the protocol", flush=True)
        else:
            sys.exit(4)
'''


def _project(tmp_path, impls: dict):
    project = make_project(tmp_path, COMPONENTS)
    config = project / "conformance.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["impls"].update(impls)
    config.write_text(yaml.safe_dump(doc))
    return config


@pytest.mark.parametrize("batch", [True, False])
def test_c_example_passes_through_the_subprocess_adapter(tmp_path, c_binary, batch):
    config = _project(tmp_path, {"c": {"command": [str(c_binary)], "batch": batch}})
    report = tmp_path / "rep"
    proc = run_cli(
        "run", "--impl", "c", "--config", str(config), "--report-dir", str(report), "--select", ",".join(COMPONENTS)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = results(report)
    assert {doc["components"][c]["verdict"] for c in COMPONENTS} == {"pass"}
    assert doc["impl_kind"] == "subprocess" and len(doc["cases"]) >= 13


def test_c_example_lists_its_components(c_binary):
    proc = subprocess.run([str(c_binary), "components"], capture_output=True, text=True)
    assert proc.stdout.split() == COMPONENTS


def test_programs_that_break_the_protocol_are_errors_and_the_run_goes_on(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    config = _project(
        tmp_path,
        {
            "broken-batch": {"command": [sys.executable, str(script)], "batch": True},
            "broken-single": {"command": [sys.executable, str(script)], "batch": False},
        },
    )
    report = tmp_path / "batch"
    proc = run_cli(
        "run",
        "--impl",
        "broken-batch",
        "--config",
        str(config),
        "--report-dir",
        str(report),
        "--select",
        ",".join(COMPONENTS),
        "--no-isolate",
    )
    assert proc.returncode == 1
    doc = results(report)
    got = statuses(doc)
    assert {got[c] for c in got if c.startswith("quant.e2m1/")} == {"error"}
    assert {got[c] for c in got if c.startswith("address.decode/")} == {"unsupported"}
    messages = {c["id"]: c["message"] for c in doc["cases"]}
    assert (
        "broke the protocol" in messages["quant.e2m1/midpoints"] and "Traceback" not in messages["quant.e2m1/midpoints"]
    )
    assert any("exited" in messages[c] for c in got if c.startswith("quant.fp4_e8m0/"))
    report = tmp_path / "single"
    proc = run_cli(
        "run",
        "--impl",
        "broken-single",
        "--config",
        str(config),
        "--report-dir",
        str(report),
        "--select",
        "quant.e2m1",
        "--no-isolate",
    )
    assert proc.returncode == 1
    case = results(report)["cases"][0]
    assert (
        case["status"] == "error"
        and "exited with code 7" in case["message"]
        and "segment table corrupt" in case["message"]
    )


def test_a_missing_program_is_a_usage_error(tmp_path):
    config = _project(tmp_path, {"ghost": {"command": ["does/not/exist"]}})
    proc = run_cli("run", "--impl", "ghost", "--config", str(config), "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "not found" in proc.stderr
