"""`make lint` inside `make test`: ruff (pyflakes' rules, the format) and mypy over the package. They run
as tests so that they share the suite's workers instead of adding their time before it; `make lint`
runs the same three commands directly (pyproject.toml configures them). They need the `lint` extra
(`pip install -e ".[lint]"`, which `make install` does)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.xdist_group("lint")  # one worker: mypy and ruff share nothing with the cases


def _tool(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed in this environment: pip install -e '.[lint]' (make install does)")


def _run(*command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_and_the_code_is_formatted():
    _tool("ruff")
    check = _run(sys.executable, "-m", "ruff", "check", "--no-cache", ".")
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
    formatted = _run(sys.executable, "-m", "ruff", "format", "--no-cache", "--check", ".")
    assert formatted.returncode == 0, "run `ruff format .`:\n" + formatted.stdout[-4000:] + formatted.stderr[-2000:]


def test_mypy_passes_on_the_package():
    _tool("mypy")
    typed = _run(str(ROOT / "tools" / "typecheck"))
    assert typed.returncode == 0, typed.stdout[-6000:] + typed.stderr[-2000:]
    assert (ROOT / "harness" / "py.typed").is_file()  # adapters get the package's types (PEP 561)


def test_every_slow_entry_names_a_test_that_exists():
    """tests/slow_tests.py moves tests from `make test` to `make test-slow` by name: a renamed test would
    silently come back into `make test` and its time with it."""
    import re

    from slow_tests import SLOW, slow_reason

    for entry in SLOW:
        file, _, name = entry.partition("::")
        source = (ROOT / "tests" / file).read_text()
        function = name.split("[", 1)[0]
        assert not function or re.search(rf"^def {re.escape(function)}\(", source, re.M), entry
    assert slow_reason("tests/test_package.py::test_anything") and not slow_reason("tests/test_lint.py::x")
    assert slow_reason("tests/test_spaces.py::test_draws_build_and_the_reference_passes_them[attention]")
    assert not slow_reason("tests/test_spaces.py::test_draws_build_and_the_reference_passes_them[indexer]")
