"""The built-in reference implementation, as an adapter.

Importable as `v41_conformance.adapters.reference:ReferenceAdapter`, so an outside implementation can
delegate the components it does not have yet, or compare itself component by component.
"""

from __future__ import annotations

from typing import Any

import torch

from ..known import components


class ReferenceAdapter:
    """Runs the harness's torch CPU reference for every registered component."""

    def supports(self, component: str) -> bool:
        return component in components()

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
        return components()[component].reference(inputs, params)
