"""A wheel built from a clean copy of the sources (through the sdist) and a fresh virtualenv holding it
alone: the `installed` fixture of tests/test_package.py and tests/test_distributed.py.

The virtualenv's dependencies (torch, safetensors, ...) come from this interpreter's site-packages
through a .pth line, so nothing is downloaded and the checkout's own (editable) harness is never on
its path. Built once per session (per xdist worker).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
from pathlib import Path

import pytest

from conftest import ROOT
from v41_conformance.golden import read_manifest

SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "conformance.yaml", "harness", "cases", "goldens")
MANIFEST = read_manifest(ROOT / "goldens")


def _ignored(folder: str, names: list[str]) -> list[str]:
    here = Path(folder)
    built = here.name == "production" and here.parent.name == "goldens"  # locally built production goldens
    return [
        n
        for n in names
        if n in ("__pycache__", ".manifest.lock") or n.endswith(".egg-info") or (built and (here / n).is_dir())
    ]


def _copy_sources(dest: Path) -> None:
    """The files a release is built from (what a clean clone holds), without built production goldens."""
    for name in SOURCES:
        source = ROOT / name
        if source.is_file():
            shutil.copy(source, dest / name)
        else:
            shutil.copytree(source, dest / name, ignore=_ignored)


def _build(hook: str, source: Path, out: Path) -> Path:
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


class Installed:
    def __init__(self, root: Path, sdist: Path, wheel: Path):
        self.root, self.sdist, self.wheel = root, sdist, wheel
        self.python = root / "env" / "bin" / "python"
        self.conformance = root / "env" / "bin" / "conformance"

    def run(self, *args, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)

    def folder(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


@pytest.fixture(scope="session")  # once per worker, however xdist interleaves other modules' tests
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("package")
    source, dist = root / "source", root / "dist"
    source.mkdir(), dist.mkdir()
    _copy_sources(source)
    sdist = _build("build_sdist", source, dist)
    unpacked = root / "unpacked"
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    wheel = _build("build_wheel", next(unpacked.iterdir()), dist)  # the wheel is built from the sdist
    venv.EnvBuilder(with_pip=False).create(root / "env")
    env_python = root / "env" / "bin" / "python"
    site = subprocess.run(
        [str(env_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env_python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Installed(root, sdist, wheel)
