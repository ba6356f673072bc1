"""Runs CI can trust: concurrent runs, cancellation, never-run cases, captured output, valid reports,
re-run commands, protocol breakers, bad flags and a golden store that must not be escaped.

Everything goes through the real CLI. Nothing here asserts a duration: the timing tests wait for
events (a case started, a file appeared) with generous limits, so a loaded machine only slows them.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import ROOT, make_project, results, run_cli, statuses

IMPLS = ROOT / "tests" / "impls"
CI = f"{IMPLS}/ci_conditions.py"


def start_run(*args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "v41_conformance", "run", *args],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, what: str, limit: float = 240.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def cases_started(report: Path) -> int:
    """Cases whose capture file exists: the run is under way."""
    return sum(1 for _ in report.glob(".run/*/output/*.log"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


# --- 1. two runs into one report dir ----------------------------------------------------------


def test_a_second_run_into_a_busy_report_dir_refuses_and_the_first_keeps_its_results(tmp_path):
    report = tmp_path / "shared"
    first = start_run(
        "--impl",
        f"{CI}:Slow",
        "--select",
        "quant.e2m1",
        "--report-dir",
        str(report),
        env={"CONFORMANCE_TEST_SLEEP": "1"},
    )
    wait_for(lambda: cases_started(report) >= 1, "the first run to start a case")
    second = run_cli("run", "--impl", "reference", "--select", "norm.rms", "--report-dir", str(report))
    assert second.returncode == 2
    assert "is in use by another conformance run" in second.stderr and f"pid {first.pid}" in second.stderr
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    doc = results(report)
    assert doc["impl"].endswith("ci_conditions.py:Slow")
    assert {c["component"] for c in doc["cases"]} == {"quant.e2m1"}  # never the other run's cases
    assert not (report / ".run").exists()  # private run state is removed
    again = run_cli("run", "--impl", "reference", "--select", "norm.rms", "--report-dir", str(report), "--no-isolate")
    assert again.returncode == 0, again.stderr  # the lock went with the first run


# --- 2. cases that never ran ------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, says", [(["-n", "abc"], "-n 'abc'"), (["--pytest-args", "--bogus"], "pytest refused the arguments")]
)
def test_a_usage_error_exits_2_with_no_verdicts(tmp_path, flags, says):
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", "reference", "--select", "norm.rms", "--report-dir", str(report), *flags)
    assert proc.returncode == 2 and says in proc.stderr, proc.stdout + proc.stderr
    assert not (report / "results.json").exists()


def test_stopping_at_the_first_failure_leaves_the_rest_not_run(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{IMPLS}/wrong.py:TiesAwayE2M1",
        "--select",
        "quant.e2m1,quant.fp8_ue8m0",
        "--report-dir",
        str(report),
        "--no-isolate",
        "--pytest-args",
        "-x",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = results(report)
    got = statuses(doc)
    assert list(got.values()).count("fail") == 1 and "not_run" in got.values()
    assert "crash" not in got.values()
    never = next(c for c in doc["cases"] if c["status"] == "not_run")
    assert "stopped at the first failure" in never["message"] and never["repro"]
    assert doc["stopped"] and doc["not_run"] == list(got.values()).count("not_run")
    assert "not run" in proc.stdout and "STOPPED:" in proc.stdout


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_writes_what_ran_and_marks_the_rest_not_run(tmp_path, sig, code):
    report = tmp_path / "rep"
    run = start_run(
        "--impl",
        f"{CI}:Slow",
        "--select",
        "quant.*,norm.rms",
        "--report-dir",
        str(report),
        env={"CONFORMANCE_TEST_SLEEP": "0.3"},
    )
    wait_for(lambda: cases_started(report) >= 3, "a few cases to run")
    run.send_signal(sig)
    out, err = run.communicate(timeout=120)
    assert run.returncode == code, out + err
    doc = results(report)
    got = statuses(doc)
    assert "pass" in got.values() and "not_run" in got.values()
    assert set(got.values()) <= {"pass", "not_run"}  # nothing blamed on the implementation
    assert f"interrupted by {sig.name}" in doc["stopped"] and doc["exit_code"] == code
    assert "STOPPED" in out and (report / "junit.xml").exists() and (report / "summary.md").exists()


# --- 3. the timeout does not count loading ----------------------------------------------------


def test_loading_the_implementation_does_not_count_against_the_case_timeout(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{IMPLS}/slow_to_load.py:SlowToLoad",
        "--select",
        "norm.rms",
        "--timeout",
        "2",
        "--report-dir",
        str(report),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(statuses(results(report)).values()) == {"pass"}


# --- 4. SIGTERM leaves nothing running --------------------------------------------------------


def test_sigterm_kills_the_hung_implementation_and_what_it_started(tmp_path):
    report, pids = tmp_path / "rep", tmp_path / "pids"
    run = start_run(
        "--impl",
        f"{CI}:SpawnsAndHangs",
        "--select",
        "norm.rms",
        "--report-dir",
        str(report),
        env={"CONFORMANCE_TEST_PIDS": str(pids)},
    )
    wait_for(pids.exists, "the implementation to start its helper")
    child, helper = (int(p) for p in pids.read_text().split())
    assert alive(child) and alive(helper)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 143, out + err
    wait_for(lambda: not alive(child) and not alive(helper), "the child and its helper to be gone", 30)
    assert statuses(results(report)) and results(report)["stopped"]


def test_a_run_killed_with_sigkill_takes_its_hung_child_with_it(tmp_path):
    """No handler runs on SIGKILL: the fork server dies with the run, and the child with the
    fork server (PR_SET_PDEATHSIG at both links)."""
    report, pids = tmp_path / "rep", tmp_path / "pids"
    run = start_run(
        "--impl",
        f"{CI}:SpawnsAndHangs",
        "--select",
        "norm.rms",
        "--report-dir",
        str(report),
        env={"CONFORMANCE_TEST_PIDS": str(pids)},
    )
    wait_for(pids.exists, "the implementation to start its helper")
    child, _ = (int(p) for p in pids.read_text().split())
    assert alive(child)
    run.kill()
    run.communicate(timeout=120)
    wait_for(lambda: not alive(child), "the hung child to die with the killed run", 30)


# --- 5. what an implementation prints ---------------------------------------------------------


def test_printed_output_is_captured_per_case_and_shown_with_crashes_and_failures(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", f"{CI}:Noisy", "--select", "norm.rms", "--report-dir", str(report))
    assert proc.returncode == 1
    cases = {c["id"]: c for c in results(report)["cases"]}
    crash = cases["norm.rms/latent-4x512"]
    assert crash["status"] == "crash"
    for text in ("python print: norm.rms (4, 512)", "C printf: kernel for (4, 512)", "illegal memory access"):
        assert text in crash["message"] and text in crash["output"], text
    failed = cases["norm.rms/qr-3x1280-zero-row"]
    assert failed["status"] == "fail" and "the implementation printed" in failed["message"]
    passed = cases["norm.rms/latent-6x128"]
    assert passed["status"] == "pass" and "C printf: kernel for (6, 128)" in passed["output"]
    assert "the implementation printed" not in passed["message"]
    log = (report / "output.log").read_text()
    assert "===== norm.rms/latent-4x512 (crash) =====" in log and log.count("python print:") == 5


def test_a_batch_program_that_breaks_the_protocol_is_restarted_and_its_stderr_kept(tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    project = make_project(tmp_path, ["quant.e2m1"])
    config = project / "conformance.yaml"
    config.write_text(config.read_text() + f"  chatty:\n    command: [{sys.executable}, {script}]\n    batch: true\n")
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", "chatty", "--config", str(config), "--report-dir", str(report))
    cases = {c["id"]: c for c in results(report)["cases"]}
    bad = cases["quant.e2m1/midpoints"]
    assert bad["status"] == "error" and "broke the protocol" in bad["message"], proc.stdout
    assert "'progress 50%'" in bad["message"] and "Traceback" not in bad["message"]
    assert "instead of 'ok', 'error <message>' or 'unsupported <reason>'" in bad["message"]  # every answer
    assert "serving quant.e2m1 with" in bad["message"]  # its stderr, shown with the error
    # the cases after it get their own answers, from a fresh process
    assert {c["status"] for i, c in cases.items() if i != "quant.e2m1/midpoints"} == {"pass"}


CHATTY = '''
import sys
import torch
from safetensors.torch import load_file, save_file
from v41_conformance.adapters.reference import ReferenceAdapter

if sys.argv[1] == "components":
    print("quant.e2m1")
    sys.exit(0)
for line in sys.stdin:
    _, component, src, dst = line.split()
    inputs = {k: v for k, v in load_file(src).items() if not k.startswith("param.")}
    sys.stderr.write(f"serving {component} with {inputs['v'].numel()} values\\n")
    sys.stderr.flush()
    save_file(ReferenceAdapter().run(component, inputs, {}), dst)
    if inputs["v"].numel() < 100:  # the midpoints case: a progress line breaks the protocol
        print("progress 50%", flush=True)
    print("ok", flush=True)
'''


# --- 6. reports stay valid and small ----------------------------------------------------------


def test_reports_stay_valid_whatever_the_implementation_prints(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{CI}:Loud",
        "--select",
        "compressor*,quant.*,norm.rms",
        "--report-dir",
        str(report),
        "--no-isolate",
        "-n",
        "2",
    )
    assert proc.returncode == 1
    doc = results(report)
    assert len(doc["cases"]) > 100 and all(len(c["message"]) > 3000 for c in doc["cases"])
    ET.parse(report / "junit.xml")  # valid XML despite the NUL and the escape codes
    summary = (report / "summary.md").read_text()
    html = (report / "report.html").read_text()
    for text in (summary, html, proc.stdout):
        assert "\x1b" not in text and "\x00" not in text
    assert len(summary.encode()) < 32 * 1024  # GitHub's step summary limit is 1 MiB


# --- 7. what the terminal shows ---------------------------------------------------------------


def test_the_terminal_names_every_failing_output_and_the_implementations_own_frames(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{CI}:TwoWrongOutputs",
        "--select",
        "quant.fp8_ue8m0/window-kv-4x512",
        "--report-dir",
        str(report),
        "--no-isolate",
    )
    assert "output 'y': not bit-identical" in proc.stdout and "output 'codes': not bit-identical" in proc.stdout
    proc = run_cli(
        "run",
        "--impl",
        f"{CI}:RaisesDeep",
        "--select",
        "norm.rms/latent-6x128",
        "--report-dir",
        str(report),
        "--no-isolate",
    )
    message = results(report)["cases"][0]["message"]
    assert "Traceback of the implementation" in message and "in _helper_frame" in message
    assert "harness/runner.py" not in message and "IndexError: tile index 128 out of range" in proc.stdout


def test_an_unexpected_pass_says_which_expectation_it_contradicts(tmp_path):
    project = make_project(tmp_path, ["quant.e2m1"])
    config = project / "conformance.yaml"
    config.write_text(
        config.read_text() + "  hopeful:\n    python: v41_conformance.adapters.reference:ReferenceAdapter\n"
        "    expectations:\n      - {pattern: 'quant.e2m1/midpoints', status: fail, reason: 'ties, issue 9'}\n"
    )
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", "hopeful", "--config", str(config), "--report-dir", str(report), "--no-isolate")
    assert proc.returncode == 1
    assert "XPASS quant.e2m1/midpoints" in proc.stdout and "ties, issue 9" in proc.stdout
    assert "ties, issue 9" in (report / "summary.md").read_text()


# --- 8. re-run commands -----------------------------------------------------------------------


def test_the_rerun_command_reproduces_the_case_with_every_flag(tmp_path):
    project = make_project(tmp_path, ["quant.e2m1"])
    report = tmp_path / "my reports"
    proc = run_cli(
        "run",
        "--impl",
        f"{IMPLS}/wrong.py:TiesAwayE2M1",
        "--config",
        str(project / "conformance.yaml"),
        "--timeout",
        "30",
        "--report-dir",
        str(report),
        "--no-isolate",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    case = next(c for c in results(report)["cases"] if c["status"] == "fail")
    command = shlex.split(case["repro"])
    for flag in ("--config", "--timeout", "--report-dir", "--no-isolate"):
        assert flag in command, case["repro"]
    before = results(report)
    again = run_cli(*command[1:], cwd=tmp_path)
    assert again.returncode == 1
    assert statuses(results(tmp_path / "my reports-rerun")) == {case["id"]: "fail"}
    assert results(report) == before  # into a sibling folder: the run's own report stays as it was


# --- 10. bad flags ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--timeout", "-1"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "nan"], "--timeout"),
        (["--timeout", "inf"], "--timeout"),
        (["-n", "-1"], "-n"),
        (["--report-dir", "goldens"], "inside the golden store"),
        (["--report-dir", "goldens/quant.e2m1"], "inside the golden store"),
    ],
)
def test_nonsense_flags_are_usage_errors(flags, says):
    proc = run_cli("run", "--impl", "reference", "--select", "norm.rms", *flags)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not (ROOT / "goldens" / "results.json").exists()


# --- 11. the golden store cannot be escaped ---------------------------------------------------


def test_a_manifest_key_that_climbs_out_of_the_store_is_refused_everywhere(tmp_path):
    project = make_project(tmp_path, ["quant.e2m1"])
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"precious")
    manifest_path = project / "goldens" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["cases"]["quant.e2m1/../../../victim"] = {"file": "../victim.safetensors", "sha256": "0" * 64, "size": 8}
    manifest_path.write_text(json.dumps(manifest))
    config = str(project / "conformance.yaml")

    run = run_cli(
        "run", "--impl", "reference", "--config", config, "--report-dir", str(tmp_path / "rep"), "--no-isolate"
    )
    doc = results(tmp_path / "rep")
    assert run.returncode == 1 and {c["status"] for c in doc["cases"]} == {"error"}
    assert all("not case ids" in c["message"] for c in doc["cases"])
    verify = run_cli("verify", "--config", config)
    assert verify.returncode == 1 and "BAD MANIFEST.json" in verify.stdout and "victim" in verify.stdout
    generate = run_cli("generate", "--config", config)
    assert generate.returncode == 0, generate.stdout + generate.stderr
    assert victim.read_bytes() == b"precious"
    assert "victim" not in manifest_path.read_text()


# --- 12. a golden store that cannot be written ------------------------------------------------


def test_generate_into_a_read_only_store_names_the_path(tmp_path, monkeypatch):
    project = make_project(tmp_path, ["quant.e2m1"])
    (project / "cases" / "quant.yaml").write_text(
        (project / "cases" / "quant.yaml").read_text().replace("name: midpoints\n", "name: midpoints-renamed\n")
    )
    args = ["generate", "--config", str(project / "conformance.yaml"), "--select", "quant.e2m1/midpoints-renamed"]
    if os.geteuid() != 0:
        for folder in (project / "goldens", project / "goldens" / "quant.e2m1"):
            folder.chmod(0o555)
        proc = run_cli(*args)
        code, output = proc.returncode, proc.stdout + proc.stderr
    else:  # root writes anywhere: make the write fail as a read-only store would
        from click.testing import CliRunner

        from v41_conformance import golden
        from v41_conformance.cli import main

        def read_only(*_args, **_kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(golden.tempfile, "mkstemp", read_only)
        result = CliRunner().invoke(main, args)
        code, output = result.exit_code, result.output
    assert code == 2, output
    assert "cannot write" in output and "quant.e2m1" in output and "Permission denied" in output
    assert "Traceback" not in output
