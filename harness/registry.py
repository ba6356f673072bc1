"""The component registry: the one place that says what each component is.

Each `Component` names its input and output tensors, builds its inputs for a case, points at
its reference function, and declares the comparison kind of every output. The generator, the
runner, the docs (`conformance list --docs`) and the reports all read this registry.

A component's `execute` drives an implementation through a case. For most components it is a
single call. Stateful components (the compressor over a chunk schedule, attention over prefill
and decode) supply a driver that calls the implementation once per step with the state passed in
and out, so the harness really chunks and checks the state after every step; the generator runs
the same driver with the reference, so goldens and runs cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from .policy import Policy

if TYPE_CHECKING:
    import torch

Tensors = dict[str, "torch.Tensor"]
Params = dict[str, Any]
Call = Callable[[Tensors, Params], Tensors]


DTYPES = ("bf16", "f16", "f32", "f64", "int64", "int32", "uint8", "bool")
PARAM_TYPES = ("int", "float", "bool", "str", "int_list", "int_pairs", "mapping")


def json_literal(value: Any) -> str:
    """A default as a case file or a JSON reader writes it (true, 1e-06, "upstream")."""
    import json

    return json.dumps(value)


@dataclass(frozen=True)
class TensorSpec:
    """An input (or a returned tensor that is not compared as is): name, dtype, symbolic shape.

    dtype: one of DTYPES, or alternatives joined by '|' ("bf16|f32"), or "as <name>" (the dtype
    of another tensor). shape: symbols separated by spaces ("b S dim"; "" for a 0-dim tensor;
    "..." for any leading dims); each symbol's meaning is in the component's `dims`.
    """

    name: str
    dtype: str
    shape: str
    doc: str = ""
    when: str = ""  # present only under this condition (e.g. "weights: fp8"); always when empty


@dataclass(frozen=True)
class ParamSpec:
    """A case parameter: its type (PARAM_TYPES), meaning and unit. `driver`: set by the step
    driver for each call (start, end, ...), not by the case file."""

    name: str
    type: str
    doc: str
    unit: str = ""
    required: bool = True
    choices: tuple = ()
    driver: bool = False
    default: Any = None  # an optional param's value when the case leaves it out (what the harness passes)
    derive: Callable[[Params], Any] | None = None  # or: its default computed from the case's other params
    default_doc: str = ""  # how a derived default reads in the catalogue ("len(schedule): no decode step")

    @property
    def has_default(self) -> bool:
        return not self.required and not self.driver and (self.default is not None or self.derive is not None)

    def describe_default(self) -> str:
        """The default as the catalogue states it ('' for a required or driver-set param)."""
        if not self.has_default:
            return ""
        if self.derive is not None:
            return self.default_doc or "derived from the other params"
        return json_literal(self.default) + (f" ({self.default_doc})" if self.default_doc else "")

    def default_for(self, params: Params) -> Any:
        return self.derive(params) if self.derive is not None else self.default

    def coerce(self, value: Any, where: str) -> Any:
        """The value as this type, whatever the YAML literal's spelling; CaseSpecError otherwise."""
        from .errors import CaseSpecError

        def bad() -> CaseSpecError:
            return CaseSpecError(f"{where}: param '{self.name}' must be {self.type} ({self.doc}), not {value!r}")

        if self.type == "bool":
            if not isinstance(value, bool):
                raise bad()
        elif self.type == "int":
            if isinstance(value, bool) or not (
                isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            ):
                raise bad()
            value = int(value)
        elif self.type == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad()
            value = float(value)
        elif self.type == "str":
            if not isinstance(value, str):
                raise bad()
        elif self.type == "int_list":
            if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise bad()
            value = [int(v) for v in value]
        elif self.type == "int_pairs":
            if not isinstance(value, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(v, int) for v in p) for p in value
            ):
                raise bad()
            value = [[int(a), int(b)] for a, b in value]
        elif self.type == "mapping":
            if not isinstance(value, dict):
                raise bad()
        if self.choices and value not in self.choices:
            raise CaseSpecError(f"{where}: param '{self.name}' must be one of {list(self.choices)}, not {value!r}")
        return value


