"""Large inputs that a golden records by hash instead of storing.

A case may list inputs under `build.regenerate` (production-size weights, say). The golden then
stores their SHA-256, dtype and shape in the metadata (`regenerated_inputs`) instead of the
tensor; the runner rebuilds them from the case's seed with the component's own input builder and
checks the hash before anything runs. The builders draw random numbers portably (see
`v41_conformance.reference.numerics.randn`), so the rebuilt tensors are bit-identical on every machine;
a hash mismatch is reported as a golden error, never silently used. Rebuilt tensors are kept in
the local cache (`v41_conformance.cache`, verified by hash on every read), so a case pays for the rebuild
once per machine, not once per run.
"""

from __future__ import annotations

import hashlib

import torch

from . import cache
from .errors import GoldenError
from .golden import Golden

CACHE_KIND = "inputs"


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(_tensor_bytes(t)).hexdigest()


def describe(t: torch.Tensor) -> dict:
    return {"sha256": tensor_sha256(t), "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _cached(want: dict) -> torch.Tensor | None:
    """The recorded tensor from the cache (its bytes verified against the recorded SHA-256)."""
    dtype = getattr(torch, want["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        return None
    data = cache.read(CACHE_KIND, want["sha256"])
    if data is None or not data:
        return None
    try:
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(want["shape"])
    except (RuntimeError, ValueError):
        return None


def restore(golden: Golden, component) -> None:
    """Rebuild the golden's regenerated inputs in place, checking each against its hash."""
    recorded = golden.meta.get("regenerated_inputs") or {}
    if not recorded:
        return
    cached = {name: _cached(want) for name, want in recorded.items()}
    if all(t is not None for t in cached.values()):
        golden.inputs.update(cached)
        return
    gen = torch.Generator()
    gen.manual_seed(int(golden.meta["seed"]))
    built = component.build(dict(golden.meta["params"]), dict(golden.meta.get("build") or {}), gen)
    for name, want in sorted(recorded.items()):
        tensor = built.get(name)
        if tensor is None:
            raise GoldenError(f"{golden.path}: the builder of {component.name} no longer produces input '{name}'")
        got = describe(tensor)
        if got != want:
            raise GoldenError(
                f"{golden.path}: input '{name}' rebuilt from the case seed is {got['dtype']}{got['shape']} "
                f"sha256 {got['sha256'][:12]}…, but the golden recorded {want['dtype']}{want['shape']} "
                f"{want['sha256'][:12]}…; this harness version or platform draws other inputs: regenerate "
                "the goldens (`conformance generate`) or report it"
            )
        golden.inputs[name] = tensor
        cache.write(CACHE_KIND, want["sha256"], _tensor_bytes(tensor))
