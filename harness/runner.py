"""Running one case: load and verify its golden, call the implementation, judge the outputs.

`run_case` never raises for anything an implementation or a golden does wrong: each problem
becomes the status of that case (`error`, `fail`, `unsupported`), with a message that names the
case, the output and what to do. Isolation from crashes and hangs is the worker pool's job
(`v41_conformance.isolation`); this module is what runs inside a worker.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections import ChainMap
from contextvars import ContextVar
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import regenerated
from .case_result import PASSING, STATUSES, CaseResult  # noqa: F401  (the record of a case, re-exported)
from .chain.digest import CASE_DIGEST, case_digest
from .chain.stages import REUSE, Sample, StageVerdict, attribute_problem, differing, unjudged
from .compare import OutputVerdict, compare_output, identical_verdict
from .precision import without_exact
from .adapters.base import Declined, Unsupported
from .adapters.subprocess_adapter import ImplementationError
from .config import Config
from .differences import DIFFERENCES
from .errors import GoldenError, HarnessError
from .golden import Golden, load_verified
from .ids import split_case_id
from .reference.fp8_linear import weight_cache
from .registry import Component, Rederived
from .row_sample import fails_on_rows, largest_finite
from .known import components
from .rundir import DEFAULT_REPORT_DIR, rerun_dir
from .stepnames import step_of
from .tensorbytes import tensor_bytes


class StepError(Exception):
    """Raised by step drivers: the implementation failed at a given step of a schedule. `kind`: the
    case's kind of error, as the runner names it off a schedule (an answer that is no dict or has no
    tensor where one belongs: `type error`; names missing or extra: `missing-output error`,
    `unexpected-output error`; a state or a layer's tensor in another layout: `dtype error`,
    `shape error`); anything the implementation raised is an `exception`."""

    def __init__(self, step: int, message: str, kind: str = "exception"):
        super().__init__(f"step {step}: {message}")
        self.step, self.kind = step, kind


def names_error(missing: list) -> str:
    """The kind of an answer whose output names are not the ones asked for: some `missing`, else some
    unexpected."""
    return "missing-output error" if missing else "unexpected-output error"


def repro_command(case_id: str, impl: str) -> str:
    """The command that re-runs one case, into a report dir of its own (never a run's)."""
    return f"conformance run --impl {impl} --select '{case_id}' --report-dir {_RERUN_DIR}"


_RERUN_DIR = rerun_dir(DEFAULT_REPORT_DIR)


def run_case(
    case_id: str,
    config: Config,
    impl,
    impl_name: str,
    manifest: dict,
    impl_conf: dict | None = None,
    on_executed: Callable[[], None] | None = None,
) -> CaseResult:
    """The case's result. `on_executed` is called once the implementation has run, before its
    outputs are judged (an isolation child tells its parent: the case's timeout covers the
    implementation, not the harness's judgement)."""
    component_name, _ = split_case_id(case_id)
    result = CaseResult(case_id, component_name, "error", repro=repro_command(case_id, impl_name))
    start = time.perf_counter()
    try:
        _run(case_id, config, impl, manifest, impl_conf or {}, result, on_executed)
    except GoldenError as exc:
        result.status, result.kind, result.message = "error", "golden error", f"golden: {exc}"
    except HarnessError as exc:
        result.status, result.kind, result.message = "error", "harness error", str(exc)
    result.duration_s = time.perf_counter() - start
    return result


def _run(
    case_id: str,
    config: Config,
    impl,
    manifest: dict,
    impl_conf: dict,
    result: CaseResult,
    on_executed: Callable[[], None] | None = None,
) -> None:
    registry = components()
    if result.component not in registry:
        raise GoldenError(f"{case_id}: component {result.component!r} is not known to this harness version")
    component = registry[result.component]
    if not _supported(component, impl, result):  # whatever its golden: a missing one is not the implementation's
        return
    golden = load_verified(config.goldens, case_id, manifest, config.generate_command)
    regenerated.restore(golden, component, lend=True)  # verified only where the answer is not the golden's
    result.golden_sha256 = golden.sha256
    _judge_supported(component, golden, impl, config, impl_conf, result, on_executed)


def judge_golden(
    component: Component,
    golden: Golden,
    impl,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
    on_executed: Callable[[], None] | None = None,
) -> None:
    """Run `impl` on one golden (from a file or built in memory) and record the verdict in `result`."""
    if _supported(component, impl, result):
        _judge_supported(component, golden, impl, config, impl_conf, result, on_executed)


def _supported(component: Component, impl, result: CaseResult) -> bool:
    """Whether `impl` supports the component; if not, `result` says so (`unsupported`, or `error`
    when supports() itself raised)."""
    try:
        supported = bool(impl.supports(component.name))
    except Exception as exc:  # an implementation bug, not ours
        result.status, result.message = "error", f"supports({component.name!r}) raised {_exc_line(exc)}"
        result.kind = "exception"
        return False
    if not supported:
        result.status, result.message = "unsupported", f"implementation does not support {component.name}"
    return supported


def _judge_supported(
    component: Component,
    golden: Golden,
    impl,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
    on_executed: Callable[[], None] | None = None,
) -> None:
    params = component.with_defaults(golden.meta["params"])  # every optional param reaches the implementation
    result.params = {k: v for k, v in params.items() if not isinstance(v, (list, dict)) or k == "schedule"}
    actual = _execute(component, impl, golden, params, result)
    if on_executed is not None:
        on_executed()
    if regenerated.lent(golden) and not (actual is not None and _bit_for_bit(component, golden, actual)):
        regenerated.settle(golden, component)  # what follows may rely on the recorded inputs
    if actual is None:
        return
    judged_and_diagnosed(component, golden, actual, params, config, impl_conf, result)


def judged_and_diagnosed(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
) -> None:
    """An answer judged into `result`, and where it fails, diagnosed (`_diagnose`), its message written.
    What is derived from each fp8 weight is derived once for both (`weight_cache`)."""
    with weight_cache():
        message = _judge(component, golden, actual, params, config, impl_conf, result)
        # A failed comparison, or an output of another dtype or shape that a known porting bug may produce
        # (blocks of 32 where upstream has 16 give another number of scales): the case stays an error, named
        # only where a variant reproduces it, shape and all. Wrong names, devices or types: no bug to name.
        reshaped = result.status == "error" and result.kind in RESHAPED
        diagnosis = (
            _diagnose(component, golden, actual, params, config, impl_conf, result, message.stages, message.expected)
            if (result.status == "fail" or reshaped) and result.outputs and config.diagnosis_budget > 0
            else []
        )
    if reshaped and not (result.diagnosis or {}).get("matches"):
        diagnosis, result.diagnosis = [], None  # the protocol error it is, with no name
    result.message = message.text(diagnosis)


def _diagnose(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
    stages: Sequence[StageVerdict] = (),
    expected: Mapping[str, torch.Tensor] | None = None,
) -> list[str]:
    """Name the known porting bugs under which the failing outputs pass (harness/diagnosis): the
    diagnosis is recorded in `result`, its lines for the message returned. `stages`: the judgement's
    verdicts, which a confirmation along the chain reuses (`confirmed`); `expected`: the stages the
    judgement rederived, kept (`Message.expected`), not rederived again for the screen."""
    from .diagnosis import diagnose

    verdicts = {name: bool(m["ok"]) for name, m in result.outputs.items() if m.get("ok") is not None}

    def rejudge(variant_params: dict, stop_on: frozenset[str]):
        return rejudged(component, golden, actual, variant_params, config, impl_conf, stop_on)

    confirm = None
    if component.chain_reuses and _all_own(stages):
        first = {s.name: s.verdict for s in stages}

        def confirm(variant_params: dict, stop_on: frozenset[str]):  # noqa: E306
            if variant_params != params:  # a flip of the case's params: the reference re-run whole
                return None
            return confirmed(component, golden, actual, params, config, impl_conf, first, stop_on)

    screen, screen_cost = None, 1.0
    step, schedule = result.first_divergent_step, params.get("schedule")
    if (
        step is not None
        and isinstance(schedule, list)
        and step + 2 < len(schedule)
        and _worth_screening(schedule, step)
    ):
        screen_cost = (step + 2) / len(schedule)

        def screen(variant_params: dict, stop_on: frozenset[str]):  # noqa: E306
            return rejudged(component, golden, actual, variant_params, config, impl_conf, stop_on, upto=step)

    stage = None
    if component.chain is not None and result.first_divergent_stage:
        first_stage = result.first_divergent_stage
        cheap = _cheapest_like(first_stage, sorted(n for n, ok in verdicts.items() if not ok), schedule)
        known = expected or {}
        unchanged = {
            s: known[s] if s in known else stage_expected(component, golden, actual, params, config, impl_conf, s)
            for s in {first_stage, cheap}
        }
        sample = Sample(_rows_fail(component, golden, params, config, impl_conf), _present(unchanged))

        def stage(variant_params: dict, stop_on: frozenset[str]):  # noqa: E306
            traced = variant_params == params  # functions replaced alone (no params flip): their calls tell
            for s in dict.fromkeys((cheap, first_stage)):  # the cheap one first: a failing stage the variant
                judged = stage_judged(  # leaves failing is one output it cannot explain
                    component, golden, actual, variant_params, config, impl_conf, s, unchanged[s], traced, sample
                )
                if judged is None or s == first_stage or not all(judged.ok.values()):
                    return judged
            return None

    at = result.first_divergent_stage or (
        f"step {result.first_divergent_step}" if result.first_divergent_step is not None else ""
    )
    found = diagnose(
        component.name,
        verdicts,
        params,
        rejudge,
        config.diagnosis_budget,
        at,
        screen,
        screen_cost=screen_cost,
        stage=stage,
        confirm=confirm,
    )
    result.diagnosis = found.to_json()
    return found.lines()


def _present(tensors: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    return {name: t for name, t in tensors.items() if t is not None}


def _rows_fail(component: Component, golden: Golden, params: dict, config: Config, impl_conf: dict):
    """`Sample.fails` for a screen of this case: a stage's rows judged by its policy, without the exact
    value (a variant's expected value is not the reference's), proving the whole stage fails or not."""
    context = golden_context(golden)
    largest: dict[str, float] = {}  # by stage: the same answer at every screen

    def fails(name: str, expected_rows: torch.Tensor, actual_rows: torch.Tensor, actual: torch.Tensor) -> bool:
        policy = config.policy(component, name, impl_conf, dtype=expected_rows.dtype)
        if name not in largest:
            largest[name] = largest_finite(actual)
        return fails_on_rows(
            name, expected_rows, actual_rows, largest[name], policy, without_exact(context, name), params
        )

    return fails


def _all_own(stages: Sequence[StageVerdict]) -> bool:
    """Whether every stage was judged given the implementation's own values (nothing assumed, no value
    of the wrong dtype or shape): then a stage's expected value under a variant depends on the variant
    only through the functions its rederivation calls (`confirmed`)."""
    return bool(stages) and all(not s.assumed and (s.verdict.ok or s.verdict.metrics) for s in stages)


def _cheapest_like(stage: str, failing: list[str], schedule) -> str:
    """The failing output or intermediate of the same kind as `stage` (its name past the step and layer) in
    the step of fewest tokens, the earliest of those: where a screen of that kind costs least (a decode
    step's `o`, one row, where the first divergent `o` may be a 1,030-token prefill's). `stage` where the
    schedule is not known."""
    if not isinstance(schedule, list):
        return stage
    kind = stage.rsplit(".", 1)[-1]

    def tokens(name: str) -> int:
        step = step_of(name)
        return int(schedule[step][1]) - int(schedule[step][0]) if step is not None and step < len(schedule) else 1 << 62

    alike = [n for n in failing if n.rsplit(".", 1)[-1] == kind and step_of(n) is not None]
    return min(alike, key=lambda n: (tokens(n), step_of(n) or 0), default=stage) if stage in failing else stage


# A step's cost in tokens beyond its own (its layers' calls, the Python around them): what makes a small
# schedule's decode steps cost about half its 21-token prefill each.
STEP_OVERHEAD_TOKENS = 16


def _worth_screening(schedule: list, step: int) -> bool:
    """Whether re-running a schedule's first steps, up to the one after the first divergent `step`, costs
    at most half its whole re-run, in tokens plus a per-step overhead. Past that (a 1,030-token prefill
    before four decode steps) a screen costs a whole re-run and saves none: the whole re-run stops at the
    same output you got right that fails, and tells the diagnosis the same."""
    cost = [end - start + STEP_OVERHEAD_TOKENS for start, end in schedule]
    return sum(cost[: step + 2]) <= sum(cost) / 2


def _bit_for_bit(component: Component, golden: Golden, actual: dict) -> bool:
    """Whether the answer holds every output of the golden, bit for bit (the case digest along a
    chain): then it came from the recorded inputs."""
    if component.chain is not None and CASE_DIGEST in golden.aux:
        return _has_case_digest(golden, actual)
    return all(
        isinstance(actual.get(name), torch.Tensor)
        and not attribute_problem(actual[name], want.dtype, want.shape)
        and not bool(differing(actual[name], want, 0).any())
        for name, want in golden.outputs.items()
    )


class _Stopped(Exception):
    """A re-judgement stops at the first output of `stop_on` that fails: nothing after it can change
    what the diagnosis concludes."""

    def __init__(self, name: str, ok: bool = False, expected: torch.Tensor | None = None):
        super().__init__(name)
        self.name, self.ok, self.expected = name, ok, expected  # expected: what it was judged against


def rejudged(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    stop_on: frozenset[str] = frozenset(),
    upto: int | None = None,
):
    """The implementation's outputs judged again, exactly as `_judge` judges them, against the reference
    re-run now on the case's inputs (under whatever variant of a reference function is in force: the
    diagnosis), stopping at the first failing output of `stop_on`. With `upto`, a schedule's first
    steps only: re-run up to step upto + 1 (so step `upto`'s state is computed with the next step's
    start, as the golden was made) and the verdicts of steps up to `upto` returned. None when the
    re-run does not give the golden's outputs (another schedule's, say)."""
    import hashlib

    from .diagnosis import Rejudged
    from .index_verdict import tie_choice_bits, tied_rows

    if upto is not None:
        params = {**params, "schedule": params["schedule"][: upto + 2]}
        within = lambda name: (step_of(name) or 0) <= upto + 1  # noqa: E731
        golden = dataclasses.replace(
            golden,
            outputs={n: v for n, v in golden.outputs.items() if within(n)},
            aux={n: v for n, v in golden.aux.items() if within(n)},
        )
        actual = {n: v for n, v in actual.items() if within(n)}
        stop_on = frozenset(n for n in stop_on if (step_of(n) or 0) <= upto)  # step upto + 1 is not judged
    outputs, aux = component.reference_golden({k: v.clone() for k, v in golden.inputs.items()}, params)
    if set(outputs) != set(golden.outputs):
        return None
    changed = {n for n, v in outputs.items() if not _same_bits(v, golden.outputs[n])}
    changed |= {
        n.removesuffix(".digest")
        for n, v in aux.items()
        if n.endswith(".digest") and not (n in golden.aux and _same_bits(v, golden.aux[n]))
    }
    digest = hashlib.sha256()
    for name, value in [*sorted(outputs.items()), *sorted((n, v) for n, v in aux.items() if n.endswith(".digest"))]:
        digest.update(name.encode())
        digest.update(tensor_bytes(value))
    if not changed:  # the variant computes what the reference computes on this case
        return Rejudged({}, frozenset(), digest.hexdigest())
    again = dataclasses.replace(golden, outputs=outputs, aux=aux)
    context = golden_context(again)
    evidence, tied = {}, {}
    for name in sorted(changed & set(outputs)):
        policy = config.policy(component, name, impl_conf, dtype=outputs[name].dtype)
        scores = context.get(policy.scores) if policy.kind == "index" and policy.scores else None
        if scores is not None and scores.shape[:-1] == outputs[name].shape[:-1]:
            offset = int(params.get(policy.offset_param, 0)) if policy.offset_param else 0
            largest = bool(params.get("largest", policy.largest))
            evidence[name] = tie_choice_bits(golden.outputs[name], scores, offset=offset, largest=largest)
            tied[name] = tied_rows(golden.outputs[name], scores, offset=offset, largest=largest)
    judged, _ = _declined(again, actual)
    scratch = CaseResult(golden.meta.get("case_id", ""), component.name, "error")
    try:
        stages = _verdicts(component, again, judged, params, config, impl_conf, scratch, stop_on, frozenset(changed))
    except _Stopped as stopped:
        return Rejudged(
            {stopped.name: False}, frozenset(changed), digest.hexdigest(), evidence, complete=False, tied=tied
        )
    ok = {s.name: bool(s.verdict.ok) for s in stages if upto is None or (step_of(s.name) or 0) <= upto}

    nearer = _nearer(golden, outputs, frozenset(changed), actual)
    return Rejudged(ok, frozenset(changed), digest.hexdigest(), evidence, nearer=nearer, tied=tied)


def _nearer(golden: Golden, expected: dict, changed: frozenset[str], actual: dict) -> Callable[[str], bool]:
    """name -> whether the variant moved that output's expected value (`expected[name]`, from the golden's)
    toward the implementation's answer; asked only of a failing output a pass would explain. An output
    the variant leaves as it is, or an intermediate the golden holds no value of, counts as moved."""

    def nearer(name: str) -> bool:
        return (
            name not in changed
            or name not in golden.outputs
            or moves_toward(golden.outputs[name], expected[name], actual.get(name))
        )

    return nearer


def confirmed(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    first: dict[str, OutputVerdict],
    stop_on: frozenset[str] = frozenset(),
):
    """What `rejudged` concludes under the variant in force, without re-running the reference: the chain
    walked again given the implementation's own values (every stage's, `_all_own`), each stage whose
    rederivation calls one of the variant's functions rederived under it on every row and judged
    without the reference's exact value, every other stage keeping its first verdict (`first`): given
    the same inputs it computes what the reference computes. None where that cannot stand for a
    re-run: a constant in force (read without a call), a function the walk never called (the
    reference may compute through it what the chain takes as the golden's: the window ids), or one
    called before any stage (the RoPE tables)."""
    import hashlib

    from .chain.stages import REUSE, Reuse, Untargeted
    from .diagnosis import Rejudged
    from .diagnosis.patching import TRACE, Trace, in_force

    functions, constants = in_force()
    if constants or not functions:
        return None
    reuse = Reuse(first, Trace())
    traced, token = TRACE.set(reuse.trace), REUSE.set(reuse)
    judged, _ = _declined(golden, actual)
    scratch = CaseResult(golden.meta.get("case_id", ""), component.name, "error")
    stopped = None
    try:
        stages = _verdicts(component, golden, judged, params, config, impl_conf, scratch, stop_on)
    except _Stopped as stop:
        stopped = stop
    except Untargeted:
        return None
    finally:
        REUSE.reset(token)
        TRACE.reset(traced)
    if not reuse.walked:
        return None
    changed = frozenset(reuse.changed)
    digest = hashlib.sha256()
    for name in sorted(changed):
        digest.update(name.encode())
        digest.update(tensor_bytes(reuse.changed[name]))
    cost = reuse.rederived / max(len(first), 1)  # the share of the stages rederived
    if stopped is not None:  # the variant changes an output you got right, and fails it: conclusive
        return Rejudged({stopped.name: False}, changed, digest.hexdigest(), complete=False, cost=cost)
    if not set(functions) <= reuse.seen | reuse.trace.called:
        return None
    if not changed:
        return Rejudged({}, frozenset(), digest.hexdigest(), cost=cost)

    ok = {s.name: bool(s.verdict.ok) for s in stages}
    nearer = _nearer(golden, reuse.changed, changed, actual)
    return Rejudged(ok, changed, digest.hexdigest(), nearer=nearer, cost=cost)


def stage_judged(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    stage: str,
    unchanged: torch.Tensor | None = None,
    traced: bool = False,
    sample: Any = None,
):
    """One stage of a chain judged under whatever variant of a reference function is in force, given the
    implementation's own inputs to it (the golden's values wherever nothing differs): the chain walked up
    to that stage only, nothing re-run, the stage's differing rows rederived under the variant (never
    taken as the golden's), judged without the reference's exact value. A `Rejudged` of that one stage,
    None where the walk never reached it (the diagnosis's screen of its first divergent stage).

    `unchanged`: the stage as the reference rederives it (`stage_expected`). A variant that rederives it
    bit for bit so does not change it, and it fails as it does under the reference: judged without the
    exact value, an output whose failure is its precision (one rounding too many) would pass under every
    variant, as a whole re-run judges it with the exact value wherever the variant leaves it unchanged.
    `traced`: the variant replaces functions alone (no params flip); where rederiving the stage calls none of
    them (probed on one row; no constant in force) it is left as it is, and fails so, computed no further.
    `sample` (chain.stages.Sample): a few of the stage's rows rederived first; where they prove it fails
    (harness/row_sample.py), it fails, computed no further."""
    from .chain.stages import SAMPLE, SCREEN_TRACE, Proven, Unreached
    from .diagnosis import Rejudged
    from .diagnosis.patching import TRACE, Trace, in_force

    trace = Trace(compare=False) if traced and not in_force()[1] else None
    tokens = (SCREEN_TRACE.set(trace), TRACE.set(trace)) if trace is not None else None
    sampled = SAMPLE.set(sample)
    try:
        stopped = _stage_stop(component, golden, actual, params, config, impl_conf, stage)
    except Unreached:
        return Rejudged({stage: False}, frozenset(), "", complete=False)
    except Proven:
        return Rejudged({stage: False}, frozenset({stage}), "", complete=False)
    finally:
        SAMPLE.reset(sampled)
        if tokens is not None:
            SCREEN_TRACE.reset(tokens[0])
            TRACE.reset(tokens[1])
    if stopped is None:
        return None
    same = unchanged is not None and stopped.expected is not None and _same_bits(stopped.expected, unchanged)
    return Rejudged({stage: stopped.ok and not same}, frozenset() if same else frozenset({stage}), "", complete=False)


def stage_expected(
    component: Component, golden: Golden, actual: dict, params: dict, config: Config, impl_conf: dict, stage: str
) -> torch.Tensor | None:
    """The first divergent stage as the reference rederives it from your inputs (what `stage_judged`
    tells a variant that leaves it unchanged by); None where the walk never reaches it."""
    stopped = _stage_stop(component, golden, actual, params, config, impl_conf, stage)
    return None if stopped is None else stopped.expected


def _stage_stop(
    component: Component, golden: Golden, actual: dict, params: dict, config: Config, impl_conf: dict, stage: str
) -> _Stopped | None:
    from .chain.stages import ONLY, REDERIVED

    judged, _ = _declined(golden, actual)
    scratch = CaseResult(golden.meta.get("case_id", ""), component.name, "error")
    token, only = REDERIVED.set(frozenset({stage})), ONLY.set(stage)
    try:
        _verdicts(
            component, golden, judged, params, config, impl_conf, scratch, inexact=frozenset({stage}), stop_after=stage
        )
    except _Stopped as stopped:
        return stopped
    finally:
        ONLY.reset(only)
        REDERIVED.reset(token)
    return None


def moves_toward(before: torch.Tensor, after: torch.Tensor, answer: Any) -> bool:
    """Whether an expected value moved from `before` (the golden's) to `after` (a variant's) comes nearer
    the implementation's `answer`: a smaller L2 distance over the elements finite in all three (floats),
    fewer differing elements (ids, codes, masks). An answer that cannot be read is near nothing."""
    if not isinstance(answer, torch.Tensor) or answer.device.type != "cpu":
        return False
    floats = before.dtype.is_floating_point and answer.dtype.is_floating_point  # judged in the answer's format
    if answer.shape != before.shape or (answer.dtype != before.dtype and not floats):  # a protocol error:
        return (after.shape, after.dtype) == (answer.shape, answer.dtype)  # nearer only onto the answer's form
    if after.shape != before.shape:
        return False
    if before.dtype.is_floating_point and answer.dtype.is_floating_point:
        b, v, a = before.double(), after.double(), answer.double()
        known = torch.isfinite(b) & torch.isfinite(v) & torch.isfinite(a)
        zero = torch.zeros((), dtype=torch.float64)
        near, far = float(torch.where(known, a - v, zero).norm()), float(torch.where(known, a - b, zero).norm())
        if near != far:
            return near < far
    # ids, codes, masks; floats equally far (a signed zero, a NaN): fewer elements whose bits differ
    each = answer.dim()  # one row per element
    return int(differing(answer, after, each).sum()) < int(differing(answer, before, each).sum())


def _has_case_digest(golden: Golden, actual: dict) -> bool:
    """Whether the answer is the reference's every value along a chain: CPU tensors whose case digest
    is the one the golden stored (False where it stores none)."""
    stored = golden.aux.get(CASE_DIGEST)
    if stored is None or not all(isinstance(v, torch.Tensor) and v.is_cpu for v in actual.values()):
        return False
    try:
        return torch.equal(case_digest(actual), stored)
    except Exception:  # an answer the digest cannot read (a sparse tensor, say): not the golden's
        return False


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:  # another device: compare_output says so
        return False
    if a.dtype.is_floating_point:
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    return torch.equal(a, b)


def _execute(component: Component, impl, golden: Golden, params: dict, result: CaseResult) -> dict | None:
    def call(inputs: dict[str, torch.Tensor], call_params: dict[str, Any]) -> dict[str, torch.Tensor]:
        return impl.run(component.name, inputs, call_params)

    lent = regenerated.lent(golden)  # unverified, lent without a copy (settled unless the answer is the golden's)
    inputs = {k: v if k in lent else v.clone() for k, v in golden.inputs.items()}
    try:
        actual = component.execute(call, inputs, dict(params))
    except Unsupported as exc:
        result.status = "unsupported"
        result.message = (
            f"implementation does not support this case: {exc}"
            if str(exc)
            else "implementation does not support this case"
        )
        return None
    except StepError as exc:
        result.status, result.kind, result.message = "error", exc.kind, f"implementation failed at {exc}"
        if exc.__cause__ is not None:
            result.message += _implementation_frames(exc.__cause__)
        result.first_divergent_step = exc.step
        return None
    except ImplementationError as exc:  # a program behind the subprocess adapter said so
        result.status, result.kind, result.message = "error", "program error", f"the implementation's program: {exc}"
        return None
    except Exception as exc:
        result.status, result.kind = "error", "exception"
        result.message = f"implementation raised {_exc_line(exc)}" + _implementation_frames(exc)
        return None
    if not isinstance(actual, dict):
        result.status, result.kind = "error", "type error"
        result.message = f"run() returned {type(actual).__name__}, expected a dict of tensors"
        return None
    return actual


def _declined(golden: Golden, actual: dict) -> tuple[dict, dict[str, str]]:
    """The outputs with each declined one (`Declined`) stood in for by the reference's value (so what
    is judged given it is judged given the reference's), and the declined names with their reasons."""
    declined = {n: v.reason for n, v in actual.items() if isinstance(v, Declined)}
    if not declined:
        return actual, {}
    kept = {
        n: (golden.outputs[n] if n in declined else v)
        for n, v in actual.items()
        if n not in declined or n in golden.outputs
    }  # a declined intermediate is one not returned
    return kept, {n: r for n, r in declined.items() if n in golden.outputs}


@dataclass
class Message:
    """A judged case's message in the order a reader acts on it: `lead` (what failed first, with
    its evidence, then the chain), the diagnosis (inserted once it is known), then `rest` (the
    other failing outputs)."""

    lead: list[str] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)
    stages: list[StageVerdict] = field(default_factory=list)  # every verdict (the diagnosis may reuse them)
    # the first failing stage's expected value, where it is an intermediate: what the diagnosis's screen tells
    # an unchanged variant by (`stage_expected` rederives it otherwise)
    expected: dict[str, torch.Tensor] = field(default_factory=dict)

    def text(self, diagnosis: Sequence[str] = ()) -> str:
        return "\n".join([*self.lead, *diagnosis, *self.rest]).strip("\n")


@dataclass
class _Kept:
    """What the first judgement keeps of its first failing stage (`Message.expected`)."""

    seen: bool = False
    expected: dict[str, torch.Tensor] = field(default_factory=dict)


# Set while a case is first judged (`_judged`): an intermediate's expected value is the reference rederived
# from your inputs to it on its differing rows, as a diagnosis's screen of that stage rederives it.
_KEPT: ContextVar[_Kept | None] = ContextVar("_KEPT", default=None)


# What an output's attribute problem (harness/compare.py) is, for the kind of a case's error.
PROTOCOL_KINDS = (("dtype ", "dtype error"), ("shape ", "shape error"), ("tensor is on ", "device error"))
RESHAPED = ("dtype error", "shape error")  # what a porting bug can produce (the diagnosis may name it)


def _protocol_kind(message: str) -> str:
    problem = message.split(": ", 1)[-1]
    return next((kind for start, kind in PROTOCOL_KINDS if problem.startswith(start)), "type error")


def _judge(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
) -> Message:
    """Judge every output into `result` (status, outputs, metrics, chain, the message without a
    diagnosis) and return the message in its parts (the diagnosis goes between them)."""
    message = _judged(component, golden, actual, params, config, impl_conf, result)
    result.message = message.text()
    return message


def _judged(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
) -> Message:
    expected_names = set(golden.outputs)
    actual, declined = _declined(golden, actual)
    if declined and set(declined) >= expected_names:
        result.status = "unsupported"
        return Message(
            [
                "the implementation declined every output: "
                + "; ".join(f"{n} ({r})" for n, r in sorted(declined.items()))
            ]
        )
    missing = sorted(expected_names - set(actual))
    extra = sorted(n for n in set(actual) - expected_names if component.intermediate_spec(n) is None)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing output(s) {missing}")
        if extra:
            parts.append(f"unexpected output(s) {extra}")
        result.status, result.kind = "error", names_error(missing)
        return Message([f"{'; '.join(parts)}; {component.name} returns {sorted(expected_names)}"])
    failures: list[tuple[bool, str]] = []  # (explained, message)
    attribute_errors: list[str] = []
    first_step = None
    kept = _Kept()
    token = _KEPT.set(kept)
    try:
        stages = _verdicts(component, golden, actual, params, config, impl_conf, result)
    finally:
        _KEPT.reset(token)
    for stage in stages:
        name, verdict = stage.name, stage.verdict
        policy = config.policy(component, name, impl_conf, dtype=_dtype_of(golden, name, actual))
        if name in declined:  # never a pass: judged nowhere, and said so
            result.outputs[name] = {"ok": None, "declined": declined[name], "policy": policy.describe()}
            continue
        record = result.outputs[name] = {"ok": verdict.ok, "policy": policy.describe(), **verdict.metrics}
        _add_chain_fields(record, stage)
        _count_differences(result, verdict)
        if verdict.ok:
            if verdict.message or stage.rederived_rows:
                record["note"] = "\n".join(filter(None, (_rederived_note(stage), verdict.message)))[:NOTE_CHARS]
            continue
        message = verdict.message + _given_lines(stage)
        said = component.explain(name, params) if component.explain is not None else ""
        if said:  # right under the output's first line, where the terminal report shows it
            head, _, rest = message.partition("\n")
            message = f"{head}\n  {said}" + (f"\n{rest}" if rest else "")
        if not verdict.metrics:  # attribute problem: wrong dtype, shape or type
            attribute_errors.append(message)
        else:
            failures.append((stage.explained, message))
        if component.chain is not None and not result.first_divergent_stage:
            result.first_divergent_stage = name
        step = step_of(name)
        if step is not None and (first_step is None or step < first_step):
            first_step = step
    result.first_divergent_step = first_step
    result.metrics = summarise_metrics(result.outputs)
    result.chain = chain_summary(stages) if component.chain is not None else ""
    # Real differences (misses, mismatches, a policy) lead, in chain order; differences the harness
    # explains but this implementation's flags refuse (tie order, near ties, strict boundaries) follow.
    failed = [message for _, message in sorted(failures, key=lambda f: f[0])]
    chain = [result.chain] if result.chain else []
    if attribute_errors:  # a protocol error: what was answered, before any value
        result.status, result.kind = "error", _protocol_kind(attribute_errors[0])
        out = Message(attribute_errors + failed)
    elif failed:
        result.status = "fail"
        lead = [f"first divergent step: {first_step}"] if first_step is not None else []
        if result.first_divergent_stage:
            lead.append(f"first divergent stage: {result.first_divergent_stage}")
        # the first failure's evidence, then the chain (and the diagnosis), then the other failures
        out = Message(lead + failed[:1] + chain, failed[1:])
    else:
        result.status = "partial" if declined else "pass"
        accepted = [f"{getattr(result, d.count)} {d.what}" for d in DIFFERENCES if getattr(result, d.count)]
        out = Message((["; ".join(accepted) + " (accepted by policy)"] if accepted else []) + chain)
    out.stages = stages
    out.expected = kept.expected
    if declined:
        said = "; ".join(f"{n} ({r})" for n, r in sorted(declined.items()))
        judged = "judged on the others" + (
            ", those given a declined one given the reference's" if component.chain else ""
        )
        out.lead.insert(0, f"declined output(s), not judged: {said}; {judged}")
        result.declined = sorted(declined)
    return out


def _verdicts(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
    stop_on: frozenset[str] = frozenset(),
    inexact: frozenset[str] = frozenset(),
    stop_after: str | None = None,
) -> list[StageVerdict]:
    """Every output's verdict (and every returned intermediate's), in the order they are reported:
    along the component's chain where it has one, else by name against the golden as stored (or
    conditioned on the boundary flips its `rederive` hook finds). `_Stopped` at the first failing
    output of `stop_on` (the diagnosis), or right after the chain's stage `stop_after`, with its verdict. The
    outputs named in `inexact` are judged without their exact value (a variant's: the reference's distance
    from the exact value says nothing of the variant's)."""
    if component.chain is not None:
        if _has_case_digest(golden, actual):  # the reference's every value (else judged stage by stage)
            return [
                StageVerdict(
                    name,
                    identical_verdict(name, value, config.policy(component, name, impl_conf, dtype=value.dtype)),
                    intermediate=name not in golden.outputs,
                )
                for name, value in sorted(actual.items())
            ]
        context = golden_context(golden)

        def judge(name: str, expected: torch.Tensor, value, extra: dict) -> OutputVerdict:
            passed_over = unjudged(name)
            if passed_over is not None:
                return passed_over
            changed = False
            reuse = REUSE.get()
            if reuse is not None:  # walked again under a variant (`confirmed`)
                trace = reuse.trace
                changed, reuse.rederived = bool(trace.diverged), reuse.rederived + bool(trace.called)
                reuse.seen |= trace.called
                trace.clear()
                if not changed and name in reuse.first:
                    return reuse.first[name]  # computed as the reference computes it: its first verdict
                reuse.changed[name] = expected
            policy = config.policy(component, name, impl_conf, dtype=expected.dtype)
            given = ChainMap(extra, context) if extra else context
            exactless = name in inexact or changed
            verdict = compare_output(
                name, expected, value, policy, without_exact(given, name) if exactless else given, params
            )
            kept = _KEPT.get()
            if kept is not None and not verdict.ok and not kept.seen:  # the first judgement's first failure
                kept.seen = True
                if name not in golden.outputs:  # an intermediate: rederived as a screen rederives it
                    kept.expected[name] = expected
            if (not verdict.ok and name in stop_on) or name == stop_after:
                raise _Stopped(name, bool(verdict.ok), expected)
            return verdict

        chain = component.chain(
            golden.inputs,
            golden.outputs,
            golden.aux,
            actual,
            params,
            judge,
            config.boundary_policy(component, impl_conf),
        )
        result.boundary_flips += chain.flips
        result.boundary_example = result.boundary_example or chain.flip_example
        return chain.verdicts
    golden, rederived = _rederived(component, golden, actual, params, config, impl_conf, result)
    golden, reordered = _reordered(component, golden, actual, params, config, impl_conf)
    context = golden_context(golden)
    if component.judge_context is not None and any(
        not _same_bits(actual[n], golden.outputs[n]) for n in golden.outputs if isinstance(actual.get(n), torch.Tensor)
    ):
        context.update(component.judge_context(golden.inputs, params))
    out = []
    for name in sorted(golden.outputs):
        expected = golden.outputs[name]
        policy = config.policy(component, name, impl_conf, dtype=expected.dtype)
        given = without_exact(context, name) if name in inexact else context
        verdict = compare_output(name, expected, actual[name], policy, given, params)
        if not verdict.ok and name in stop_on:
            raise _Stopped(name)
        if rederived is not None and name in rederived.outputs:
            verdict.message = (
                f"judged against the reference recomputed with {rederived.example}\n{verdict.message}".strip()
            )
        if reordered and name in reordered[0] and verdict.message:  # right under the output's first line
            head, _, rest = verdict.message.partition("\n")
            verdict.message = f"{head}\n  {reordered[1]}" + (f"\n{rest}" if rest else "")
        out.append(StageVerdict(name, verdict))
    return out


def _reordered(
    component: Component, golden: Golden, actual: dict, params: dict, config: Config, impl_conf: dict
) -> tuple[Golden, tuple[dict, str] | None]:
    """The golden with the outputs whose order the case leaves unspecified put in the
    implementation's order (the component's `unordered` hook), and what was rearranged."""
    if component.unordered is None:
        return golden, None
    found = component.unordered(
        golden.outputs,
        actual,
        params,
        lambda name: config.policy(component, name, impl_conf, dtype=golden.outputs[name].dtype),
    )
    if found is None:
        return golden, None
    return dataclasses.replace(golden, outputs={**golden.outputs, **found[0]}), found


def _dtype_of(golden: Golden, name: str, actual: dict) -> torch.dtype | None:
    value = golden.outputs.get(name, actual.get(name))
    return value.dtype if isinstance(value, torch.Tensor) else None


def _add_chain_fields(record: dict[str, Any], stage: StageVerdict) -> None:
    """Add what results.json records of where an output sits in its chain (nothing off a chain)."""
    if stage.intermediate:
        record["intermediate"] = True
    if stage.given:
        record["given"] = list(stage.given)
    if stage.assumed:
        record["assumed"] = list(stage.assumed)
    if stage.rederived_rows:
        record["rederived_rows"] = stage.rederived_rows
    if stage.hint:
        record["hint"] = stage.hint


def _given_lines(stage: StageVerdict) -> str:
    """A failing stage's chain: what it was judged given, and what to return to settle it."""
    lines = []
    if stage.given or stage.assumed:
        parts = [f"your {', '.join(stage.given)}"] if stage.given else []
        if stage.assumed:
            parts.append(f"the reference's {', '.join(stage.assumed)} (you returned none that passed)")
        lines.append(
            f"  judged given {'; '.join(parts)}"
            + (f"; {stage.rederived_rows} row(s) rederived" if stage.rederived_rows else "")
        )
    if stage.hint:
        lines.append(f"  to settle it: {stage.hint}")
    return "".join("\n" + line for line in lines)


def chain_summary(stages: list[StageVerdict]) -> str:
    """The chain of the call that holds the first failure (else of the first call whose values differ
    from the golden's): each of its stages in order with what it was judged given, e.g. "chain at
    s00.l1: qr: 19 row(s) differ ... -> index_q given your qr: ... -> out given your z: as the golden"."""
    first = next((s for s in stages if not s.verdict.ok and s.name.count(".") >= 2), None) or next(
        (s for s in stages if s.rederived_rows and s.name.count(".") >= 2), None
    )
    if first is None:
        return ""
    call = first.name.rsplit(".", 1)[0]
    steps = [s for s in stages if s.name.rsplit(".", 1)[0] == call]
    parts = []
    for s in steps:
        base = s.name.rsplit(".", 1)[-1]
        given = f" given your {', '.join(s.given)}" if s.given else ""
        if not s.verdict.ok:
            state = "FAILS"
        elif s.rederived_rows:
            used = s.verdict.metrics.get("bound_used")
            within = f", within {used:.2g} of its bound" if isinstance(used, float) and used else ""
            state = f"{s.rederived_rows} row(s) differ from the golden{within}"
        else:
            state = "as the golden"
        parts.append(f"{base}{given}: {state}")
    what = "the first failure" if not first.verdict.ok else "the first call whose values differ"
    return f"chain at {call} ({what}): " + " -> ".join(parts)


def _rederived_note(stage: StageVerdict) -> str:
    if not stage.rederived_rows:
        return ""
    given = f" given your {', '.join(stage.given)}" if stage.given else ""
    return (
        f"output '{stage.name}': {stage.rederived_rows} row(s) differ from the golden; judged against the "
        f"reference rederived{given}"
    )


def _rederived(
    component: Component,
    golden: Golden,
    actual: dict,
    params: dict,
    config: Config,
    impl_conf: dict,
    result: CaseResult,
) -> tuple[Golden, Rederived | None]:
    """The golden the outputs are judged against: as stored, or conditioned on boundary flips
    inside the computation that explain the implementation's outputs (`Rederived`)."""
    if component.rederive is None:
        return golden, None
    policy = config.boundary_policy(component, impl_conf)
    if not policy.accept_boundary:
        return golden, None
    found = component.rederive(golden.inputs, golden.outputs, golden.aux, actual, params, policy)
    if found is None:
        return golden, None
    result.boundary_flips += found.flips
    if found.flips:
        result.boundary_example = result.boundary_example or found.example
    outputs, aux = {**golden.outputs, **found.outputs}, {**golden.aux, **found.aux}
    return dataclasses.replace(golden, outputs=outputs, aux=aux), found


def golden_context(golden: Golden) -> dict[str, torch.Tensor]:
    """What the comparator may consult: inputs as in.*, the reference's outputs as out.*, aux."""
    return {
        **{f"in.{k}": v for k, v in golden.inputs.items()},
        **{f"out.{k}": v for k, v in golden.outputs.items()},
        **golden.aux,
    }


def _count_differences(result: CaseResult, verdict) -> None:
    """Add an output's counted differences (tie rows, near ties, boundary flips) to the case."""
    metrics = verdict.metrics
    for d in DIFFERENCES:
        if metrics.get(d.metric):
            setattr(result, d.count, getattr(result, d.count) + int(metrics[d.metric]))
            if not getattr(result, d.example):
                setattr(result, d.example, verdict.message)


NOTE_CHARS = 1200  # an output's explanation of what it accepted, as kept in results.json

WORST = ("max_ulps", "rel_l2", "max_abs_err", "diff_fraction", "bound_used", "ulps_headroom", "rel_l2_headroom")
TOTAL = ("mismatched", "rows_miss", *(d.metric for d in DIFFERENCES))


def summarise_metrics(outputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One line of numbers per case: the worst of each error metric and the total of each count
    (a declined output is neither passed nor failed, and in neither)."""
    judged = [m for m in outputs.values() if m.get("ok") is not None]
    summary: dict[str, Any] = {"outputs": len(judged), "outputs_failed": sum(not m["ok"] for m in judged)}
    if len(judged) < len(outputs):
        summary["outputs_declined"] = len(outputs) - len(judged)
    # one column at a time: a case reports hundreds of outputs
    for key in WORST:
        values = [v for m in judged if isinstance(v := m.get(key), (int, float))]
        if values:
            summary[key] = max(values)
    for key in TOTAL:
        values = [v for m in judged if isinstance(v := m.get(key), int)]
        if values:
            summary[key] = sum(values)
    return summary


def _exc_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _implementation_frames(exc: BaseException, frames: int = 6) -> str:
    """The raising code's own frames, innermost last (the harness's frames and the adapters' are
    left out: they are the same for every implementation)."""
    harness_dir = str(Path(__file__).resolve().parent)
    stack = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not str(Path(f.filename).resolve()).startswith(harness_dir)
    ]
    if not stack:
        return ""
    lines = traceback.format_list(stack[-frames:])
    return "\nTraceback of the implementation (most recent call last):\n" + "".join(lines).rstrip()
