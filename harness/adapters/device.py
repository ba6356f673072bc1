"""The CUDA adapter: inputs to the device, outputs back, synchronised per call.

Wraps any Python implementation when `--device cuda[:N]` is given. After each call it
synchronises the device, so an asynchronous fault (an illegal address, a device-side assert) is
raised inside the call of the case that caused it, and is charged to that case; the isolation
worker then replaces its process, since such errors are sticky. Outputs are moved back to the
CPU before comparison. When `--device cuda` names no device, parallel children spread over the
visible devices: the child in pool slot K (`-n`), or the pytest-xdist worker `gwK`, takes device
K mod count.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def pick_device(device: str) -> str:
    if device != "cuda":
        return device
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    slot = os.environ.get("CONFORMANCE_SLOT", "0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else int(slot) if slot.isdigit() else 0
    count = torch.cuda.device_count()
    return f"cuda:{index % count}" if count else "cuda:0"


class DeviceAdapter:
    def __init__(self, impl, device: str):
        self.impl = impl
        self.device = torch.device(pick_device(device))

    def supports(self, component: str) -> bool:
        return self.impl.supports(component)

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
        moved = {k: v.to(self.device) for k, v in inputs.items()}
        outputs = self.impl.run(component, moved, params)
        torch.cuda.synchronize(self.device)
        if not isinstance(outputs, dict):
            return outputs
        return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in outputs.items()}
