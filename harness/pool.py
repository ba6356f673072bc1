"""Parallel isolated execution inside one process: N children, fed by N threads.

`conformance run -n N` (with isolation, the default) does not start N pytest-xdist workers that
would each import torch and then start a child that imports it again. The run's own process
keeps N isolation children busy (each forked from the preloaded fork server,
`v41_conformance.forkserver`), one driver thread per child taking the next case from a shared queue in
the run's order (the heaviest cases first, `v41_conformance.workers`). pytest still runs one item per
case in that order; an item waits for its case's result. Crashes, hangs and sticky CUDA errors
are handled per child exactly as in a serial run (`v41_conformance.isolation.IsolatedWorker`).

`executor_for(run)` is how a run judges its cases: through such children when the run isolates its
implementation (one child for a pytest-xdist worker's share, N for `-n N`), else in this process
(`v41_conformance.execution.CaseExecutor`).
"""

from __future__ import annotations

import threading
from collections import deque

from .case_result import CaseResult
from . import capture
from .isolation import IsolatedWorker


class CasePool:
    """`size` isolation children judging the cases of the run document `run` (`order`: the cases to
    queue now, in the order they should start; a case asked for later is queued then)."""

    def __init__(self, run: dict, size: int, order: list[str]):
        self.run_dir = run.get("run_dir")
        self._queue = deque(order)
        self._results: dict[str, CaseResult] = {}
        self._running: set[str] = set()
        self._cond = threading.Condition()
        self._closed = False
        self.workers = [IsolatedWorker(run, slot) for slot in range(max(1, size))]
        self._threads = [
            threading.Thread(target=self._drive, args=(w,), name=f"conformance-slot-{w.slot}", daemon=True)
            for w in self.workers
        ]
        for thread in self._threads:
            thread.start()

    def _drive(self, worker: IsolatedWorker) -> None:
        while True:
            with self._cond:
                if self._closed:
                    break
                if not self._queue:
                    return  # the child stays up for a late case (see result())
                case_id = self._queue.popleft()
                self._running.add(case_id)
            try:
                result = worker.run(case_id, capture.output_file(self.run_dir, case_id))
            except Exception as exc:  # a harness bug: never blame the implementation for it
                from .ids import split_case_id

                result = CaseResult(
                    case_id,
                    split_case_id(case_id)[0],
                    "error",
                    f"harness internal error (please report): {type(exc).__name__}: {exc}",
                )
            with self._cond:
                self._running.discard(case_id)
                self._results[case_id] = result
                self._cond.notify_all()
        worker.stop()  # closed while this driver was busy: a child it started since must not outlive the run

    def result(self, case_id: str) -> CaseResult:
        """This case's result, waiting for it (a case the queue does not hold is queued first)."""
        with self._cond:
            if case_id not in self._results:
                if case_id not in self._running and case_id not in self._queue:
                    self._queue.appendleft(case_id)
                self._restart_idle()
            while case_id not in self._results:
                self._cond.wait(0.5)
            return self._results.pop(case_id)

    def _restart_idle(self) -> None:
        """Drivers stop when the queue runs dry; a late case starts them again."""
        for i, thread in enumerate(self._threads):
            if not thread.is_alive() and not self._closed:
                self._threads[i] = threading.Thread(target=self._drive, args=(self.workers[i],), daemon=True)
                self._threads[i].start()

    def close(self) -> None:
        """Stop taking cases and stop every child (a case still running is abandoned)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
        for worker in self.workers:
            worker.stop()


class IsolatedRun:
    """A run's cases judged by isolation children: `run(case_id)` and `close()`, as a `CaseExecutor`."""

    def __init__(self, run: dict):
        self.run_doc = run
        self._pool: CasePool | None = None

    def run(self, case_id: str) -> CaseResult:
        if self._pool is None:
            from .forkserver import warm_up

            warm_up()  # from this (main) thread, never from a pool thread that ends before the run
            # A pool run (`prefetch`) queues every case at once and each item waits for its own result;
            # a pytest-xdist worker, which owns only some cases, queues a case when its item asks for it.
            order = list(self.run_doc.get("cases", ())) if self.run_doc.get("prefetch") else []
            self._pool = CasePool(self.run_doc, int(self.run_doc.get("workers", 1)), order)
        return self._pool.result(case_id)

    def close(self) -> None:
        """Stop the isolation children (the end of a run, or a stop)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def executor_for(run: dict):
    """What judges the run's cases in this process: isolation children, or the executor itself."""
    if run.get("isolate"):
        return IsolatedRun(run)
    from .execution import CaseExecutor

    return CaseExecutor.from_run(run)