@dataclass(frozen=True)
class OutputSpec:
    """One output tensor: its name, dtype and symbolic shape (as TensorSpec), comparison kind and
    what the kind needs."""

    name: str
    kind: str
    doc: str = ""
    dtype: str = ""
    shape: str = ""
    scores: str | None = None  # index kind: aux tensor of reference scores ("in.<name>" for an input)
    order: Literal["sequence", "set"] = "sequence"
    largest: bool = True
    offset_param: str | None = None
    limit: str | None = None  # index kind: aux tensor of per-row exclusive id limits
    fill_is_worst: bool = False  # index kind: -1 lanes are picks of the worst score
    absent_rows: str | None = None  # bf16/f32: context key of ids whose all -1 rows give exactly 0 (structure)
    argument: str | None = None  # bf16/f32: aux tensor of a transcendental output's argument
    terms: str | None = None  # bf16/f32: aux tensor of the largest bf16-rounded term summed per element
    quant: str | None = None  # quantised kind: block format (harness/boundary.py FORMATS)
    encoding: str = "values"  # quantised kind: values | codes | packed | scale_bytes
    pre: str | None = None  # quantised kind: the reference's values before quantisation
    pre_tail: str | None = None  # params path of the RoPE tail width (ulps of the pair's norm there)
    zero_codes: tuple[int, ...] = ()  # exact code outputs: the codes of +0 and -0 (a signed zero, not a mismatch)
    labels: tuple[str, ...] = ()  # what each position of the last dim is (named in failure messages)
    when: str = ""  # present only under this condition ("an index source"); always when empty
    feeds: str = ""  # intermediates: the decision this value is the input of (docs/verdicts.md, "The chain")
    accumulates: bool = False  # bf16/f32: fed by an fp8 GEMM (with fp8 weights): the accumulator model applies
    precision: bool = False  # bf16/f32: judged against its exact value too (more precision never fails)
    kept: str = "digest"  # intermediates: how the golden keeps the reference's value: its row digests
    # (aux `<name>.digest`, harness/chain/digest.py) or, where small, the value itself ("aux": aux `<name>`)

    def base_policy(self) -> Policy:
        return Policy(
            kind=self.kind,
            scores=self.scores,
            order=self.order,
            largest=self.largest,
            offset_param=self.offset_param,
            limit=self.limit,
            fill_is_worst=self.fill_is_worst,
            zero_codes=self.zero_codes,
            labels=self.labels,
            absent_rows=self.absent_rows,
            argument=self.argument,
            terms=self.terms,
            quant=self.quant,
            encoding=self.encoding,
            pre=self.pre,
            pre_tail=self.pre_tail,
            accumulates=self.accumulates,
            precision=self.precision,
        )


@dataclass(frozen=True)
class Rederived:
    """The golden conditioned on accepted boundary flips inside the computation (docs/verdicts.md).

    A quantised intermediate that is not an output (the indexer's fp4 query) can flip at a
    rounding boundary in a correct implementation; what it feeds then differs by more than its
    tolerance. A component's `rederive` hook finds the flips that explain the implementation's
    outputs and returns the reference recomputed with them: replacement expected outputs and aux
    tensors, the number of flips and a sentence naming the first.
    """

    outputs: Tensors
    aux: Tensors
    flips: int
    example: str


