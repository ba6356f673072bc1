"""Messages a busy engineer acts on: the evidence first, every kind of failure seen, a re-run that
keeps the report, what was printed kept in CLI and plugin alike, no protocol error diagnosed, an
unsupported component never blamed for its golden, a typo in --impl reported at once."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

from conftest import ROOT, make_project, results, run_cli, statuses
from v41_conformance.adapters.reference import ReferenceAdapter

WRONG = f"{ROOT}/tests/impls/wrong.py"
NUMERIC = "quant.*,norm.rms,linear.f32,rope.apply"
BIG = (1 << 20) + 5000  # bytes one case prints: more than output.log keeps of a case


class Chatty(ReferenceAdapter):
    """Correct; prints a numbered line per kilobyte on quant.e2m1/midpoints, past output.log's cap."""

    def run(self, component, inputs, params):
        if component == "quant.e2m1" and inputs["v"].numel() < 100:
            print("".join(f"line {i:06d} " + "x" * 1012 + "\n" for i in range(BIG // 1024 + 1)), end="", flush=True)
        return super().run(component, inputs, params)


class FloatDtype(ReferenceAdapter):
    """Returns norm.rms in float16: a protocol error, no porting bug."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        return {k: v.half() for k, v in out.items()} if component == "norm.rms" else out


class NoNorm(ReferenceAdapter):
    def supports(self, component):
        return component != "norm.rms"


def _run(tmp_path, impl: str, select: str, *extra: str, report: str = "rep"):
    return run_cli(
        "run", "--impl", impl, "--select", select, "--report-dir", str(tmp_path / report), "--no-isolate", *extra
    )


def test_the_console_leads_each_failing_case_with_its_evidence_then_the_diagnosis(tmp_path):
    """quant.e2m1/midpoints rounded ties away: the differing elements (index, actual, expected)
    come first, the diagnosis after them, in the terminal as in results.json."""
    proc = _run(tmp_path, f"{WRONG}:TiesAwayE2M1", "quant.e2m1/midpoints", "--diagnosis-budget", "30")
    out = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(out) if "FAIL quant.e2m1/midpoints" in line)
    block = out[at : at + 16]
    row = next(i for i, line in enumerate(block) if re.search(r"\[\d+\] \| -?[\d.]+ \| -?[\d.]+", line))
    assert any("index | actual | expected" in line for line in block[:row])
    diagnosis = next(i for i, line in enumerate(block) if line.strip().startswith("diagnosis"))
    assert row < diagnosis, "\n".join(block)
    message = results(tmp_path / "rep")["cases"][0]["message"]
    assert message.index(" | ") < message.index("diagnosis")


def test_a_summary_shows_one_case_of_every_kind_before_repeats(tmp_path):
    """Five exceptions and three shape errors sort before a dtype error by id: the summary counts
    each kind and shows the first of each, whatever the order of the ids."""
    from v41_conformance.report.text import kind_of, kinds_first, kinds_line

    proc = _run(tmp_path, f"{WRONG}:ManyBugs", NUMERIC)
    doc = results(tmp_path / "rep")
    bad = [c for c in doc["cases"] if c["status"] in ("fail", "error")]
    kinds = {kind_of(c) for c in bad}
    assert kinds == {
        "exception",
        "missing-output error",
        "unexpected-output error",
        "shape error",
        "dtype error",
        "failure at y",
    }
    for kind in kinds:
        first = next(c for c in bad if kind_of(c) == kind)
        assert f"{first['status'].upper()} {first['id']}" in proc.stdout, kind
    assert "5 exceptions" in proc.stdout and "3 shape errors" in proc.stdout and "5 dtype errors" in proc.stdout
    assert "5 exceptions" in (tmp_path / "rep" / "summary.md").read_text()
    ordered, counts = kinds_first(bad)
    assert len({kind_of(c) for c in ordered[: len(counts)]}) == len(counts)
    assert (
        kinds_line({"dtype error": 5, "timeout": 1, "crash": 2, "failure at out": 2})
        == "5 dtype errors, 1 timeout, 2 crashes, 2 failures at out"
    )


def test_the_re_run_command_never_overwrites_the_report_it_came_from(tmp_path):
    proc = _run(tmp_path, f"{WRONG}:TiesAwayE2M1", "quant.e2m1/*")
    doc = results(tmp_path / "rep")
    case = next(c for c in doc["cases"] if c["status"] == "fail")
    assert f"--report-dir {tmp_path / 'rep-rerun'}" in case["repro"] and case["repro"] in proc.stdout
    again = run_cli(*shlex.split(case["repro"])[1:])
    assert again.returncode == 1
    assert results(tmp_path / "rep") == doc  # the run's report as it was
    assert [c["id"] for c in results(tmp_path / "rep-rerun")["cases"]] == [case["id"]]
    default = run_cli(
        "run", "--impl", f"{WRONG}:TiesAwayE2M1", "--select", "quant.e2m1/midpoints", "--no-isolate", cwd=tmp_path
    )
    assert "--report-dir reports/latest-rerun" in default.stdout


def test_output_log_keeps_what_the_readme_says_and_the_whole_of_a_long_case_beside_it(tmp_path):
    proc = run_cli(
        "run", "--impl", f"{__file__}:Chatty", "--select", "quant.e2m1/*", "--report-dir", str(tmp_path / "rep")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "rep" / "output.log").read_text()
    whole = tmp_path / "rep" / "output" / "quant.e2m1__midpoints.log"
    assert f"earlier bytes; all of it in output/{whole.name}]" in log
    assert whole.stat().st_size >= BIG and whole.read_text().startswith("line 000000 ")
    readme = (ROOT / "README.md").read_text()
    assert "`output.log`" in readme and "output/<component>__<case>.log" in readme


def test_the_plugin_keeps_what_was_printed_as_the_cli_does(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--conformance-impl",
            "test_messages:Chatty",
            "--conformance-select",
            "quant.e2m1/midpoints",
            "--conformance-report-dir",
            "rep",
            "--conformance-no-isolate",
        ],  # isolated: the CLI's tests
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    case = results(tmp_path / "rep")["cases"][0]
    assert case["status"] == "pass" and case["output"].rstrip().endswith("x" * 100)
    assert "line 000000 " in (tmp_path / "rep" / "output" / "quant.e2m1__midpoints.log").read_text()
    assert "===== quant.e2m1/midpoints (pass) =====" in (tmp_path / "rep" / "output.log").read_text()
    assert not (tmp_path / "rep" / ".run").exists()


def test_a_protocol_error_gets_no_diagnosis_and_leads_with_what_was_answered(tmp_path):
    _run(tmp_path, f"{__file__}:FloatDtype", "norm.rms/*", "--diagnosis-budget", "30")
    for case in results(tmp_path / "rep")["cases"]:
        assert case["status"] == "error" and case["kind"] == "dtype error"
        assert case["diagnosis"] is None and "diagnosis" not in case["message"]
        assert case["message"].startswith("output 'y': dtype float16 != expected")


def test_an_unsupported_component_is_unsupported_whatever_its_golden(tmp_path):
    """A component the implementation does not support is never blamed for a missing golden (the
    production tier, built locally, may lack it): supports() is asked first."""
    project = make_project(tmp_path, ["norm.rms", "quant.e2m1"])
    manifest = json.loads((project / "goldens" / "MANIFEST.json").read_text())
    gone = [c for c in manifest["cases"] if c.startswith("norm.rms/")]
    for case_id in gone:
        (project / "goldens" / manifest["cases"][case_id]["file"]).unlink()
    proc = run_cli(
        "run",
        "--impl",
        f"{__file__}:NoNorm",
        "--config",
        str(project / "conformance.yaml"),
        "--select",
        "norm.rms/*,quant.e2m1/*",
        "--report-dir",
        str(tmp_path / "rep"),
        "--no-isolate",
    )
    got = statuses(results(tmp_path / "rep"))
    assert all(got[c] == "unsupported" for c in gone) and proc.returncode == 0, proc.stdout


def test_a_typo_in_impl_is_reported_before_torch_is_imported(tmp_path):
    for impl, said in (
        ("refrence", "unknown --impl 'refrence'"),
        ("teamkernels.impl:Impl", "the package must be importable"),
        ("kernels/impl.py:Impl", "file kernels/impl.py not found"),
    ):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "v41_conformance", "run", "--impl", impl],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
        imported = {
            line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")
        }
        assert "torch" not in imported and "v41_conformance.cli" in imported


def test_run_help_and_readme_say_what_the_cli_does():
    help_text = " ".join(run_cli("run", "--help").stdout.split())
    assert "pytest-xdist workers: a number" not in help_text and "isolation child" in help_text
    readme = (ROOT / "README.md").read_text()
    manifest = json.loads((ROOT / "goldens" / "MANIFEST.json").read_text())
    said = re.search(r"the suite in git: (\d+) cases", readme)
    assert said and int(said.group(1)) == len(manifest["cases"])
    assert "importable" in readme.split("--impl mypackage.module:MyKernels", 1)[1][:600]


def test_a_long_line_is_cut_at_a_word_and_a_short_overshoot_is_not_cut():
    from v41_conformance.report.text import clean, failing_lines

    line = "this case broke the protocol: " + "word " * 54 + "restarted for the next case"
    assert len(line) > 300 and clean(line, 300) == line  # 5 more characters are shown, not announced
    long = "word " * 200
    cut = clean(long, 300)
    assert cut.startswith("word " * 50) and re.search(r"word \[\.\.\. \d+ more characters in results.json\]$", cut)
    assert failing_lines({"status": "error", "message": long, "outputs": {}})[0].endswith("in results.json]")
