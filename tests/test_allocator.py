"""The allocator setting of processes that run cases (v41_conformance.allocator): glibc takes it, other
platforms are left alone, and importing the package changes nothing."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from v41_conformance import allocator


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's mallopt: this C library has none",
)
def test_glibc_takes_the_thresholds_in_a_process_of_its_own():
    code = "from v41_conformance.allocator import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_elsewhere_it_does_nothing(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False


def test_importing_the_package_or_its_plugin_leaves_the_fork_servers_guard_alone():
    """Only the conformance command's entry and the fork server's guard call it: importing the package,
    its runner or its pytest plugin (a team's pytest process) loads neither."""
    code = (
        "import v41_conformance, v41_conformance.pytest_cases, v41_conformance.runner, sys; "
        "print('v41_conformance._forkserver_guard' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
