"""One run's private state under its report directory, and the lock that keeps runs apart.

`conformance run --report-dir DIR` holds an exclusive lock on `DIR/.lock` for its whole life
(`fcntl.flock`, released by the kernel when the process ends, so a killed run never leaves a
stale lock). A second run into the same DIR refuses with a usage error naming the first run's pid.
Everything a run writes while it runs lives in `DIR/.run/<token>/`, private to it:

- the pytest run file and ini (what the workers read),
- `children/<pid>`: one empty file per isolation child started (each leads its own process
  group); `kill_children()` kills those groups when the run ends, however it ends, so nothing an
  implementation started outlives the run,
- `output/<n>.log`: what the implementation printed during each case (`v41_conformance.capture`),
  gathered into `DIR/output.log` at the end (the last MiB of each case; a case that printed more
  keeps all of it in `DIR/output/<n>.log`).

The folder is removed when the run ends; the reports are written into DIR while the lock is held.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import IO

from .errors import UsageError

DEFAULT_REPORT_DIR = "reports/latest"
LOCK = ".lock"
PRIVATE = ".run"
OUTPUT_LOG = "output.log"
OUTPUT_DIR = "output"  # the whole output of each case that printed more than output.log keeps of it


class RunDir:
    def __init__(self, report_dir: Path):
        self.report_dir = Path(report_dir)
        self.token = uuid.uuid4().hex
        self.path = self.report_dir / PRIVATE / self.token
        self._lock: IO[str] | None = None

    def __enter__(self) -> RunDir:
        self.report_dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.report_dir / LOCK, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise UsageError(
                f"--report-dir {self.report_dir} is in use by another conformance run ({holder}); "
                "wait for it to finish or give this run its own --report-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        lock.flush()
        self._lock = lock
        (self.path / "children").mkdir(parents=True)
        (self.path / "output").mkdir()
        return self

    def __exit__(self, *exc) -> None:
        self.kill_children()
        shutil.rmtree(self.path, ignore_errors=True)
        try:
            (self.report_dir / PRIVATE).rmdir()  # only when no other run's folder is left in it
        except OSError:
            pass
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def gather_output(self, case_ids: list[str], statuses: dict[str, str]) -> None:
        """`<report dir>/output.log`: what the implementation printed, case by case (those that
        printed anything), each under a header with its id and status: the last
        `capture.LOG_CASE_CHARS` of each case, and the whole of a case that printed more in
        `<report dir>/output/<component>__<case>.log` (named where output.log cuts it)."""
        from . import capture
        from .golden import write_atomic

        whole = self.report_dir / OUTPUT_DIR
        shutil.rmtree(whole, ignore_errors=True)  # an earlier run's
        parts = []
        for case_id in case_ids:
            name = capture.file_name(case_id)
            path = self.path / "output" / name
            kept = f"{OUTPUT_DIR}/{name}" if path.exists() and path.stat().st_size > capture.LOG_CASE_CHARS else ""
            text = capture.read_text(path, where=f"; all of it in {kept}" if kept else "")
            if kept:
                whole.mkdir(exist_ok=True)
                shutil.move(str(path), str(whole / name))
            if text.strip():
                parts.append(f"===== {case_id} ({statuses.get(case_id, '?')}) =====\n{text.rstrip()}\n")
        body = "\n".join(parts) if parts else "(the implementation printed nothing)\n"
        write_atomic(self.report_dir / OUTPUT_LOG, body.encode("utf-8", "replace"))

    def kill_children(self) -> None:
        """SIGKILL the process group of every isolation child this run started (and so whatever
        those children started), dead or alive."""
        folder = self.path / "children"
        for entry in folder.iterdir() if folder.exists() else ():
            try:
                os.killpg(int(entry.name), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
            entry.unlink(missing_ok=True)


def rerun_dir(report_dir: Path | str) -> Path:
    """Where a re-run command writes its report: a sibling of the run's report dir (`reports/latest`
    -> `reports/latest-rerun`), so re-running one case never replaces the report it came from."""
    report_dir = Path(report_dir)
    return report_dir.with_name(report_dir.name + "-rerun")


def register_child(run_dir: str | None, pid: int) -> None:
    """Record an isolation child (a process-group leader) so the run kills its group at the end."""
    if run_dir:
        folder = Path(run_dir) / "children"
        if folder.exists():
            (folder / str(pid)).touch()
