"""Comparison policies: how one output of one component is judged.

A policy is data. The registry declares each output's kind; `conformance.yaml` supplies the
numbers (defaults per kind, overrides per component or output, each with a note on how it was
calibrated); the resolved policy is written into every golden's metadata and every result.

Kinds:
- `exact`: same dtype and shape, bit-identical (floats compared by their bits, so -0 != +0 and
  NaN payloads count). Quantiser codes and scales, counts, masks.
- `bf16` / `f32`: same dtype and shape; positions of NaN, +inf, -inf and of the `sentinels`
  values must match exactly; then every element within `ulps` units in the last place of the
  expected value in that format, plus `atol`, plus `atol_rel` times the largest |expected|; then the global relative L2 error within
  `rel_l2`; and at most `max_diff_fraction` of the elements may differ at all (a correct
  implementation flips the last bit of a few elements; a moved rounding point flips many). All
  must hold.
- `index`: integer ids compared exactly; when they differ the index verdict classifies each
  row as tie order only or a miss, using the reference scores stored as `aux.<scores>`. Rows
  that differ only in tie order pass when `accept_ties` is set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .errors import UsageError

KINDS = ("exact", "bf16", "f32", "index")
TUNABLE = ("ulps", "atol", "atol_rel", "rel_l2", "max_diff_fraction", "accept_ties")


@dataclass(frozen=True)
class Policy:
    kind: str
    ulps: float = 0.0
    atol: float = 0.0
    atol_rel: float = 0.0  # absolute floor as a fraction of max |expected| (cancellation near zero)
    rel_l2: float = 0.0
    max_diff_fraction: float = 1.0  # share of elements allowed to differ at all (1.0: no limit)
    sentinels: tuple[float, ...] = ()
    # index kind only
    scores: str | None = None  # aux tensor with the reference scores the selection came from
    order: str = "sequence"  # "sequence": position matters; "set": compared as sorted sets
    largest: bool = True
    offset_param: str | None = None  # params key holding the id offset (scalar)
    limit: str | None = None  # aux tensor: per-row exclusive upper bound on valid ids
    fill_is_worst: bool = False  # -1 lanes stand for worst-score picks (fixed-width top-k)
    accept_ties: bool = False
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"unknown comparison kind {self.kind!r}; expected one of {KINDS}")
        if self.order not in ("sequence", "set"):
            raise UsageError(f"index order must be 'sequence' or 'set', not {self.order!r}")

    @property
    def tolerant(self) -> bool:
        return self.kind in ("bf16", "f32")

    def with_overrides(self, overrides: dict[str, Any], where: str) -> Policy:
        unknown = set(overrides) - set(TUNABLE) - {"note"}
        if unknown:
            raise UsageError(
                f"{where}: unknown tolerance field(s) {sorted(unknown)}; allowed: {TUNABLE + ('note',)}"
            )
        clean = {}
        for key, value in overrides.items():
            if key == "accept_ties":
                if not isinstance(value, bool):
                    raise UsageError(f"{where}: accept_ties must be true or false, not {value!r}")
                clean[key] = value
            elif key == "note":
                clean[key] = str(value)
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise UsageError(f"{where}: {key} must be a non-negative number, not {value!r}")
                clean[key] = float(value)
        return replace(self, **clean)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["sentinels"] = list(self.sentinels)
        return {k: v for k, v in data.items() if v not in (None, "", ()) or k == "kind"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        data = dict(data)
        data["sentinels"] = tuple(data.get("sentinels", ()))
        return cls(**data)

    def describe(self) -> str:
        if self.kind in ("bf16", "f32"):
            floor = f" + {self.atol:g}" if self.atol else ""
            floor += f" + {self.atol_rel:g}*max|e|" if self.atol_rel else ""
            share = f", <= {self.max_diff_fraction:g} of elements differ" if self.max_diff_fraction < 1.0 else ""
            return f"{self.kind}: |a-e| <= {self.ulps:g} ulp{floor}, rel L2 <= {self.rel_l2:g}{share}"
        if self.kind == "index":
            return "index: exact" + (" (tie order accepted)" if self.accept_ties else "")
        return "exact (bitwise)"