# (inputs, expected outputs, aux, actual outputs, params, the boundary Policy) -> Rederived | None
Rederive = Callable[[Tensors, Tensors, Tensors, Tensors, Params, Policy], Rederived | None]
# Outputs whose order the case leaves unspecified (an unsorted top-k): (expected outputs, actual outputs,
# params, the policy of an output by name) -> the expected outputs rearranged into the implementation's
# order, with a sentence saying so, or None (judged as stored: the order is specified, or pinned).
Unordered = Callable[[Tensors, Tensors, Params, Callable[[str], Policy]], "tuple[Tensors, str] | None"]
# A component whose outputs sit downstream of fp8/fp4 decisions judges them along its chain of
# stages (harness/chain): (golden inputs, outputs and aux, the actual outputs and intermediates,
# params, the judge, the boundary Policy) -> every verdict in chain order (chain.stages.ChainJudgement).
Chain = Callable[..., Any]


def single_call(call: Call, inputs: Tensors, params: Params) -> Tensors:
    return call(inputs, params)


@dataclass(frozen=True)
class Component:
    name: str
    summary: str
    upstream: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    build: Callable[[Params, Params, torch.Generator], Tensors]  # (params, build, gen) -> inputs
    reference: Call
    execute: Callable[[Call, Tensors, Params], Tensors] = single_call
    aux: Callable[[Tensors, Params, Tensors], Tensors] | None = None
    floor: int = 1
    expected_outputs: Callable[[Params], tuple[str, ...]] | None = None  # for step-named outputs
    rederive: Rederive | None = None  # boundary flips of an internal quantised value (see Rederived)
    unordered: Unordered | None = None  # outputs in an unspecified order (see Unordered)
    # (inputs, params) -> (reference outputs, aux) in one pass, for components whose aux would
    # otherwise re-run the reference (attention); the generator prefers it to execute + aux
    reference_with_aux: Callable[[Tensors, Params], tuple[Tensors, Tensors]] | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    params: tuple[ParamSpec, ...] = ()
    dims: dict[str, str] = field(default_factory=dict)  # symbolic dim -> its meaning
    # (failing output name, params) -> a line saying what that output holds for this case ('' for none)
    explain: Callable[[str, Params], str] | None = None
    # (inputs, params) -> what the comparator needs only where an output differs from the golden, computed
    # then: `<output>.acc` and `.acc_rms` (an fp8 GEMM's term magnitudes) or `<output>.exact` (the unrounded value)
    judge_context: Callable[[Tensors, Params], Tensors] | None = None

    def with_defaults(self, params: Params) -> Params:
        """`params` with every optional param the case left out set to its default: what an
        implementation receives (the catalogue states each default)."""
        missing = [p for p in self.params if p.has_default and p.name not in params]
        if not missing:
            return params
        filled = dict(params)
        for p in missing:
            value = p.default_for(filled)
            if value is not None:
                filled[p.name] = value
        return filled

    # What one call returns when that differs from the compared outputs (stepped components and
    # outputs the harness derives), and how each compared output comes from it.
    returns: tuple[TensorSpec, ...] | None = None
    derived: dict[str, str] = field(default_factory=dict)
    steps: str = ""  # stepped components: what one call is, and what it receives besides the inputs
    # Optional returns at the decision points (the inputs of act_quant, fp4 round trips, top-k): an
    # implementation may return any of them, each is judged with its own policy, and the outputs
    # downstream are judged given them (docs/verdicts.md, "The chain"). Names are per call.
    intermediates: tuple[OutputSpec, ...] = ()
    chain: Chain | None = None
    # Whether the chain can be walked again under a diagnosis's variant reusing its first verdicts
    # (chain.stages.Reuse; the diagnosis re-runs the reference whole otherwise)
    chain_reuses: bool = False
    # Values the chain derives from the outputs to judge them by, never returned nor stored (attention's
    # kept candidate blocks, judged as candidates.select judges its `blocks`), each with its policy.
    derived_specs: tuple[OutputSpec, ...] = ()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    def reference_golden(self, inputs: Tensors, params: Params) -> tuple[Tensors, Tensors]:
        """The reference's (outputs, aux) for `inputs`, as a golden holds them: the reference's
        intermediates kept as their row digests (or values, where small) in aux, never as outputs.
        The reference may update `inputs` in place (its state): pass a copy to keep them. The
        generator writes this; the diagnosis re-derives it under a variant."""
        from .chain.digest import CASE_DIGEST, case_digest, digests

        if self.reference_with_aux is not None:
            outputs, aux = self.reference_with_aux(inputs, dict(params))
        else:
            frozen = {k: v.clone() for k, v in inputs.items()} if self.aux else {}
            outputs = self.execute(self.reference, inputs, dict(params))
            aux = self.aux(frozen, dict(params), outputs) if self.aux else {}
        outputs, aux = dict(outputs), dict(aux)
        if self.intermediates:
            aux[CASE_DIGEST] = case_digest(outputs)
            for name in [k for k in outputs if self.intermediate_spec(k) is not None]:
                value = outputs.pop(name)
                spec = self.intermediate_spec(name)
                assert spec is not None  # an intermediate (the list above)
                kept = spec.kept
                aux[name if kept == "aux" else f"{name}.digest"] = (
                    value.contiguous() if kept == "aux" else digests(value, 2)
                )
        return outputs, aux

    def param_spec(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)

    def typed_params(self, params: Params, where: str) -> Params:
        """Every case param checked and converted to its declared type (CaseSpecError otherwise)."""
        from .errors import CaseSpecError

        unknown = sorted(k for k in params if self.param_spec(k) is None)
        if unknown:
            raise CaseSpecError(
                f"{where}: {self.name} has no param(s) {unknown}; it takes "
                f"{[p.name for p in self.params if not p.driver]}"
            )
        missing = [p.name for p in self.params if p.required and not p.driver and p.name not in params]
        if missing:
            raise CaseSpecError(f"{where}: {self.name} needs param(s) {missing}")
        typed: Params = {}
        for k, v in params.items():
            spec = self.param_spec(k)
            assert spec is not None  # unknown params were refused above
            typed[k] = spec.coerce(v, where)
        return typed

    def output_names(self, params: Params) -> tuple[str, ...]:
        if self.expected_outputs is not None:
            return self.expected_outputs(params)
        return tuple(o.name for o in self.outputs)

    def intermediate_spec(self, name: str) -> OutputSpec | None:
        """The intermediate a recorded name (`s03.l2.qr` or `index_q`) stands for, or None."""
        base = name.rsplit(".", 1)[-1]
        return next((s for s in self.intermediates if s.name == base), None)

    def output_spec(self, name: str) -> OutputSpec:
        """The spec for `name`. Step outputs such as `s03.rows` or `s03.l2.ids` use the spec of
        their last part; `{prefix}` in a spec's aux references (`scores`, `pre`, `argument`, `terms`)
        becomes the name's prefix (`s03.l2.`), so each step's output is judged against that
        step's aux tensors."""
        base = name.rsplit(".", 1)[-1]
        spec = next((s for s in self.outputs + self.intermediates + self.derived_specs if s.name in (name, base)), None)
        if spec is None:
            raise KeyError(f"component {self.name} has no output {name!r}")
        prefix = name[: len(name) - len(base)]
        refs = {field: getattr(spec, field) for field in AUX_REFERENCES}
        if any(ref and "{prefix}" in ref for ref in refs.values()):
            spec = replace(spec, **{k: v.format(prefix=prefix) for k, v in refs.items() if v})
        return spec


AUX_REFERENCES = ("scores", "pre", "argument", "terms")  # OutputSpec fields naming golden tensors; may hold {prefix}
REGISTRY: dict[str, Component] = {}


def register(component: Component) -> Component:
    if component.name in REGISTRY:
        raise ValueError(f"component {component.name!r} registered twice")
    REGISTRY[component.name] = component
    return component


def registered() -> dict[str, Component]:
    """The components registered so far (harness/known.py imports every definition first)."""
    return REGISTRY
