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
