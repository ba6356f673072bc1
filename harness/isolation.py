"""Crash- and hang-safe execution: the implementation runs in a child process.

The parent (a pytest worker) starts a child and waits for it to load the implementation (its own,
generous limit: importing torch and a big extension on a loaded machine can take a while), then
sends one case id at a time and waits at most the case timeout, counted from the moment the child
receives the case until the implementation has run (the child says so); the harness's judgement
of the outputs after it has its own, generous bound (`judging_limit`), a harness problem if hit.
- The child dies (segfault, abort, `os._exit`, out of memory): that case is `crash`, with the exit
  code or signal; a fresh child is started for the next case.
- No answer in time: the child's whole process group is killed (SIGKILL) and the case is
  `timeout`; a fresh child takes the next case.
- A sticky CUDA error (the device is unusable after it): the case keeps its status and the child
  is replaced before the next case, so the error is charged to the case that caused it.
Children are forked from a fork server that has already imported torch and the harness
(`v41_conformance.forkserver`; never plain `fork` of the worker: CUDA and threads do not survive it), so a
fresh child after a crash costs milliseconds, not an interpreter start. Each takes the parent's
current environment and working directory, and is put in its own session, so a kill reaches
whatever it started; each is registered with
the run (`v41_conformance.rundir`), which kills every child's process group when the run ends, and dies
with its parent (Linux `PR_SET_PDEATHSIG`). Everything the implementation prints during a case
goes to that case's capture file (`v41_conformance.capture`), read back even after a crash or a timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import capture, forkserver
from .ids import split_case_id
from .case_result import CaseResult
from .rundir import register_child

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

LOAD_TIMEOUT = 180.0  # seconds a fresh child may take to import torch and load the implementation
JUDGING_MIN = 1800.0  # seconds the harness's judgement of one case's outputs may take at least


def judging_limit(timeout: float) -> float:
    """How long the harness's own judgement of a case may take once the implementation finished
    (rederiving a production case's stages costs about what the reference's run of them does)."""
    return max(JUDGING_MIN, 4 * timeout)


STICKY_CUDA_MARKERS = (
    "CUDA error",
    "device-side assert",
    "illegal memory access",
    "cudaErrorIllegalAddress",
    "unspecified launch failure",
    "CUBLAS_STATUS_EXECUTION_FAILED",
)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the worker that started it dies (best effort)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_main(conn, run_config: dict) -> None:
    """Child loop: build the executor in-process, answer case ids until told to stop."""
    os.setsid()  # own process group: the parent can kill everything this child starts
    _die_with_parent()
    # The fork server was started earlier, maybe elsewhere: take the parent's view of the world now.
    os.environ.clear()
    os.environ.update(run_config["environ"])
    os.environ["CONFORMANCE_SLOT"] = str(run_config.get("slot", 0))
    os.chdir(run_config["cwd"])
    from .execution import CaseExecutor

    executor = CaseExecutor.from_run(run_config)
    try:
        from .known import components

        components()  # import every component definition now, not inside the first case's timeout
        executor.impl()
    except Exception as exc:  # reported on the first case, so the run still writes results
        conn.send(("broken", f"{type(exc).__name__}: {exc}"))
    else:
        from .collector import settle

        settle()  # start-up is over: what it built is left out of every collection from now on
        conn.send(("ready", ""))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        case_id, output = request
        with capture.capture_fds(output) if output else contextlib.nullcontext():
            result = executor.run(case_id, on_executed=lambda: conn.send(("executed", "")))
        conn.send(("result", result.to_json()))


@dataclass
class _Child:
    process: BaseProcess  # a multiprocessing Process
    conn: Connection


class IsolatedWorker:
    """Runs cases of a run in a child process with a per-case timeout. `run` is the run's document
    (`v41_conformance.session.run_document`: plain JSON), which is all the child needs to rebuild
    the configuration and the implementation, so the process driving it needs neither (an xdist
    worker of the pytest plugin never imports torch). `slot` numbers the children of a pool (a
    child in slot K takes CUDA device K mod count under `--device cuda`)."""

    def __init__(self, run: dict, slot: int = 0):
        self.timeout = float(run["timeout"])
        self.run_config = {**run, "isolate": False, "workers": 1, "prefetch": False, "cases": [], "slot": slot}
        self.slot = slot
        self.child: _Child | None = None
        self.broken = ""
        self._lock = threading.Lock()  # stop() may come from another thread (the end of a run)

    def run(self, case_id: str, output: str | None = None) -> CaseResult:
        """The case's result; what the implementation printed is captured in `output` (a path)."""
        result = self._run(case_id, output)
        capture.attach(result, capture.read_text(output))
        return result

    def _run(self, case_id: str, output: str | None) -> CaseResult:
        component = split_case_id(case_id)[0]
        if self.child is None:
            self._start()
        if self.broken:
            return CaseResult(
                case_id, component, "error", f"the implementation could not be loaded in the worker: {self.broken}"
            )
        child = self.child
        assert child is not None  # _start made one (only stop(), ending the run, takes it away)
        try:
            child.conn.send((case_id, output))
        except (BrokenPipeError, OSError):
            self._stop(kill=True)
            return self._run(case_id, output)
        start = time.perf_counter()  # the case's clock starts when the child has it
        deadline = start + self.timeout
        executed = None  # when the implementation finished: the rest is the harness's judgement
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                self._stop(kill=True)
                if executed is not None:
                    return CaseResult(
                        case_id,
                        component,
                        "error",
                        f"the implementation ran in {executed - start:.1f} s, but the harness's judgement "
                        f"of its outputs did not finish within {judging_limit(self.timeout):g} s "
                        "after it (a harness problem: please report it with this case)",
                        duration_s=time.perf_counter() - start,
                    )
                return CaseResult(
                    case_id,
                    component,
                    "timeout",
                    f"no result after {self.timeout:g} s; the worker's process group was killed "
                    "and a fresh worker took the next case (raise --timeout if the case is just slow)",
                    duration_s=time.perf_counter() - start,
                )
            try:
                ready = child.conn.poll(min(remaining, 0.5))
            except (EOFError, OSError):
                ready = True
            if ready:
                try:
                    kind, payload = child.conn.recv()
                except (EOFError, OSError):
                    return self._crashed(child, case_id, component, start)
                if kind == "executed":  # the timeout covers the implementation, not the judgement
                    executed = time.perf_counter()
                    deadline = executed + judging_limit(self.timeout)
                    continue
                result = CaseResult.from_json(payload)
                if any(m in result.message for m in STICKY_CUDA_MARKERS):
                    result.message += "\n(the worker was restarted after this CUDA error)"
                    self._stop(kill=True)
                return result
            if not child.process.is_alive():
                return self._crashed(child, case_id, component, start)

    def _crashed(self, child: _Child, case_id: str, component: str, start: float) -> CaseResult:
        process = child.process
        process.join(timeout=5)
        code = process.exitcode
        if code is not None and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        self._stop(kill=True)
        return CaseResult(
            case_id,
            component,
            "crash",
            f"the implementation's process {how} while running this case; a fresh worker took the next case",
            duration_s=time.perf_counter() - start,
        )

    def _start(self) -> None:
        ctx = forkserver.context()
        parent, child = ctx.Pipe()
        run_config = {**self.run_config, "environ": dict(os.environ), "cwd": os.getcwd()}
        process = ctx.Process(target=_child_main, args=(child, run_config), daemon=True)
        forkserver.start(process)
        register_child(self.run_config.get("run_dir"), process.pid)
        child.close()
        self.child = _Child(process, parent)
        # Wait for the child to load the implementation (import time does not count against a case).
        limit = max(LOAD_TIMEOUT, self.timeout)
        if parent.poll(limit):
            try:
                kind, payload = parent.recv()
            except (EOFError, OSError):
                kind, payload = "broken", "the worker died while loading the implementation"
            self.broken = payload if kind == "broken" else ""
        else:
            self.broken = (
                f"the worker did not finish importing torch and loading the implementation within {limit:g} s "
                "(an overloaded machine, or an implementation that hangs while loading)"
            )

    def stop(self) -> None:
        """Kill the child (and whatever it started); the next case starts a fresh one."""
        self._stop(kill=True)

    def _stop(self, kill: bool) -> None:
        with self._lock:
            child, self.child = self.child, None
            self.broken = ""
        if child is None:
            return
        process = child.process
        if kill and process.is_alive():
            assert process.pid is not None  # alive: started
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                process.kill()
        process.join(timeout=5)
        try:
            child.conn.close()
        except OSError:
            pass

    def __del__(self):
        try:
            self._stop(kill=True)
        except Exception:
            pass
