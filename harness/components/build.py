"""Input builders shared by component definitions: deterministic tensors from a generator.

Every builder takes the case's `torch.Generator` (seeded from the case id), so inputs depend on
the case id and nothing else. Distributions are named in the case YAML's `build:` block.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import CaseSpecError
from ..reference.numerics import randn


def normal(gen: torch.Generator, shape, scale: float = 1.0, dtype=torch.bfloat16) -> torch.Tensor:
    return (randn(tuple(shape), generator=gen) * scale).to(dtype)


def uniform(gen: torch.Generator, shape, low: float, high: float, dtype=torch.float32) -> torch.Tensor:
    return (torch.rand(tuple(shape), generator=gen, dtype=torch.float32) * (high - low) + low).to(dtype)


def need(build: dict[str, Any], key: str, component: str):
    if key not in build:
        raise CaseSpecError(f"{component}: build needs '{key}'")
    return build[key]


def dtype_of(name: str) -> torch.dtype:
    table = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16, "f64": torch.float64}
    if name not in table:
        raise CaseSpecError(f"unknown dtype {name!r}; use one of {sorted(table)}")
    return table[name]


def tile_to(values: list[float], shape, dtype=torch.float32) -> torch.Tensor:
    """Repeat `values` to fill `shape` (edge-case rows built from a list)."""
    flat = torch.tensor(values, dtype=torch.float64)
    numel = 1
    for s in shape:
        numel *= s
    reps = -(-numel // len(values))
    return flat.repeat(reps)[:numel].reshape(tuple(shape)).to(dtype)
