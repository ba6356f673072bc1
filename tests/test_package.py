"""The harness as a test dependency (docs/packaging.md): the sdist and the wheel carry the small tier,
a fresh environment with only the wheel installed runs every case from an empty folder, a user's own
implementation and pytest suite run against it, and a run over two xdist process gateways (the code
path ssh gateways use) matches a serial one.

The environment (tests/wheel_env.py) is a new virtualenv holding the wheel alone. Real ssh gateways:
tests/test_distributed.py (`make test-distributed`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import zipfile
from xml.etree import ElementTree
from pathlib import Path

import pytest

from conftest import ROOT, results, statuses
from v41_conformance.execution import CaseExecutor
import wheel_env
from wheel_env import MANIFEST

installed = wheel_env.installed  # the fixture: one wheel and venv per worker

pytestmark = pytest.mark.xdist_group("package")  # one worker builds the environment (make test: --dist loadgroup)


def test_the_sdist_and_the_wheel_carry_the_small_tier_and_only_the_pin_of_the_production_tier(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    store = "v41_conformance/_store/"
    goldens = {n for n in names if n.startswith(store + "goldens/") and n.endswith(".safetensors")}
    assert goldens == {f"{store}goldens/{e['file']}" for e in MANIFEST.values()}
    assert {
        f"{store}goldens/MANIFEST.json",
        f"{store}goldens/production/MANIFEST.json",
        f"{store}conformance.yaml",
    } <= names
    assert {f"{store}cases/{p.relative_to(ROOT / 'cases')}" for p in (ROOT / "cases").rglob("*.yaml")} <= names
    assert "v41_conformance/pytest_cases.py" in names and not [n for n in names if n.startswith("harness/")]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "v41_conformance.pytest_cases" in zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    with tarfile.open(installed.sdist) as archive:
        members = [m.split("/", 1)[1] for m in archive.getnames() if "/" in m]
    assert {f"goldens/{e['file']}" for e in MANIFEST.values()} <= set(members)
    assert "goldens/production/MANIFEST.json" in members
    assert not [m for m in members if m.startswith("goldens/production/") and m.count("/") > 2]


def test_from_an_empty_folder_the_installed_package_passes_every_case(installed):
    empty = installed.folder("empty")
    proc = installed.run(installed.conformance, "run", "--impl", "reference", "--report-dir", "rep", cwd=empty)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = results(empty / "rep")
    assert set(statuses(doc).values()) == {"pass"} and set(statuses(doc)) == set(MANIFEST)
    assert doc["exit_code"] == 0 and "PASS" in proc.stdout and not doc["problems"]
    for name in ("summary.md", "junit.xml", "report.html"):
        assert (empty / "rep" / name).stat().st_size > 0
    ElementTree.fromstring((empty / "rep" / "junit.xml").read_text())  # well-formed
    assert doc["store"]["origin"] == "package" and doc["store"]["version"] == doc["versions"]["harness"]
    assert doc["store"]["manifest_sha256"] == doc["goldens"]["manifest_sha256"]
    where = installed.run(
        installed.python, "-c", "import v41_conformance; print(v41_conformance.__file__)", cwd=empty
    ).stdout
    assert str(installed.root) in where and str(ROOT) not in where  # the wheel's harness, not the checkout's
    # the packaged store is not rewritten; its production tier is built into the user cache, pin copied in
    refused = installed.run(installed.conformance, "generate", "--select", "quant.e2m1/*", cwd=empty)
    assert refused.returncode == 2 and "the golden store installed with the package" in refused.stderr
    cache = installed.root / "cache"
    probe = (
        "import os, sys; os.environ['CONFORMANCE_CACHE'] = sys.argv[1]; from v41_conformance.config import load_config; "
        "print(load_config().for_tier('production').goldens)"
    )
    production = Path(installed.run(installed.python, "-c", probe, str(cache), cwd=empty).stdout.strip())
    assert cache in production.parents and production.name == "production"
    assert (production / "MANIFEST.json").read_bytes() == (
        ROOT / "goldens" / "production" / "MANIFEST.json"
    ).read_bytes()


def test_a_team_project_runs_its_own_implementation_and_its_own_pytest_suite(installed):
    team = installed.root / "team"
    shutil.copytree(ROOT / "examples" / "team", team, ignore=shutil.ignore_patterns("__pycache__"))
    proc = installed.run(
        installed.conformance, "run", "--impl", "kernels", "--select", "quant.*", "--report-dir", "rep", cwd=team
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = statuses(results(team / "rep"))
    assert {s for c, s in got.items() if c.startswith("quant.e2m1/")} == {"pass"}
    assert {s for c, s in got.items() if not c.startswith("quant.e2m1/")} == {"unsupported"}
    # its own tests (the Python API, and tests/ with its own module called `harness`), plain and with the
    # cases as tests, one per case, judging the fixture's object
    e2m1 = sum(c.startswith("quant.e2m1/") for c in MANIFEST)
    plain = installed.run(installed.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=team)
    assert plain.returncode == 0 and f"{e2m1 + 2} passed" in plain.stdout, plain.stdout[-3000:]
    proc = installed.run(
        installed.python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--kernels-device",
        "cpu",
        "--conformance-impl",
        "kernels",
        "--conformance-select",
        "quant.e2m1",
        cwd=team,
    )
    assert proc.returncode == 0 and f"{e2m1 + e2m1 + 2} passed" in proc.stdout, proc.stdout[-3000:]


MIXED = """
from v41_conformance import Unsupported
from v41_conformance.adapters.reference import ReferenceAdapter


