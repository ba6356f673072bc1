"""The built-in reference implementation, as an adapter.

Importable as `v41_conformance.adapters.reference:ReferenceAdapter`, so an outside implementation can
delegate the components it does not have yet, or compare itself component by component.
"""

from __future__ import annotations

from typing import Any

import torch

from ..known import components


class ReferenceAdapter:
    """Runs the harness's torch CPU reference for every registered component. Inputs on another device
    (a port run with `--device cuda` that delegates a component) are computed on the CPU and the outputs
    handed back on that device, so the port can go on with them."""

    def supports(self, component: str) -> bool:
        return component in components()

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
        devices = {v.device for v in inputs.values() if isinstance(v, torch.Tensor)} - {torch.device("cpu")}
        if not devices:
            return components()[component].reference(inputs, params)
        on_cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        outputs = components()[component].reference(on_cpu, params)
        device = next(iter(devices))
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
