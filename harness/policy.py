"""Comparison policies: how one output of one component is judged.

A policy is data. The registry declares each output's kind; `conformance.yaml` supplies the
numbers (defaults per kind, overrides per component or output, each with a note on how it was
calibrated); the resolved policy is written into every golden's metadata and every result.

Kinds:
- `exact`: same dtype and shape, bit-identical (floats compared by their bits, so NaN payloads
  count). Counts, masks, codes of exact inputs.

In every kind, an element that differs only in the sign of a zero (-0 for +0 or back, as a float or
as the two zero codes `zero_codes` of a code output) is a *signed zero*: counted, named, and
accepted unless `accept_signed_zeros` is false (an implementation's `strict_signed_zeros: true`).
- `bf16` / `f32`: same dtype and shape; positions of NaN, +inf, -inf must match exactly, and the
  rows the inputs mark absent (`absent_rows`: every lane of that row's ids is -1, a fact of the
  structure, never of a value) must be exactly 0 on both sides; then every element within `ulps` units in the last place of the
  expected value in that format, plus `atol`, plus `atol_rel` times the largest |expected|, plus
  (for transcendental outputs) `argument_ulps` fp32 ulps of the function's argument stored as
  `aux.<argument>`, plus (for sums of bf16-rounded terms) `term_ulps` bf16 ulps of the largest
  term, stored as `aux.<terms>` (elements that need it are counted as boundary flips: one term
  rounded the other way); then the global relative L2 error within `rel_l2` (of the error beyond
  the argument allowance, where there is one); and at most
  `max_diff_fraction` of the elements (plus 4 standard deviations of that binomial count, and never
  fewer than that share of 256, so one small step's few flips are not a large share) may differ at all. All must hold. The kind follows the
  output's dtype: an fp32 output of a component declared `bf16` is judged as `f32`.
- `quantised`: a quantiser's output (dequantised values, codes, packed codes or scale bytes)
  computed from rounded arithmetic. Exact, except that an element one representable step away is
  a *boundary flip* when the reference's value before that rounding (`aux`/`out` tensor `pre`)
  lies within `boundary_ulps` bf16 ulps (plus `boundary_atol_rel` of its block's amax) of the
  decision boundary (harness/boundary.py, docs/verdicts.md). Flips are counted and accepted unless `accept_boundary` is false.
- `index`: integer ids compared exactly; when they differ the index verdict classifies each
  row as tie order, near tie (within `near_tie_ulps` of the k-th score) or miss, using the
  reference scores stored as `aux.<scores>`. Tie rows pass with `accept_ties`; near-tie rows
  (and tie rows) with `accept_near_ties`. A top-k called with `sorted` false returns its picks in
  an unspecified order: they are judged as a set (of (index, value) pairs, for `topk.torch_cpu`)
  unless `strict_order`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from .errors import UsageError

KINDS = ("exact", "bf16", "f32", "quantised", "index")
# Fields that say how an output's allowance is derived where the judge is given the data for it (context
# tensors computed where the output differs): shown in descriptions, not written into goldens.
DESCRIPTIVE = ("labels", "accumulates", "precision")
FLAGS = ("accept_ties", "accept_near_ties", "accept_boundary", "accept_signed_zeros", "strict_order")  # booleans
TUNABLE = (
    "ulps",
    "atol",
    "atol_rel",
    "rel_l2",
    "max_diff_fraction",
    "argument_ulps",
    "term_ulps",
    "boundary_ulps",
    "boundary_atol_rel",
    "near_tie_ulps",
) + FLAGS
FLOAT_KINDS = {"bf16": "bf16", "f32": "f32"}  # tolerance kinds, by the output dtype they judge
# The codes of +0 and -0 in the code formats of this path (sign bit 3 for e2m1, bit 7 for e4m3).
ZERO_CODES = {"e2m1": (0x0, 0x8), "e4m3": (0x00, 0x80)}


@dataclass(frozen=True)
class Policy:
    kind: str
    ulps: float = 0.0
    atol: float = 0.0
    atol_rel: float = 0.0  # absolute floor as a fraction of max |expected| (cancellation near zero)
    rel_l2: float = 0.0
    max_diff_fraction: float = 1.0  # share of elements allowed to differ at all (1.0: no limit)
    # context key of an id tensor [..., K]: a row whose K lanes are all -1 is absent, and the output's
    # elements under it (its leading dims) are exactly 0. Derived from the inputs, never from a value of
    # the golden: an exact 0 elsewhere is an ordinary value, judged by the tolerance.
    absent_rows: str | None = None
    argument: str | None = None  # aux tensor: the argument of a transcendental output (cos/sin)
    argument_ulps: float = 0.0  # allowance: this many fp32 ulps of the argument (|f'| <= 1)
    terms: str | None = None  # aux tensor: per element, the largest bf16-rounded term summed into it
    term_ulps: float = 0.0  # allowance: this many bf16 ulps of that term (an intermediate rounding flip)
    # The accumulator model (harness/accumulation.py): an element fed by an fp8 GEMM may move by u x A,
    # u = 2^(1 - accumulator_bits), A the magnitude of the GEMM's terms behind it (context `<name>.acc`,
    # given where the output differs), and the output as a whole by the error u x R expects (`.acc_rms`);
    # the implementation's hardware, 14 significant bits by default.
    accumulator_bits: float = 14.0
    accumulates: bool = False  # fed by an fp8 GEMM where the weights are fp8 (described; not written into goldens)
    precision: bool = False  # judged for precision against its exact value (described; not written into goldens)
    # quantised kind only
    quant: str | None = None  # block format: fp8_ue8m0 | fp4_e4m3 | fp4_e8m0 (harness/boundary.py)
    encoding: str = "values"  # values | codes | packed | scale_bytes
    pre: str | None = None  # tensor of the reference's values before quantisation ("out.x" or aux)
    pre_tail: str | None = None  # params path of the RoPE tail width: there an element's ulps (and, quantised,
    # the tolerance of its value before rounding) are of its RoPE pair's norm
    boundary_ulps: float = 0.0  # tolerance of `pre`, in bf16 ulps of its magnitude
    boundary_atol_rel: float = 0.0  # ... plus this fraction of its quantisation block's amax
    accept_boundary: bool = True
    # index kind only
    scores: str | None = None  # aux tensor with the reference scores the selection came from
    order: Literal["sequence", "set"] = "sequence"  # "sequence": position matters; "set": compared as sorted sets
    largest: bool = True
    offset_param: str | None = None  # params key holding the id offset (scalar)
    limit: str | None = None  # aux tensor: per-row exclusive upper bound on valid ids
    fill_is_worst: bool = False  # -1 lanes stand for worst-score picks (fixed-width top-k)
    accept_ties: bool = False
    near_tie_ulps: float = 0.0  # scores within this many bf16 ulps of the k-th score are near-tied
    accept_near_ties: bool = False
    # an unsorted top-k (params.sorted false) leaves its order unspecified: its (index, value) pairs are
    # judged in any order (harness/components/topk.py) unless this is true (an implementation that
    # promises torch's order: strict_topk_order)
    strict_order: bool = False
    # every kind: an element that differs only in the sign of a zero (a float -0 / +0, or the two zero
    # codes `zero_codes` of an exact code output) is counted as a signed zero and accepted unless this is
    # false (docs/verdicts.md, "Signed zeros")
    zero_codes: tuple[int, ...] = ()
    accept_signed_zeros: bool = True
    labels: tuple[str, ...] = field(default=(), compare=False)  # names of the last dim's positions, for messages
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"unknown comparison kind {self.kind!r}; expected one of {KINDS}")
        if self.kind == "quantised" and (self.quant is None or self.pre is None):
            raise UsageError("a quantised output needs its block format (quant) and pre-rounding tensor (pre)")
        if self.order not in ("sequence", "set"):
            raise UsageError(f"index order must be 'sequence' or 'set', not {self.order!r}")

    @property
    def tolerant(self) -> bool:
        return self.kind in ("bf16", "f32")

    def for_dtype(self, kind: str) -> Policy:
        """This policy judging an output of another float format (`kind` "bf16" or "f32")."""
        return replace(self, kind=kind)

    def with_overrides(self, overrides: dict[str, Any], where: str) -> Policy:
        unknown = set(overrides) - set(TUNABLE) - {"note"}
        if unknown:
            raise UsageError(f"{where}: unknown tolerance field(s) {sorted(unknown)}; allowed: {TUNABLE + ('note',)}")
        clean: dict[str, Any] = {}
        for key, value in overrides.items():
            if key in FLAGS:
                if not isinstance(value, bool):
                    raise UsageError(f"{where}: {key} must be true or false, not {value!r}")
                clean[key] = value
            elif key == "note":
                clean[key] = str(value)
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise UsageError(f"{where}: {key} must be a non-negative number, not {value!r}")
                clean[key] = float(value)
        return replace(self, **clean)

    def to_json(self) -> dict[str, Any]:
        """The fields that differ from their defaults (and the kind): what makes this policy."""
        defaults = {f.name: f.default for f in fields(self)}
        return {k: v for k, v in asdict(self).items() if k == "kind" or (v != defaults[k] and k not in DESCRIPTIVE)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        data = dict(data)
        if "sentinels" in data:  # goldens of schema 1.x: an exact-0 sentinel by value, now absent rows by structure
            raise UsageError(
                "this golden marks special values by value ('sentinels'); regenerate it with "
                "`conformance generate` (absent rows now come from the inputs' ids)"
            )
        return cls(**data)

    def describe(self) -> str:
        """One line (kept on the instance: a case reports it for each of its hundreds of outputs, and a
        frozen dataclass hashes every field to find it in a cache)."""
        said = self.__dict__.get("_described")
        if said is None:
            said = self.__dict__["_described"] = self._describe()
        return said

    def _describe(self) -> str:
        if self.kind in ("bf16", "f32"):
            floor = f" + {self.atol:g}" if self.atol else ""
            floor += f" + {self.atol_rel:g}*max|e|" if self.atol_rel else ""
            floor += f" + {self.argument_ulps:g} ulp of {self.argument}" if self.argument_ulps and self.argument else ""
            floor += f" + {self.term_ulps:g} bf16 ulp of {self.terms}" if self.term_ulps and self.terms else ""
            if self.accumulates:
                floor += f" + 2^{1 - self.accumulator_bits:g} x |fp8 GEMM terms|"
            share = (
                f", <= {self.max_diff_fraction:g} of elements (+ 4 sd of the count, >= that of 256) differ"
                if self.max_diff_fraction < 1.0
                else ""
            )
            if share and self.accumulates:
                share += " beyond the accumulator's expected flips"
            pairs = " (ulps of the RoPE pair's norm in the rotated channels)" if self.pre_tail else ""
            if self.absent_rows:
                share += f"; exactly 0 where every lane of {self.absent_rows} is -1"
            if self.precision:
                return (
                    f"{self.kind}: |a-e| <= {self.ulps:g} ulp{pairs}{floor}, or no farther from the exact value than "
                    f"the reference's own roundings; rel L2 <= {self.rel_l2:g}, or an L2 distance from the exact "
                    f"value <= {PRECISION_MARGIN:g}x the reference's{share}"
                )
            return f"{self.kind}: |a-e| <= {self.ulps:g} ulp{pairs}{floor}, rel L2 <= {self.rel_l2:g}{share}"
        if self.kind == "index":
            accepted = [
                label for flag, label in ((self.accept_ties, "tie order"), (self.accept_near_ties, "near ties")) if flag
            ]
            near = f"; near tie within {self.near_tie_ulps:g} ulp of the k-th score" if self.near_tie_ulps else ""
            strict = "; an unsorted top-k in torch's order" if self.strict_order else ""
            return "index: exact" + near + strict + (f" ({' and '.join(accepted)} accepted)" if accepted else "")
        if self.kind == "quantised":
            how = "accepted" if self.accept_boundary else "counted, not accepted"
            return (
                f"quantised {self.quant} {self.encoding}: exact; one-step flips where the value before rounding "
                f"is within {self.boundary_ulps:g} bf16 ulp of the boundary {how}"
            )
        return "exact (bitwise)"


# An output judged for precision may lie up to this factor farther from the exact value than the
# reference does (in L2): equally many roundings in another order land on either side of it.
PRECISION_MARGIN = 1.125
