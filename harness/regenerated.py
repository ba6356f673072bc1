"""Large inputs that a golden records by hash instead of storing.

A case may list inputs under `build.regenerate` (production-size weights, say). The golden then
stores their SHA-256, dtype and shape in the metadata (`regenerated_inputs`) instead of the
tensor; the runner rebuilds them from the case's seed with the component's own input builder and
checks the hash before anything runs. The builders draw random numbers portably (see
`v41_conformance.reference.numerics.randn`), so the rebuilt tensors are bit-identical on every machine;
a hash mismatch is reported as a golden error, never silently used. Rebuilt tensors are kept in
the local cache (`v41_conformance.cache`, verified by hash), so a case pays for the rebuild once per
machine, not once per run.

A run may take them from the cache unverified and lend them to the implementation without a copy
(`restore(..., lend=True)`): an answer bit-identical to the golden's outputs could only come from
the recorded inputs, so a passing case pays neither for hashing nor for copying its largest
tensors. Before anything else relies on them (judging a difference, the chain's rederivation, a
diagnosis, an error), `settle` reads them again, verified, in place of whatever the implementation
may have done to them.
"""

from __future__ import annotations

import hashlib
from typing import cast

import torch

from . import cache
from .errors import GoldenError
from .golden import Golden
from .tensorbytes import tensor_bytes

CACHE_KIND = "inputs"


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def describe(t: torch.Tensor) -> dict:
    return {"sha256": tensor_sha256(t), "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}


LENT = "lent_inputs"  # golden.extra: the inputs taken from the cache unverified, lent without a copy


def _cached(want: dict, verify: bool = True) -> torch.Tensor | None:
    """The recorded tensor from the cache (its bytes verified against the recorded SHA-256 unless
    `verify` is false)."""
    dtype = getattr(torch, want["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        return None
    data = cache.read(CACHE_KIND, want["sha256"], verify=verify)
    if data is None or not data:
        return None
    try:
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(want["shape"])
    except (RuntimeError, ValueError):
        return None


def restore(golden: Golden, component, lend: bool = False) -> None:
    """Rebuild the golden's regenerated inputs in place, checking each against its hash. `lend`:
    those the cache holds are taken unverified, to be lent to the implementation without a copy
    (`lent`); `settle` verifies them."""
    recorded = golden.meta.get("regenerated_inputs") or {}
    if not recorded:
        return
    cached = {name: _cached(want, verify=not lend) for name, want in recorded.items()}
    if all(t is not None for t in cached.values()):
        golden.inputs.update(cached)
        if lend:
            golden.extra[LENT] = sorted(cached)
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
        cache.write(CACHE_KIND, want["sha256"], bytes(tensor_bytes(tensor)))


def lent(golden: Golden) -> list[str]:
    """The inputs `restore(..., lend=True)` took unverified: the implementation gets them without a copy."""
    return golden.extra.get(LENT) or []


def settle(golden: Golden, component) -> None:
    """The lent inputs read again and verified against their hashes, in place of whatever the
    implementation may have done to them; nothing is lent afterwards. A cached file that no longer
    holds what the golden recorded is rebuilt, and the case is a GoldenError: the implementation
    ran on damaged inputs, so its answer says nothing (the next run reads the rebuilt ones)."""
    names = lent(golden)
    if not names:
        return
    golden.extra.pop(LENT)
    recorded = golden.meta.get("regenerated_inputs") or {}
    fresh = {name: _cached(recorded[name]) for name in names}
    damaged = sorted(name for name, tensor in fresh.items() if tensor is None)
    if damaged:
        for name in names:
            golden.inputs.pop(name, None)
        restore(golden, component)  # rebuilt from the case seed, checked against the hash, cached again
        raise GoldenError(
            f"{golden.path}: the cached input(s) {damaged} did not match the SHA-256 the golden "
            "records, and the implementation ran on them; they are rebuilt now: run the case again"
        )
    golden.inputs.update(cast(dict[str, torch.Tensor], fresh))  # none is None (damaged is empty)
