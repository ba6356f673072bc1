"""The pytest plugin from the checkout (the installed wheel's runs are tests/test_package.py): its
verdict is `conformance run`'s (a stopped run, a run that judged nothing, an implementation that
cannot be loaded, a conftest override without the option), a hang is the case's `timeout` under
its isolation, -k deselects cases like tests, a case re-runs by its node id, xdist workers import no
torch; and the Python API's own errors.

Nothing here asserts a duration: the stop tests wait for a file the implementation writes when it
reaches a known case.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import ROOT, results, statuses
from v41_conformance import api
from v41_conformance.errors import UsageError
from v41_conformance.pytest_run import Plan, XdistLoopStop, session_exit_status

CI = f"{ROOT}/tests/impls/ci_conditions.py"
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},  # a session of its own
    "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
}
BASE = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]

HANGS = """
import time
from v41_conformance.adapters.reference import ReferenceAdapter


class HangsOnMidpoints(ReferenceAdapter):
    def run(self, component, inputs, params):
        if inputs["v"].dim() == 1 and inputs["v"].numel() < 100:  # quant.e2m1/midpoints
            time.sleep(600)
        return super().run(component, inputs, params)
"""

SUPPORTS_NOTHING = """
class SupportsNothing:
    def supports(self, component):
        return False

    def run(self, component, inputs, params):
        raise AssertionError("never called")
