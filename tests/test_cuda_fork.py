"""Isolation children can use CUDA whoever initialised the driver first, tested on the CPU with a
stand-in driver (tests/standin/libcuda_standin.c, built here with gcc): like the real one, a process
forked from one that initialised it gets CUDA_ERROR_NOT_INITIALIZED from `cuInit`.

The implementation (tests/impls/cuda_standin.py) calls the stand-in's `cuInit` in every case and
raises "CUDA error: initialization error" when it fails. The run's own process initialises the
driver first (what `torch.cuda.is_available()` did as the old `--device cuda` check, or a library,
or the user), or a team's conftest does under the pytest plugin; every case still passes, isolated,
serially and with two children. With the guard taken out (`forkserver._unsafe_to_fork` blind to the
driver) the same run fails every case, which shows the stand-in traps what the guard prevents. The
device check itself initialises the driver only in a throwaway child.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, results, statuses

IMPL = f"{ROOT}/tests/impls/cuda_standin.py:InitialisesCuda"
SELECT = "quant.e2m1"  # three small cases


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    """The stand-in `libcuda.so.1`, in a folder of its own."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is required to build the stand-in CUDA driver (apt-get install gcc)")
    folder = tmp_path_factory.mktemp("standin")
    library = folder / "libcuda.so.1"
    proc = subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(library),
            str(ROOT / "tests" / "standin" / "libcuda_standin.c"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return library


def environment(driver: Path, log: Path) -> dict:
    """A process that finds the stand-in as `libcuda.so.1` (as the real driver is found), whose
    probe asks it (the test-only variable), and whose every `cuInit` is logged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a session of its own
    env.update(
        LD_LIBRARY_PATH=f"{driver.parent}{os.pathsep}{os.environ.get('LD_LIBRARY_PATH', '')}",
        CONFORMANCE_TEST_LIBCUDA=str(driver),
        STANDIN_CUDA_LOG=str(log),
        PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    return env


def inits(log: Path) -> list[tuple[int, int]]:
    """(pid, cuInit's return code) for every cuInit the stand-in answered."""
    if not log.exists():
        return []
    return [(int(pid), int(code)) for pid, _, code in (line.split() for line in log.read_text().splitlines())]


def python(code: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_stand_in_poisons_forks_and_the_probe_sees_it_without_loading_the_driver(driver, tmp_path):
    log = tmp_path / "cuinit.log"
    proc = python(
        """
        import ctypes, os
        from v41_conformance import cuda_driver, forkserver
        assert cuda_driver.loaded() is None and not cuda_driver.initialised()  # never loaded by the question
        lib = ctypes.CDLL("libcuda.so.1")  # what torch does on its first CUDA call
        assert not cuda_driver.initialised() and forkserver._unsafe_to_fork() == ""
        assert cuda_driver.driver_version() == "12.4"
        assert lib.cuInit(0) == 0
        assert cuda_driver.initialised() and "CUDA driver is initialised" in forkserver._unsafe_to_fork()
        pid = os.fork()
        if pid == 0:
            os._exit(lib.cuInit(0))  # a fork of an initialised process: CUDA_ERROR_NOT_INITIALIZED
        print(os.getpid(), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """,
        environment(driver, log),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    parent, child_code = (int(x) for x in proc.stdout.split())
    assert child_code == 3
    assert [code for pid, code in inits(log)] == [0, 3] and inits(log)[0][0] == parent


def test_the_device_check_initialises_the_driver_only_in_a_throwaway_child(driver, tmp_path):
    log = tmp_path / "cuinit.log"
    proc = python(
        """
        import os
        from v41_conformance import cuda_driver
        from v41_conformance.cli import _check_device
        from v41_conformance.errors import UsageError
        try:
            _check_device("cuda")
            message = "usable"
        except UsageError as exc:
            message = str(exc)
        print(os.getpid(), cuda_driver.initialised())
        print(message)
        import ctypes
        assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0  # the user initialised it: asked here, not in a fork
        try:
            _check_device("cuda")
            print("usable")
        except UsageError as exc:
            print(exc)
    """,
        environment(driver, log),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    first, message, again = proc.stdout.splitlines()[:3]
    pid, initialised = first.split()
    assert initialised == "False"  # the run's process can still fork children that use CUDA
    calls = inits(log)
    assert calls[0][0] != int(pid) and calls[0][1] == 0, calls  # the driver was asked, in another process
    assert calls[1:] == [(int(pid), 0), (int(pid), 0)], calls  # then the user's cuInit, and the check's own here
    assert again == message  # the same answer either way
    import torch

    if not torch.backends.cuda.is_built():  # this machine's CPU wheel: refused, saying what the driver saw
        assert "no CUDA device is available to this torch" in message and "driver sees 1 device" in message


CLI = """
    import ctypes, sys
    assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0  # the run's process initialises the driver first
    from v41_conformance import forkserver
    if {unguarded}:  # the guard taken out: only torch's own flag and threads are asked, as before
        forkserver._unsafe_to_fork = lambda: ""
    from v41_conformance.cli import entry
    sys.argv = ["conformance", "run", "--impl", {impl!r}, "--select", {select!r}, "-n", {workers!r},
                "--report-dir", "rep"]
    entry()
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_cli_children_use_cuda_after_the_runs_own_process_initialised_the_driver(driver, tmp_path, workers):
    log = tmp_path / "cuinit.log"
    proc = python(
        CLI.format(unguarded=False, impl=IMPL, select=SELECT, workers=workers), environment(driver, log), tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = results(tmp_path / "rep")
    assert set(statuses(doc).values()) == {"pass"} and len(doc["cases"]) == 3
    assert doc["children"]["server"] == "a fresh interpreter"
    assert "CUDA driver is initialised" in doc["children"]["why"]
    assert proc.stdout.count("children: forkserver, the server a fresh interpreter") == 1  # said once, in the header
    calls = inits(log)
    assert calls[0][1] == 0 and all(code == 0 for _, code in calls), calls
    assert len({pid for pid, _ in calls[1:]}) == (2 if workers == "2" else 1)  # the children, each its own driver


def test_without_the_guard_every_case_is_a_cuda_initialisation_error(driver, tmp_path):
    log = tmp_path / "cuinit.log"
    proc = python(CLI.format(unguarded=True, impl=IMPL, select=SELECT, workers="0"), environment(driver, log), tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = results(tmp_path / "rep")
    assert set(statuses(doc).values()) == {"error"}
    assert all("CUDA error: initialization error" in c["message"] for c in doc["cases"])
    assert doc["children"]["server"] == "a fork of the run's process"
    assert [code for _, code in inits(log)][1:] == [3, 3, 3]  # restarting the child does not help


CONFTEST = """
import ctypes

# A team's conftest: `torch.cuda.is_available()` to skip GPU tests initialises the driver in pytest's process.
assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_plugins_children_use_cuda_after_a_conftest_initialised_the_driver(driver, tmp_path, workers):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    log = tmp_path / "cuinit.log"
    spread = ["-n", "2"] if workers == "2" else ["-p", "no:xdist"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            *spread,
            "--conformance-impl",
            IMPL,
            "--conformance-select",
            SELECT,
            "--conformance-report-dir",
            "rep",
        ],
        cwd=tmp_path,
        env=environment(driver, log),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = results(tmp_path / "rep")
    assert set(statuses(doc).values()) == {"pass"}
    assert doc["children"]["server"] == "a fresh interpreter" and "host process" in doc["children"]["why"]
    header = proc.stdout.split("collected", 1)[0].split("created:", 1)[0]  # before the items (and xdist's workers)
    assert header.count("conformance: children: forkserver, the server a fresh interpreter") == 1, proc.stdout[:3000]
    assert all(code == 0 for _, code in inits(log)), inits(log)
