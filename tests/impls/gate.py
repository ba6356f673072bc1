"""What the gate implementations share: dispatch by component, and the components they leave to
the reference because they hold no floating-point arithmetic to round differently."""

from __future__ import annotations

from collections.abc import Callable

from v41_conformance import Unsupported
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.known import components

# Index bookkeeping, byte counts, ring capacity, row metadata, topology rules: integer answers, so
# the reference's answer is every correct implementation's answer.
NO_FLOAT_ARITHMETIC = (
    "address.prefill",
    "address.decode",
    "window.indices",
    "candidates.restore",
    "topology.validate",
    "cache.bytes",
    "compressor.ring",
    "compressor.metadata",
)


class Gate(ReferenceAdapter):
    """A correct implementation built from `handlers` (component -> (inputs, params) -> outputs)."""

    handlers: dict[str, Callable] = {}

    def run(self, component, inputs, params):
        if component in NO_FLOAT_ARITHMETIC:
            return super().run(component, inputs, params)
        handler = self.handlers.get(component)
        if handler is None:
            raise Unsupported(f"{type(self).__name__} has no version of {component}")
        return handler(inputs, params)


def table_args(params: dict) -> dict:
    """rope.yarn_table's params as precompute_freqs_cis takes them (M:368-389 defaults)."""
    return {
        "dim": int(params["dim"]),
        "base": float(params["base"]),
        "original_seq_len": int(params.get("original_seq_len", 0)),
        "factor": float(params.get("factor", 16.0)),
        "beta_fast": float(params.get("beta_fast", 32.0)),
        "beta_slow": float(params.get("beta_slow", 1.0)),
    }


def bare(cls: type) -> type:
    """`cls` returning no intermediates: its outputs are judged with the reference's values standing
    in at every decision (docs/verdicts.md, "The chain")."""

    class Bare(cls):
        def run(self, component, inputs, params):
            out = super().run(component, inputs, params)
            spec = components()[component]
            return {k: v for k, v in out.items() if spec.intermediate_spec(k) is None}

    Bare.__name__ = Bare.__qualname__ = f"Bare{cls.__name__}"
    return Bare