"""


def pytest_run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*BASE, *args], cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=600
    )


def test_the_plugin_times_out_a_hang_deselects_with_k_and_writes_the_reports(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    proc = pytest_run(
        "-p",
        "no:xdist",
        "--conformance-impl",
        "hangs.py:HangsOnMidpoints",
        "--conformance-select",
        "quant.e2m1",
        "--conformance-timeout",
        "5",
        "--conformance-report-dir",
        "rep",
        "-k",
        "not uniform",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 passed, 1 deselected" in proc.stdout, proc.stdout[-2000:]
    assert "quant.e2m1/midpoints: timeout:" in proc.stdout
    doc = results(tmp_path / "rep")
    assert statuses(doc) == {"quant.e2m1/bf16-valued-64x32": "pass", "quant.e2m1/midpoints": "timeout"}
    assert doc["selection"]["deselected"] == 1 and doc["exit_code"] == 1 and not doc["stopped"]
    # the re-run command is the case's node id, with the options of this run
    midpoints = next(c for c in doc["cases"] if c["id"] == "quant.e2m1/midpoints")
    assert midpoints["repro"].startswith("pytest conformance::quant.e2m1/midpoints --conformance-impl hangs.py:Hangs")
    assert "--conformance-timeout 5" in midpoints["repro"] and "--conformance-report-dir rep" in midpoints["repro"]


def test_a_case_reruns_by_the_node_id_pytest_prints(tmp_path):
    proc = pytest_run("conformance::quant.e2m1/midpoints", "--conformance-impl", "reference", "-rA", cwd=tmp_path)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:]
    assert "PASSED conformance::quant.e2m1/midpoints" in proc.stdout
    refused = pytest_run("conformance::quant.e2m1/midpoints", cwd=tmp_path)
    assert refused.returncode == 4 and "runs only with --conformance-impl" in refused.stderr


@pytest.mark.parametrize("sig, workers", [(signal.SIGINT, []), (signal.SIGTERM, ["-n", "2"])])
def test_a_stopped_run_exits_non_zero_and_every_report_says_stopped(tmp_path, sig, workers):
    mark = tmp_path / "reached"
    run = subprocess.Popen(
        [
            *BASE,
            "--conformance-impl",
            f"{CI}:StopsMidRun",
            "--conformance-select",
            "quant.*",
            "--conformance-report-dir",
            "rep",
            *workers,
        ],
        cwd=tmp_path,
        env={**ENV, "CONFORMANCE_TEST_BLOCK": "quant.fp8_ue8m0", "CONFORMANCE_TEST_MARK": str(mark)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert run.poll() is None and time.monotonic() < deadline, "the run never reached quant.fp8_ue8m0"
        time.sleep(0.1)
    run.send_signal(sig)
    out, _ = run.communicate(timeout=300)
    code = 128 + int(sig)
    assert run.returncode == code, out[-3000:]
    doc = results(tmp_path / "rep")
    got = statuses(doc)
    assert doc["exit_code"] == code and f"interrupted by {sig.name}" in doc["stopped"]
    assert doc["not_run"] == list(got.values()).count("not_run") >= 1
    assert not {s for c, s in got.items() if c.startswith("quant.fp8_ue8m0")} - {"not_run"}  # never blamed
    assert f"STOPPED: the run was interrupted by {sig.name}" in out, out[-3000:]
    assert "INTERNALERROR" not in out, out[-3000:]  # an interrupted wait in xdist's loop, say (XdistLoopStop)
    assert "— STOPPED" in (tmp_path / "rep" / "summary.md").read_text()
    assert "STOPPED</span>" in (tmp_path / "rep" / "report.html").read_text()
    junit = ET.fromstring((tmp_path / "rep" / "junit.xml").read_text())
    properties = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert properties["verdict"] == "STOPPED" and "case(s) not run" in properties["stopped"]
    assert sum(1 for s in junit.iter("skipped") if s.get("message").startswith("not_run:")) == doc["not_run"]


def test_under_xdist_a_signal_stops_the_controllers_loop_between_two_events():
    """The integration test above cannot aim its signal at the one unsafe bytecode (inside the queue's
    wait, its lock let go): here the handler itself is checked never to raise while the loop runs."""
    dsession = SimpleNamespace(queue=queue.Queue())
    with XdistLoopStop(dsession) as stop:
        with pytest.raises(KeyboardInterrupt):  # before the loop: at once, as StopSignals
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)
    assert stop.signal == signal.SIGINT and dsession.queue.empty()
    with XdistLoopStop(dsession) as stop:
        stop.looping = True
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            name, kwargs = dsession.queue.get(timeout=10)  # the loop's next event is the stop ...
        except KeyboardInterrupt:
            pytest.fail("the handler raised inside the loop")
        with pytest.raises(KeyboardInterrupt):  # ... which the loop raises when it takes it
            getattr(dsession, f"worker_{name}")(**kwargs)
        assert stop.signal == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # a second signal while the loop runs: at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
    assert signal.getsignal(signal.SIGTERM) != stop._handle  # the handlers before it are back


def test_a_run_that_judges_nothing_fails_the_session_with_the_clis_message(tmp_path):
    typo = pytest_run(
        "--conformance-impl",
        "reference",
        "--conformance-select",
        "sparse-attn*",
        "--conformance-report-dir",
        "typo",
        cwd=tmp_path,
    )
    assert typo.returncode == 1, typo.stdout[-2000:]
    assert "no case was executed" in typo.stdout and results(tmp_path / "typo")["exit_code"] == 1
    (tmp_path / "nothing.py").write_text(SUPPORTS_NOTHING)
    unsupported = pytest_run(
        "--conformance-impl",
        "nothing.py:SupportsNothing",
        "--conformance-select",
        "quant.e2m1",
        "--conformance-report-dir",
        "unsupported",
        cwd=tmp_path,
    )
    assert unsupported.returncode == 1 and "3 skipped" in unsupported.stdout, unsupported.stdout[-2000:]
    doc = results(tmp_path / "unsupported")
    assert doc["exit_code"] == 1 and "no case was executed" in doc["problems"][0]
    assert "— FAIL" in (tmp_path / "unsupported" / "summary.md").read_text()


def test_an_implementation_that_cannot_be_loaded_is_one_usage_error_before_any_case(tmp_path):
    proc = pytest_run(
        "--conformance-impl",
        "v41_conformance.adapters.reference:ReferenceAdaptr",
        "-n",
        "2",
        "--conformance-report-dir",
        "rep",
        cwd=tmp_path,
    )
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.count("has no attribute 'ReferenceAdaptr'") == 1 and "--conformance-impl" in proc.stderr
    assert "passed" not in proc.stdout and "failed" not in proc.stdout and not (tmp_path / "rep").exists()


OVERRIDE = """
import pytest
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.pytest_cases import FROM_OPTION