class Mixed(ReferenceAdapter):
    \"\"\"Passes some cases, fails, raises and declines others: verdicts worth comparing.\"\"\"

    def run(self, component, inputs, params):
        if component == "window.indices" and params["mode"] == "chunk":
            raise Unsupported("no chunk mode")
        if component == "topk.torch_cpu" and params["k"] > 32:
            raise RuntimeError("k too large for this kernel")
        out = super().run(component, inputs, params)
        if component == "quant.fp4_e8m0":
            out["y"] = out["y"] * 2
        return out
"""


def test_pytest_in_a_throwaway_project_gets_one_test_per_case_and_two_gateways_judge_like_one(installed):
    project = installed.folder("throwaway")
    (project / "test_nothing_else.py").write_text("def test_own():\n    pass\n")
    proc = installed.run(
        installed.python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--conformance-impl",
        "reference",
        "--conformance-report-dir",
        "rep",
        "--conformance-no-isolate",
        "-rA",
        cwd=project,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"{len(MANIFEST) + 1} passed" in proc.stdout
    passed = {line.split("::", 1)[1] for line in proc.stdout.splitlines() if line.startswith("PASSED conformance::")}
    assert passed == set(MANIFEST)  # the test ids are the case ids
    doc = results(project / "rep")
    assert set(statuses(doc).values()) == {"pass"} and doc["store"]["origin"] == "package"
    # over two xdist process gateways (the code path of ssh ones): the serial verdicts and messages;
    # the project's own conformance.yaml (layered on the packaged one) names it, with an expectation
    (project / "mixed.py").write_text(MIXED)
    (project / "conformance.yaml").write_text(
        "impls:\n  mixed:\n    python: mixed.py:Mixed\n    expectations:\n"
        "      - {pattern: 'quant.fp4_e8m0/*', status: fail, reason: 'doubles y, issue 1'}\n"
    )
    common = [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--conformance-impl",
        "mixed",
        "--conformance-select",
        "quant.*,topk.*,window.indices",
        "--conformance-no-isolate",
    ]
    serial = installed.run(
        installed.python, *common[:-1], "--conformance-report-dir", "serial", cwd=project
    )  # isolated
    spread = installed.run(
        installed.python,
        *common,
        "--conformance-report-dir",
        "spread",
        "--dist",
        "load",
        "--tx",
        f"2*popen//python={installed.python}",
        "-v",
        cwd=project,
    )  # -q -v: "created:"
    assert serial.returncode == spread.returncode == 1, spread.stdout[-3000:]
    assert "created: 2/2 workers" in spread.stdout, spread.stdout[-2000:]
    a, b = results(project / "serial"), results(project / "spread")
    assert statuses(a) == statuses(b) and {"pass", "xfail", "error", "unsupported"} == set(statuses(a).values())
    assert [c["message"] for c in a["cases"]] == [c["message"] for c in b["cases"]]
    assert {s for c, s in statuses(a).items() if c.startswith("quant.fp4_e8m0/")} == {"xfail"}
    assert "xfailed" in serial.stdout and a["config"]["layered_on"].endswith("v41_conformance/_store/conformance.yaml")


def test_a_worker_holding_another_store_fails_every_case_loudly(tmp_path):
    from v41_conformance.adapters.loader import resolve
    from v41_conformance.config import load_config
    from v41_conformance.session import RunOptions, run_document

    config = load_config(ROOT / "conformance.yaml")
    ids = sorted(c for c in MANIFEST if c.startswith("quant.e2m1/"))
    options = RunOptions(impl="reference", select=[], report_dir=tmp_path, isolate=False)
    doc = run_document(config, options, resolve("reference", config), ids, "t", None)
    assert CaseExecutor.from_run(doc).run(ids[0]).status == "pass"
    for field, value, says in (
        ("version", "0.0.1", "the controller judged the package store of v41-conformance 0.0.1"),
        ("manifest_sha256", "f" * 64, "manifest ffffffffffff"),
    ):
        other = json.loads(json.dumps(doc))
        other["store"] = {**other["store"], "origin": "package", field: value}
        result = CaseExecutor.from_run(other).run(ids[0])
        assert result.status == "error" and "every machine of a run must hold the same golden store" in result.message
        assert says in result.message, result.message
    other = {**doc, "harness_version": "9.9"}
    result = CaseExecutor.from_run(other).run(ids[0])
    assert result.status == "error" and "the controller runs 9.9" in result.message


STOPS = """
import os, pathlib, time
from mykernels import Kernels


