"""Shared fixtures: a throw-away copy of the project to break, and a CLI runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "impls"))  # the wrong implementations import their siblings


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 300, fresh: bool = False) -> subprocess.CompletedProcess:
    """`conformance ARGS` as a user types it. In this test process (click's runner: the same exit
    code, stdout and stderr, without a new interpreter importing torch), unless `fresh` asks for a
    process of its own (what a test of process-wide state needs: signals, ATEN_CPU_CAPABILITY)."""
    if not fresh:
        return _run_in_process(args, cwd)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", "v41_conformance", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_in_process(args: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess:
    from click.testing import CliRunner

    from v41_conformance.cli import main

    before = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["conformance", *args], result.exit_code, result.stdout, result.stderr)


def make_project(dest: Path, components: list[str] | None = None, promoted: bool = True) -> Path:
    """Copy conformance.yaml, cases and goldens (optionally only some components) into dest; without the
    cases the fuzz once found (`cases/*_fuzz.yaml`, cases named fuzz-*) when not `promoted`."""
    shutil.copy(ROOT / "conformance.yaml", dest / "conformance.yaml")
    shutil.copytree(ROOT / "examples", dest / "examples", ignore=shutil.ignore_patterns("build", "__pycache__"))
    (dest / "cases").mkdir()
    (dest / "goldens").mkdir()
    manifest = json.loads((ROOT / "goldens" / "MANIFEST.json").read_text())
    keep = {}
    for case_id, entry in manifest["cases"].items():
        component = case_id.split("/")[0]
        if (components is None or component in components) and (
            promoted or not case_id.split("/")[1].startswith("fuzz-")
        ):
            keep[case_id] = entry
            target = dest / "goldens" / entry["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "goldens" / entry["file"], target)
    (dest / "goldens" / "MANIFEST.json").write_text(json.dumps({**manifest, "cases": keep}, indent=1))
    for path in (ROOT / "cases").glob("*.yaml"):
        text = path.read_text()
        first = text.split("\n", 1)[0]
        if (components is None or any(first == f"component: {c}" for c in components)) and (
            promoted or not path.name.endswith("_fuzz.yaml")
        ):
            shutil.copy(path, dest / "cases" / path.name)
    return dest


def results(report_dir: Path) -> dict:
    return json.loads((report_dir / "results.json").read_text())


def statuses(doc: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in doc["cases"]}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path)


_OWN_CACHE: list[str] = []


def pytest_configure(config):
    import tempfile

    import torch

    torch.set_num_threads(1)  # xdist workers share 2 cores; oversubscription makes tests crawl
    # No diagnosis of failing cases unless a test asks for it (tests/test_diagnosis.py): the suite runs
    # hundreds of deliberately wrong implementations, and each diagnosis re-runs the reference.
    os.environ["CONFORMANCE_DIAGNOSIS_BUDGET"] = "0"
    if "CONFORMANCE_CACHE" not in os.environ:
        # The rebuilt-input cache (harness/cache.py) of this test session, shared by its xdist
        # workers (they inherit the variable) and by every run the tests start; not the user's.
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="conformance-test-cache-"))
        os.environ["CONFORMANCE_CACHE"] = _OWN_CACHE[0]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """Mark `slow` what tests/slow_tests.py names (`make test-slow`; `make test` deselects it)."""
    from slow_tests import slow_reason

    for item in items:
        if slow_reason(item.nodeid) is not None:
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config):
    for folder in _OWN_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


def _build_example(tmp_path_factory, folder: str, files: tuple[str, ...], program: str) -> Path:
    """Build an example program in a private copy (parallel workers never share a build)."""
    build = tmp_path_factory.mktemp(folder)
    for name in files:
        shutil.copy(ROOT / "examples" / folder / name, build / name)
    proc = subprocess.run(["make", "-C", str(build)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return build / "build" / program


@pytest.fixture(scope="session")
def c_binary(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.fail("gcc is required to build the C example (apt-get install gcc)")
    return _build_example(
        tmp_path_factory, "c", ("conformance_c.c", "safetensors_io.c", "safetensors_io.h", "Makefile"), "conformance_c"
    )


@pytest.fixture(scope="session")
def rust_binary(tmp_path_factory):
    if shutil.which("rustc") is None:
        pytest.skip("no rustc on this machine: the Rust example (examples/rust) is not built or run")
    return _build_example(tmp_path_factory, "rust", ("conformance_rs.rs", "Makefile"), "conformance_rs")