@pytest.fixture(scope="session")
def conformance_impl():
    return ReferenceAdapter() if {supply} else FROM_OPTION
"""


def test_a_conftest_override_without_the_option_fails_the_session_and_with_it_is_judged(tmp_path):
    (tmp_path / "test_own.py").write_text("def test_own():\n    pass\n")
    (tmp_path / "conftest.py").write_text(OVERRIDE.format(supply=True))
    alone = pytest_run(cwd=tmp_path)
    assert alone.returncode == 4, alone.stdout[-2000:]
    assert "supplies the conformance_impl fixture, but without --conformance-impl" in alone.stdout
    judged = pytest_run(
        "--conformance-impl",
        "our-gpu-kernels",
        "--conformance-select",
        "quant.e2m1",
        "--conformance-report-dir",
        "rep",
        cwd=tmp_path,
    )
    assert judged.returncode == 0 and "4 passed" in judged.stdout, judged.stdout[-2000:]
    assert results(tmp_path / "rep")["impl"] == "our-gpu-kernels"
    (tmp_path / "conftest.py").write_text(OVERRIDE.format(supply=False))  # falls back to the option: no cases wanted
    plain = pytest_run(cwd=tmp_path)
    assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout[-2000:]


PROBE = """
import os, sys


def pytest_sessionfinish(session):
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    with open(os.path.join({folder!r}, name + ".modules"), "w") as fh:
        fh.write(" ".join(sorted(m for m in sys.modules if m == "torch" or m.startswith("v41_conformance"))))
