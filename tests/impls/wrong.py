"""Implementations with one deliberate bug each, built on the reference for everything else.

Tests run them through the real CLI and check that exactly the affected components fail, with a
message that points at the bug.
"""

from __future__ import annotations

import os

import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import numerics as nx
from patching import patched

GRID = torch.tensor(nx.E2M1_GRID, dtype=torch.float32)


def e2m1_ties_away(v: torch.Tensor) -> torch.Tensor:
    """Round to the e2m1 grid with ties away from zero (the classic bug)."""
    mag = v.abs().clamp(max=6.0)
    dist = (mag[..., None] - GRID).abs()
    best = dist.min(dim=-1, keepdim=True).values
    tied = dist == best
    index = (tied * torch.arange(8)).argmax(dim=-1)  # the larger magnitude on a tie
    return torch.copysign(GRID[index], v)


class TiesAwayE2M1(ReferenceAdapter):
    """quant.e2m1 and both fp4 quantisers round ties away from zero."""

    def run(self, component, inputs, params):
        if component not in ("quant.e2m1", "quant.fp4_e4m3", "quant.fp4_e8m0"):
            return super().run(component, inputs, params)
        with patched(nx, "e2m1_round", e2m1_ties_away):
            return super().run(component, inputs, params)


class Raises(ReferenceAdapter):
    def run(self, component, inputs, params):
        if component == "norm.rms":
            raise RuntimeError("kernel launch failed: invalid configuration argument")
        return super().run(component, inputs, params)


class MissingOutput(ReferenceAdapter):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "quant.fp8_ue8m0":
            out.pop("scale_bytes")
        return out


class ExtraOutput(ReferenceAdapter):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component in ("quant.fp8_ue8m0", "quant.fp4_e4m3"):
            out["debug"] = torch.zeros(1)
        return out


class WrongShape(ReferenceAdapter):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "linear.f32":
            out["y"] = out["y"].T.contiguous()
        return out


class WrongDtype(ReferenceAdapter):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component in ("norm.rms", "quant.fp4_e8m0"):
            out["y"] = out["y"].half()
        return out


class ReturnsNaN(ReferenceAdapter):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "rope.apply":
            y = out["y"].clone()
            y.view(-1)[3] = float("nan")
            out["y"] = y
        return out


class HalfSupported(ReferenceAdapter):
    """Supports only the quantisers: the rest is `unsupported`, never `fail`."""

    def supports(self, component):
        return component.startswith("quant.")


class Segfaults(ReferenceAdapter):
    """Kills its own process on one case (as a segfaulting kernel would)."""

    def run(self, component, inputs, params):
        if component == "norm.rms" and inputs["x"].shape[-1] == 512:
            os.kill(os.getpid(), 11)
        return super().run(component, inputs, params)


class Exits(ReferenceAdapter):
    def run(self, component, inputs, params):
        if component == "norm.rms" and inputs["x"].shape[-1] == 512:
            os._exit(3)
        return super().run(component, inputs, params)


class Hangs(ReferenceAdapter):
    def run(self, component, inputs, params):
        if component == "norm.rms" and inputs["x"].shape[-1] == 512:
            import time

            time.sleep(3600)
        return super().run(component, inputs, params)


class ManyBugs(ReferenceAdapter):
    """One bug per component, so a single run shows every error status side by side."""

    BUGS = {
        "norm.rms": Raises,
        "quant.fp8_ue8m0": MissingOutput,
        "quant.fp4_e4m3": ExtraOutput,
        "linear.f32": WrongShape,
        "quant.fp4_e8m0": WrongDtype,
        "rope.apply": ReturnsNaN,
    }

    def run(self, component, inputs, params):
        bug = self.BUGS.get(component)
        if bug is None:
            return super().run(component, inputs, params)
        return bug().run(component, inputs, params)


class Chaos(ReferenceAdapter):
    """Every way an implementation can go wrong, one per case, for the isolation tests."""

    def supports(self, component):
        return component != "quant.fp4_e4m3"

    def run(self, component, inputs, params):
        shape = tuple(inputs["x"].shape) if "x" in inputs else ()
        if component == "norm.rms" and shape[-1] == 512:
            os.kill(os.getpid(), 11)  # SIGSEGV
        if component == "norm.rms" and shape[-1] == 1280:
            import time

            time.sleep(3600)
        if component == "linear.f32" and shape[-1] == 1024:
            os._exit(3)
        if component == "quant.fp8_ue8m0":
            raise ValueError("unsupported block layout")
        out = super().run(component, inputs, params)
        if component == "rope.apply" and shape[-1] == 512:
            y = out["y"].clone()
            y.view(-1)[0] = float("nan")
            out["y"] = y
        return out


class LeftOnDevice(ReferenceAdapter):
    """Computes on the CPU and leaves every output on CONFORMANCE_TEST_DEVICE (default cuda), as a
    port run without `--device cuda` that forgot `.cpu()` does (examples/cuda/left_on_device_check.py)."""

    def run(self, component, inputs, params):
        device = os.environ.get("CONFORMANCE_TEST_DEVICE", "cuda")
        out = super().run(component, inputs, params)
        return {k: v.to(device) if device != "meta" else torch.empty_like(v, device="meta") for k, v in out.items()}


class StickyCudaError(ReferenceAdapter):
    """Fails one case the way a faulting kernel does after synchronisation; the process must be replaced."""

    def run(self, component, inputs, params):
        if component == "norm.rms" and inputs["x"].shape[-1] == 512:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        out = super().run(component, inputs, params)
        if component == "norm.rms":
            out["y"] = out["y"].clone()
        return out
