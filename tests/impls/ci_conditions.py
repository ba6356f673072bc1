"""Implementations that behave the way real ones do in CI: slow, noisy, spawning, crashing.

Each is the reference with one behaviour added, for tests/test_ci_conditions.py. Environment
variables pass a test's temporary paths in (the implementation runs in a spawned child).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path

import torch

from v41_conformance.adapters.reference import ReferenceAdapter

ANSI_RED, ANSI_RESET = "\x1b[31m", "\x1b[0m"


class Slow(ReferenceAdapter):
    """Every case takes CONFORMANCE_TEST_SLEEP seconds (default 0.5): a run to interrupt or overlap."""

    def run(self, component, inputs, params):
        time.sleep(float(os.environ.get("CONFORMANCE_TEST_SLEEP", "0.5")))
        return super().run(component, inputs, params)


class Noisy(ReferenceAdapter):
    """Prints through Python, C stdio and raw fds; crashes on one norm.rms case, fails another."""

    def run(self, component, inputs, params):
        shape = tuple(inputs["x"].shape)
        print(f"python print: {component} {shape}")
        libc = ctypes.CDLL(None)
        libc.printf(f"C printf: kernel for {shape}\n".encode())
        os.write(2, f"{ANSI_RED}fprintf(stderr): launching grid {shape}{ANSI_RESET}\n".encode())
        if shape[-1] == 512:
            os.write(2, b"CUDA error: an illegal memory access was encountered (before abort)\n")
            os.abort()
        out = super().run(component, inputs, params)
        if shape[-1] == 1280:
            out["y"] = (out["y"].float() * 1.5).to(out["y"].dtype)
        return out


class CollectorState(ReferenceAdapter):
    """Prints the garbage collector's state in the process that judges the case
    (tests/test_collector.py: an isolation child settles it, a host is left alone)."""

    def run(self, component, inputs, params):
        import gc

        print(f"collector: frozen {gc.get_freeze_count()} young {gc.get_threshold()[0]}")
        return super().run(component, inputs, params)


class SpawnsAndHangs(ReferenceAdapter):
    """Starts a background `sleep` and then hangs; writes both pids to CONFORMANCE_TEST_PIDS."""

    def run(self, component, inputs, params):
        helper = subprocess.Popen(["sleep", "301"])
        Path(os.environ["CONFORMANCE_TEST_PIDS"]).write_text(f"{os.getpid()} {helper.pid}\n")
        while True:  # a busy hang, as a kernel spinning on a lock would be
            sum(range(100000))


class Loud(ReferenceAdapter):
    """Raises with a long message full of terminal colours and a NUL, on every case."""

    def run(self, component, inputs, params):
        raise RuntimeError(f"{ANSI_RED}kernel failed\x00 at {component}{ANSI_RESET}: " + "details " * 400)


class TwoWrongOutputs(ReferenceAdapter):
    """quant.fp8_ue8m0 with both its values and its codes wrong (the scale bytes right)."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "quant.fp8_ue8m0":
            out["y"] = -out["y"]
            out["codes"] = out["codes"] ^ 0x80
        return out


def _helper_frame(x: torch.Tensor) -> torch.Tensor:
    raise IndexError(f"tile index {x.shape[-1]} out of range")


class RaisesDeep(ReferenceAdapter):
    """Raises from a helper of its own: its frames should lead the message."""

    def run(self, component, inputs, params):
        if component == "norm.rms":
            return {"y": _helper_frame(inputs["x"])}
        return super().run(component, inputs, params)


class StopsMidRun(ReferenceAdapter):
    """The reference, until a case of the component CONFORMANCE_TEST_BLOCK: there it writes the file
    CONFORMANCE_TEST_MARK and waits to be stopped (a run to interrupt at a known point)."""

    def run(self, component, inputs, params):
        if component == os.environ.get("CONFORMANCE_TEST_BLOCK"):
            Path(os.environ["CONFORMANCE_TEST_MARK"]).touch()
            time.sleep(600)
        return super().run(component, inputs, params)
