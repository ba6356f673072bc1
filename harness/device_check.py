"""Which CUDA devices a run may use, asked in a throwaway child so the run's process never initialises CUDA.

`torch.cuda.is_available()` in the run's own process would call `cuInit` there (it does unless
PYTORCH_NVML_BASED_CUDA_CHECK is set, which the harness never sets behind the user's back), and no
child forked from that process could use CUDA (`v41_conformance.cuda_driver`). A fork of this process
answers instead (milliseconds: torch is already imported) and exits; only it has touched the driver.
Where the driver is already initialised in this process, this process answers itself: a fork of it
could not use the driver.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

CHILD_LIMIT_S = 120.0  # the driver's first initialisation can take tens of seconds on a big machine


def _ask() -> dict:
    """In the throwaway child: what the driver and this torch see (this initialises the driver)."""
    from .cuda_driver import device_count

    answer = {"driver": device_count(), "torch": None, "built": False, "version": ""}
    try:
        import torch

        answer["version"] = torch.__version__
        answer["built"] = bool(torch.backends.cuda.is_built())
        answer["torch"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken CUDA install: say so rather than guess
        answer["error"] = f"{type(exc).__name__}: {exc}"
    return answer


def visible_devices() -> dict:
    """{driver: devices the driver sees (None: no libcuda), torch: devices this torch can use,
    built: torch has CUDA, version, error?}, asked of a throwaway fork of this process."""
    if not hasattr(os, "fork"):  # no fork (Windows): a fresh interpreter asks instead
        return _ask_fresh_interpreter()
    from . import cuda_driver

    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]  # an optional import: None where torch is not installed
    if cuda_driver.initialised() or (torch is not None and torch.cuda.is_initialized()):
        return _ask()  # already initialised here (the user, a library): a fork of this process could not tell
    read_end, write_end = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with warnings.catch_warnings():  # Python >= 3.12 warns of any thread, a BLAS pool's included
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(_ask()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        return json.loads(_read_all(read_end, pid) or "{}") or {"error": "the check's child answered nothing"}
    finally:
        os.close(read_end)
        _reap(pid)


def _read_all(fd: int, pid: int) -> str:
    import select

    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([fd], [], [], CHILD_LIMIT_S)
        if not ready:
            os.kill(pid, 9)
            return json.dumps({"error": f"the check did not answer within {CHILD_LIMIT_S:g} s"})
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks).decode()
        chunks.append(chunk)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _ask_fresh_interpreter() -> dict:
    import subprocess

    code = "import json; from v41_conformance.device_check import _ask; print(json.dumps(_ask()))"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_LIMIT_S)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"error": f"the device check failed: {type(exc).__name__}: {exc}"}


def problem(device: str, seen: dict) -> str:
    """Why `device` (cuda or cuda:N) cannot be used, '' when it can."""
    none = f"no CUDA device is available to this torch ({seen.get('version') or 'not importable'})"
    if seen.get("error"):
        return f"{none}: the check failed ({seen['error']})"
    if not seen.get("built"):
        drivers = f", though the CUDA driver sees {seen['driver']} device(s)" if seen.get("driver") else ""
        return f"{none}: it is built without CUDA{drivers}"
    count = int(seen.get("torch") or 0)
    if count == 0:
        return none + (": no CUDA driver (libcuda) is installed" if seen.get("driver") is None else "")
    if ":" in device and int(device[5:]) >= count:
        return f"only {count} CUDA device(s) visible"
    return ""
