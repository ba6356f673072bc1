"""How isolation children start: forked from a preloaded fork server, or spawned.

A fresh interpreter that imports torch and the harness costs over a second of CPU; a fork of a
server that has already imported them costs milliseconds. So children are started with
multiprocessing's `forkserver` method, whose server process imports `PRELOAD` once. That is safe
where `fork` is not: the server is a fresh single-threaded interpreter that never initialises
CUDA (importing torch does not), so every child may use the GPU and its own threads. Where
forkserver is not available (Windows), or `CONFORMANCE_START_METHOD=spawn` asks for it, children
are spawned as before.

This module imports nothing heavy, so the CLI can start the server first thing, and the server
imports torch while the CLI imports it too (on two cores, in parallel).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

PRELOAD = ["v41_conformance._forkserver_guard", "torch", "v41_conformance.isolation", "v41_conformance.components",
           "v41_conformance.execution"]  # what every child imports: once, in the server
_LOCK = threading.Lock()


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


def warm_up() -> None:
    """Start the fork server now (it preloads in the background), so the first child is a fork.
    Call it from the main thread: the server dies with the thread that started it."""
    if method() != "forkserver":
        return
    context()
    from multiprocessing import forkserver

    with _LOCK:
        forkserver.ensure_running()


def start(process) -> None:
    """`process.start()`, one at a time (several pool threads may start children at once); the
    server must already run (`warm_up`), or it would be tied to the calling thread's life."""
    with _LOCK:
        process.start()
