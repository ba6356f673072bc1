"""SIGINT and SIGTERM while a run lasts: they stop it the way Ctrl-C does, and the reports still get written."""

from __future__ import annotations

import signal
from typing import Any


class StopSignals:
    """While the run lasts, SIGINT and SIGTERM stop pytest the way Ctrl-C does (the first one
    raises KeyboardInterrupt; later ones are only noted, so the reports still get written)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signum
            raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
