"""An implementation that tells the test how it was started (through the case message)."""

from __future__ import annotations

import os

from v41_conformance.adapters.reference import ReferenceAdapter


def _parent() -> str:
    """What started this process: 'forkserver' when the fork server forked it (Linux /proc: the
    server's command line, or its name where it is a fork of the `conformance` command)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
            command = fh.read().replace(b"\0", b" ").decode()
        with open(f"/proc/{os.getppid()}/comm") as fh:
            command += " " + fh.read()
    except OSError:
        return "unknown"
    return "forkserver" if "forkserver" in command else "other"


def _server() -> str:
    """How the process that forked this one was started: 'fork' when it is a fork of another
    process that runs the same command line (the `conformance` command's own fork server), else
    'exec' (a fresh interpreter)."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as fh:
            grandparent = fh.read().rsplit(")", 1)[1].split()[1]
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as a, open(f"/proc/{grandparent}/cmdline", "rb") as b:
            return "fork" if a.read() == b.read() else "exec"
    except OSError:
        return "unknown"


class Introspect(ReferenceAdapter):
    """Fails every norm.rms case with: pid, parent pid, pool slot, an environment variable, cwd."""

    def run(self, component, inputs, params):
        if component != "norm.rms":
            return super().run(component, inputs, params)
        raise RuntimeError(
            f"pid={os.getpid()} ppid={os.getppid()} slot={os.environ.get('CONFORMANCE_SLOT')} "
            f"marker={os.environ.get('INTROSPECT_MARKER')} cwd={os.getcwd()} "
            f"parent={_parent()} server={_server()}"
        )
