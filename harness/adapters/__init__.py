"""Adapters: how the harness loads and calls an implementation under test.

Every implementation, whatever its language, looks to the runner like an object with
`supports(component) -> bool` and `run(component, inputs, params) -> outputs` (tensor names
without the `in.`/`out.` prefixes). `loader.resolve` turns an `--impl` string into an `ImplSpec`
(plain data a worker process can rebuild the implementation from); `loader.instantiate` builds it.
"""

from .base import Implementation
from .loader import ImplSpec, instantiate, resolve

__all__ = ["Implementation", "ImplSpec", "instantiate", "resolve"]
