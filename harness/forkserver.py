"""How isolation children start: forked from a preloaded fork server, or spawned.

A fresh interpreter that imports torch and the harness costs over a second of CPU; a fork of a
server that has already imported them costs milliseconds. So children are started with
multiprocessing's `forkserver` method, whose server process imports `PRELOAD` once. That is safe
where `fork` is not: the server is a fresh single-threaded interpreter that never initialises
CUDA (importing torch does not), so every child may use the GPU and its own threads. Where
forkserver is not available (Windows), or `CONFORMANCE_START_METHOD=spawn` asks for it, children
are spawned as before.

This module imports nothing heavy. `conformance run` starts the server as a fork of itself
(`warm_up(here=True)`), once it has imported `PRELOAD` and before it starts a thread or an
implementation: a run then imports torch once, not in two processes at once (on a busy machine the
second import is a second of CPU the run waits for). Where that is not safe (another Python thread
runs, or the CUDA driver is initialised in this process: by torch, by another library, by a team's
conftest or by the user; `v41_conformance.cuda_driver` asks the driver itself) the server is a fresh
interpreter that imports `PRELOAD` itself, and `how()` says so and why (every report's header).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import warnings

PRELOAD = [
    "v41_conformance._forkserver_guard",
    "torch",
    "v41_conformance.isolation",
    "v41_conformance.components",
    "v41_conformance.execution",
]  # what every child imports: once, in the server
_LOCK = threading.Lock()
_HOW: dict[str, str] = {}  # how this process's fork server was started (`how`)


def method() -> str:
    wanted = os.environ.get("CONFORMANCE_START_METHOD", "").strip()
    if wanted in ("spawn", "forkserver"):
        return wanted if wanted in mp.get_all_start_methods() else "spawn"
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def context():
    """The multiprocessing context children are started from (the server is started on first use)."""
    chosen = method()
    ctx = mp.get_context(chosen)
    if chosen == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def warm_up(here: bool = False) -> None:
    """Start the fork server now, so the first child is a fork. `here`: fork it from this process,
    after importing `PRELOAD` here (`preload`), which only a process that knows every thread it runs
    may ask (the `conformance` command; a host such as a pytest-xdist worker may run threads that
    `threading` does not list); otherwise a fresh interpreter preloads in the background. Call it
    from the main thread: the server dies with the thread that started it."""
    if method() != "forkserver":
        return
    context()
    from multiprocessing import forkserver

    with _LOCK:
        if _HOW:  # started already (a fork server that died since is restarted as a fresh interpreter)
            forkserver.ensure_running()
            return
        unsafe = _unsafe_to_fork() if here else ""
        if here and not unsafe:
            preload()
            _ensure_running_as_fork(forkserver)
            _HOW.update(
                start="forkserver",
                server="a fork of the run's process",
                why="it had imported torch and the harness, runs no other thread and has not initialised "
                "the CUDA driver",
            )
        else:
            forkserver.ensure_running()
            why = (
                unsafe
                if unsafe
                else "inside a host process (a pytest session, a program calling the harness) the fork server is "
                "never a fork of it"
            )
            _HOW.update(start="forkserver", server="a fresh interpreter", why=why)


def how() -> dict[str, str]:
    """How this process's isolation children start: {start (the multiprocessing start method),
    server (what the fork server is), why}; said once per run (results.json's `children`)."""
    chosen = method()
    if chosen == "spawn":
        wanted = os.environ.get("CONFORMANCE_START_METHOD", "").strip() == "spawn"
        return {
            "start": "spawn",
            "server": "none (each child is a fresh interpreter)",
            "why": "CONFORMANCE_START_METHOD=spawn" if wanted else "this platform has no forkserver",
        }
    if _HOW:
        return dict(_HOW)
    return {"start": chosen, "server": "not started by this process", "why": "no isolation child was started here"}


def preload() -> None:
    """Import what the fork server preloads (but the guard, which only the server may import)."""
    import importlib

    for name in PRELOAD[1:]:
        importlib.import_module(name)


def _unsafe_to_fork() -> str:
    """Why this process may not become the fork server's image ('' when it may): another Python
    thread, or an initialised CUDA driver, which no fork of it could use (the native threads of a
    BLAS library, which torch's import starts, are in the fresh server too: they handle fork)."""
    if threading.active_count() != 1:
        return "another thread runs in the run's process (a fork of it could inherit a lock mid-use)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "torch has initialised CUDA in the run's process (no child forked from it could use CUDA)"
    from .cuda_driver import initialised

    if initialised():
        return "the CUDA driver is initialised in the run's process (no child forked from it could use CUDA)"
    return ""


def _ensure_running_as_fork(forkserver) -> None:
    """`multiprocessing.forkserver.ensure_running`, its server a fork of this process instead of a
    new interpreter: the server runs the very command the interpreter would (so the protocol is
    the standard library's, whatever the Python version), with only the descriptors it would get."""
    from multiprocessing import resource_tracker, util

    resource_tracker.ensure_running()  # a fresh interpreter of its own, as always
    spawn = util.spawnv_passfds

    def fork(path, args, passfds):
        command = args[-1]  # -c "from multiprocessing.forkserver import main; main(...)"
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        with warnings.catch_warnings():  # Python >= 3.12 warns of any thread, the BLAS pool's included
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            _close_all_but({0, 1, 2, *passfds})
            _name_this_process(b"v41-forkserver")  # in ps and /proc/<pid>/comm: its command line is the CLI's
            exec(command, {"__name__": "__forkserver__"})
            code = 0
        except SystemExit:  # the server's normal end: every client has gone
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)

    util.spawnv_passfds = fork
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = spawn


def start(process) -> None:
    """`process.start()`, one at a time (several pool threads may start children at once); the
    server must already run (`warm_up`), or it would be tied to the calling thread's life."""
    with _LOCK:
        process.start()


def _close_all_but(keep: set[int]) -> None:
    """Close every file descriptor of this process but `keep` (what a new interpreter would not inherit)."""
    listing = next((d for d in ("/proc/self/fd", "/dev/fd") if os.path.isdir(d)), None)
    fds = [int(f) for f in os.listdir(listing)] if listing else range(3, 4096)
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, already closed
                pass


def _name_this_process(name: bytes) -> None:
    """The process's name (Linux `PR_SET_NAME`, 15 bytes at most); nothing elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