"""


def test_the_plugin_imports_nothing_heavy_unasked_and_local_xdist_workers_share_the_controllers_children(tmp_path):
    (tmp_path / "test_own.py").write_text("def test_own():\n    pass\n")
    (tmp_path / "conftest.py").write_text(PROBE.format(folder=str(tmp_path)))
    plain = pytest_run(cwd=tmp_path)
    assert plain.returncode == 0, plain.stdout[-2000:]
    assert (tmp_path / "controller.modules").read_text().split() == [
        "v41_conformance",
        "v41_conformance.pytest_cases",
        "v41_conformance.pytest_names",
    ]
    spread = pytest_run(
        "--conformance-impl", "reference", "--conformance-select", "quant.e2m1,norm.rms", "-n", "2", cwd=tmp_path
    )
    assert spread.returncode == 0 and "passed" in spread.stdout, spread.stdout[-2000:]
    for worker in ("gw0", "gw1"):
        loaded = (tmp_path / f"{worker}.modules").read_text().split()
        assert "torch" not in loaded and "v41_conformance.pytest_run" in loaded, loaded
        # a worker on the controller's machine uses the controller's children: no fork server of its own
        assert "v41_conformance.shared_pool" in loaded and "v41_conformance.forkserver" not in loaded, loaded


def test_xdist_chunks_are_balanced_and_the_rest_stays_heaviest_first():
    ids = [f"c/{i:02d}" for i in range(40)]
    costs = {case_id: 100.0 - i for i, case_id in enumerate(ids)}  # heaviest first, as the plan holds them
    plan = Plan({}, ids, costs, [])
    assert plan.order(1) == ids
    order = plan.order(2)
    assert sorted(order) == sorted(ids) and order[10:] == ids[10:]  # 40 // 2 // 4 = 5 per initial chunk
    first, second = order[:5], order[5:10]
    assert abs(sum(costs[c] for c in first) - sum(costs[c] for c in second)) <= costs[ids[0]] - costs[ids[9]]


def test_the_session_exit_status_is_the_verdict_unless_pytest_failed_for_its_own_reasons():
    assert session_exit_status(0, 0) == 0
    assert session_exit_status(5, 1) == 1  # no test collected: the verdict (nothing judged) decides
    assert session_exit_status(2, 130) == 130 and session_exit_status(0, 143) == 143
    assert session_exit_status(1, 0) == 1 and session_exit_status(4, 0) == 4


def test_the_api_judges_outputs_and_says_what_it_cannot_judge():
    case = api.case("quant.fp4_e8m0/midpoints-2x64")
    assert not case.stepped and case.params == {} and set(case.inputs()) == {"x"}
    good = api.check_outputs(case, case.expected())
    assert good.ok and good.status == "pass" and good.outputs["y"]["ok"]
    wrong = {**case.expected(), "y": case.expected()["y"] * 2}
    bad = api.check_outputs(case, wrong)
    assert not bad.ok and bad.status == "fail" and "output 'y'" in bad.message
    stepped = api.case("compressor/r2-q6-p5-d4-rb2-d3")
    assert stepped.stepped and stepped.params["ratio"] == 2
    with pytest.raises(UsageError, match="a stepped case is several calls"):
        api.check_outputs(stepped, {})
    from v41_conformance.adapters.reference import ReferenceAdapter

    assert api.check(stepped, ReferenceAdapter()).ok
    assert api.check("norm.rms/latent-4x512", lambda c, i, p: ReferenceAdapter().run(c, i, p)).ok
    with pytest.raises(UsageError, match="no case"):
        api.case("quant.e2m1/no-such-case")
    with pytest.raises(UsageError, match="must have supports"):
        api.check(case, object())


def test_workers_elsewhere_get_the_options_whatever_paths_exist_here(tmp_path):
    """xdist hands a gateway with a chdir (an ssh one always has) the controller's arguments, rewriting each
    that names an existing path against its rsync roots and stopping the session at one it cannot place
    (pytest-xdist 3.8: "arg ... not relative to an rsync root"). Here the report dir (relative: the plugin
    opens it before any worker starts), the config file (absolute), a select pattern and the implementation's
    name all name something that exists (tests/test_distributed.py: both forms of each over real ssh)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "conformance.yaml").write_text("timeout: 60\n")
    (project / "quant.e2m1").mkdir()  # a folder named like the select pattern
    (project / "reference").mkdir()  # ... and like the implementation
    gateways = []
    for i in range(2):
        (tmp_path / f"w{i}").mkdir()
        gateways += ["--tx", f"popen//chdir={tmp_path / f'w{i}'}"]
    proc = pytest_run(
        "--conformance-impl", "reference", "--conformance-select", "quant.e2m1",
        "--conformance-config", str(project / "conformance.yaml"), "--conformance-report-dir", "reports",
        "--dist", "load", *gateways, cwd=project,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rsync root" not in proc.stdout + proc.stderr
    doc = results(project / "reports")
    assert set(statuses(doc).values()) == {"pass"} and all(c.startswith("quant.e2m1/") for c in statuses(doc))


def test_the_plugins_options_reach_workers_as_one_argument_each():
    from v41_conformance.pytest_remote import joined

    args = ("-q", "--conformance-report-dir", "ssh", "--tx", "ssh=h", "--conformance-select", "a*", "tests/x.py",
            "--conformance-config=c.yaml", "-k", "quant", "--", "--conformance-impl", "kept")  # fmt: skip
    assert joined(args) == ("-q", "--conformance-report-dir=ssh", "--tx", "ssh=h", "--conformance-select=a*",
                            "tests/x.py", "--conformance-config=c.yaml", "-k", "quant", "--", "--conformance-impl",
                            "kept")  # fmt: skip
    assert joined(("--conformance-impl",)) == ("--conformance-impl",)  # no value: pytest reports it