class StopsMidRun(Kernels):
    def run(self, component, inputs, params):
        if inputs["v"].numel() > 1000:  # quant.e2m1/uniform-4096
            pathlib.Path(os.environ["STOP_MARK"]).touch()
            time.sleep(600)
        return super().run(component, inputs, params)
"""


def test_from_the_wheel_a_teams_pytest_run_gets_the_clis_verdict(installed):
    """The "Done when" of the plugin's verdict, in a team repository with its own tests/harness.py."""
    team = installed.root / "verdicts"
    shutil.copytree(ROOT / "examples" / "team", team, ignore=shutil.ignore_patterns("__pycache__"))

    def pytest_in_team(*args, **kwargs):
        return installed.run(
            installed.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, cwd=team, **kwargs
        )

    typo = pytest_in_team("--conformance-impl", "kernels", "--conformance-select", "quant.e2m1-*")
    assert typo.returncode == 1 and "no case was executed" in typo.stdout, typo.stdout[-2000:]
    unsupported = pytest_in_team("--conformance-impl", "kernels", "--conformance-select", "norm.rms")
    assert unsupported.returncode == 1 and "no case was executed" in unsupported.stdout, unsupported.stdout[-2000:]
    mistyped = pytest_in_team("--conformance-impl", "mykernels:Kernelz", "-n", "2")
    assert mistyped.returncode == 4 and mistyped.stderr.count("has no attribute 'Kernelz'") == 1, mistyped.stderr[
        -2000:
    ]
    assert "passed" not in mistyped.stdout and "failed" not in mistyped.stdout
    # SIGINT mid-run: every report says STOPPED, with the cases it never reached
    (team / "stops.py").write_text(STOPS)
    mark = team / "reached"
    run = subprocess.Popen(
        [
            str(installed.python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--conformance-impl",
            "stops.py:StopsMidRun",
            "--conformance-select",
            "quant.e2m1",
            "--conformance-report-dir",
            "stopped",
        ],
        cwd=team,
        env={**os.environ, "STOP_MARK": str(mark)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert run.poll() is None and time.monotonic() < deadline, "the run never reached quant.e2m1/uniform-4096"
        time.sleep(0.1)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=300)
    doc = results(team / "stopped")
    assert run.returncode == 130 == doc["exit_code"] and "interrupted by SIGINT" in doc["stopped"], out[-2000:]
    assert statuses(doc)["quant.e2m1/uniform-4096"] == "not_run" and "STOPPED" in out
    for name in ("summary.md", "report.html", "junit.xml"):
        assert "STOPPED" in (team / "stopped" / name).read_text(), name
    # a misplaced tolerance is refused; a loosened one and a switch are listed in every report
    (team / "conformance.yaml").write_text("tolerances:\n  sparse_attn:\n    o: {ulps: -3}\n")
    refused = pytest_in_team("--conformance-impl", "mykernels:Kernels")
    assert refused.returncode == 4 and "tolerances.sparse_attn: unknown key" in refused.stderr, refused.stderr[-2000:]
    assert str(team / "conformance.yaml") in refused.stderr
    (team / "conformance.yaml").write_text(
        "tolerances:\n  components:\n    sparse_attn:\n      o: {rel_l2: 1.0}\n"
        "impls:\n  kernels:\n    python: mykernels:Kernels\n    accept_ties: true\n"
    )
    listed = pytest_in_team(
        "--conformance-impl", "kernels", "--conformance-select", "quant.e2m1", "--conformance-report-dir", "overrides"
    )
    assert listed.returncode == 0, listed.stdout[-2000:]
    keys = (
        "tolerances.components.sparse_attn.o.rel_l2: 1 (packaged: ",
        "impls.kernels.accept_ties: true (packaged: false)",
    )
    assert [o["key"] for o in results(team / "overrides")["overrides"]] == [k.split(":")[0] for k in keys]
    for where in (
        listed.stdout,
        *((team / "overrides" / n).read_text() for n in ("summary.md", "report.html", "junit.xml")),
    ):
        assert all(k in where for k in keys), where[:3000]
