"""What an implementation prints, per case: captured at the file-descriptor level.

Python `print`, C `printf`/`fprintf(stderr)` and a CUDA runtime's error text before an abort all
end up on file descriptors 1 and 2. While a case runs they point at a file of its own (the
isolation child, or the worker itself with `--no-isolate`), so even a crash leaves its last words
there. The case result keeps a bounded tail (`CaseResult.output`), shown with `crash`, `error`
and `fail` messages; the run gathers every case's full text into `<report-dir>/output.log`.
"""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from pathlib import Path

TAIL_CHARS = 2000
LOG_CASE_CHARS = 1 << 20  # per case in output.log

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
def capture_fds(path: Path):
    """Point fds 1 and 2 at `path` (appending) for the duration; restore them afterwards."""
    _flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def read_text(path: Path | None, limit: int = LOG_CASE_CHARS) -> str:
    """The captured text (the last `limit` characters), or '' when nothing was captured."""
    if path is None or not Path(path).exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - limit))
        text = fh.read().decode("utf-8", "replace")
    return text if size <= limit else f"[... {size - limit} earlier bytes]\n{text}"


def attach(result, text: str) -> None:
    """Keep the tail of `text` in the case result; show it after a crash, error or failure."""
    text = text.strip("\n")
    if not text:
        return
    result.output = text[-TAIL_CHARS:]
    if result.status in ("crash", "error", "fail", "timeout"):
        lines = result.output.splitlines()
        shown = "\n".join(lines[-20:])
        result.message = (result.message.rstrip() + f"\n--- the implementation printed (last {min(len(lines), 20)} "
                          f"line(s); all of it in output.log) ---\n{shown}")
