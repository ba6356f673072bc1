"""What an implementation prints, per case: captured at the file-descriptor level.

Python `print`, C `printf`/`fprintf(stderr)` and a CUDA runtime's error text before an abort all
end up on file descriptors 1 and 2. While a case runs they point at a file of its own (the
isolation child, or the worker itself with `--no-isolate`), so even a crash leaves its last words
there. The case result keeps a bounded tail (`CaseResult.output`), shown with `crash`, `error`
and `fail` messages; the run gathers the last MiB of each case into `<report-dir>/output.log`, and
the whole of a case that printed more into `<report-dir>/output/<component>__<case>.log`.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

TAIL_CHARS = 2000
LOG_CASE_CHARS = 1 << 20  # bytes per case in output.log (the whole: output/<case>.log beside it)

_LIBC: ctypes.CDLL | None
try:
    _LIBC = ctypes.CDLL(None)
except OSError:  # pragma: no cover - every supported platform has a C library
    _LIBC = None


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if _LIBC is not None:
        _LIBC.fflush(None)  # C stdio buffers (printf without a newline, a fully buffered stdout)


@contextmanager
def capture_fds(path: str | Path):
    """Point fds 1 and 2 at `path` (appending) for the duration, and Python's sys.stdout and
    sys.stderr at them (a pytest session may have pointed those elsewhere); restore everything
    afterwards."""
    _flush()
    saved = os.dup(1), os.dup(2)
    streams = sys.stdout, sys.stderr
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout, sys.stderr = (open(n, "w", buffering=1, closefd=False, errors="replace") for n in (1, 2))
        yield
    finally:
        _flush()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def run_captured(path: str | Path | None, run: Callable[[], Any]) -> Any:
    """The case result `run()` returns, with what it printed captured in `path` (when there is
    one) and the tail of that attached (`attach`)."""
    with capture_fds(path) if path else nullcontext():
        result = run()
    attach(result, read_text(path))
    return result


def file_name(case_id: str) -> str:
    """The name of a case's capture file (`<component>__<case>.log`)."""
    return case_id.replace("/", "__") + ".log"


def output_file(run_dir: str | None, case_id: str) -> str | None:
    """Where a case's output is captured: `<run dir>/output/<component>__<case>.log` (None: nowhere)."""
    if not run_dir or not (Path(run_dir) / "output").exists():
        return None
    return str(Path(run_dir) / "output" / file_name(case_id))


def read_text(path: str | Path | None, limit: int = LOG_CASE_CHARS, where: str = "") -> str:
    """The captured text (the last `limit` bytes), or '' when nothing was captured; `where` says,
    after the count of bytes left out, where they are."""
    if path is None or not Path(path).exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - limit))
        text = fh.read().decode("utf-8", "replace")
    return text if size <= limit else f"[... {size - limit} earlier bytes{where}]\n{text}"


def attach(result, text: str) -> None:
    """Keep the tail of `text` in the case result; show it after a crash, error or failure."""
    text = text.strip("\n")
    if not text:
        return
    result.output = text[-TAIL_CHARS:]
    if result.status in ("crash", "error", "fail", "timeout"):
        lines = result.output.splitlines()
        shown = "\n".join(lines[-20:])
        result.message = (
            result.message.rstrip() + f"\n--- the implementation printed (the last {min(len(lines), 20)} "
            f"line(s) of it) ---\n{shown}"
        )
