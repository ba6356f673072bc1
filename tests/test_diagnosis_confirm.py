"""The diagnosis's confirmation along a chain (harness/runner.py `confirmed`) and its stage screen's walk
(harness/chain/stages.py `ONLY`): what they conclude is what re-running the reference whole concludes.

An implementation that returned every stage of its chain is judged again under a variant without re-running
the reference: a stage whose rederivation calls none of the variant's functions, or whose every call returns
what the reference's returns, keeps its first verdict; the others are rederived under the variant on every
row. Where that cannot stand for a re-run (a constant in force, a function the chain never calls, one
called before any stage) the reference is re-run whole.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, replace

import pytest
import torch

from conftest import ROOT
from v41_conformance import regenerated
from v41_conformance.config import load_config
from v41_conformance.diagnosis.patching import same_result
from v41_conformance.diagnosis.variants import together, variant
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.known import get
from v41_conformance.runner import CaseResult, _diagnose, _execute, _judge, _stage_stop, confirmed, rejudged
from impls import wrong_kernels

CONFIG = replace(load_config(ROOT / "conformance.yaml"), diagnosis_budget=64)
MANIFEST = read_manifest(CONFIG.goldens)


def judged(impl, case: str):
    """(component, golden, params, answer, result, message) of `impl` judged on `case`."""
    golden = load_verified(CONFIG.goldens, case, MANIFEST, CONFIG.generate_command)
    component = get(golden.meta["component"])
    regenerated.restore(golden, component)
    params = component.with_defaults(golden.meta["params"])
    result = CaseResult(case, component.name, "error")
    answer = _execute(component, impl, golden, params, result)
    message = _judge(component, golden, dict(answer), params, CONFIG, {}, result)
    return component, golden, params, answer, result, message


def diagnosis(case: str, impl, confirm: bool) -> dict:
    component, golden, params, answer, result, message = judged(impl, case)
    assert result.status == "fail"
    _diagnose(component, golden, dict(answer), params, CONFIG, {}, result, message.stages if confirm else ())
    return result.diagnosis


def names(d: dict) -> list[tuple[str, ...]]:
    return sorted(tuple(m["variants"]) + tuple(m["indistinguishable"]) for m in d["matches"])


def test_same_result_tells_bits_apart_through_what_holds_them():
    a = torch.tensor([1.0, float("nan"), 0.0])
    assert same_result(a, a.clone()) and same_result(torch.tensor(2.0), torch.tensor(2.0))  # NaN, 0-dim
    assert not same_result(a, torch.tensor([1.0, float("nan"), -0.0]))  # the sign of zero
    assert not same_result(a, a.double()) and not same_result(a, a[:2]) and not same_result(a, [1.0])
    pair = namedtuple("pair", "y scales")
    assert same_result(pair(a, 1), pair(a.clone(), 1)) and not same_result(pair(a, 1), pair(a, 2))

    @dataclass
    class Held:
        values: torch.Tensor

    assert same_result(Held(a), Held(a.clone())) and not same_result(Held(a), Held(a + 1))
    assert same_result({"k": (a,)}, {"k": (a.clone(),)}) and not same_result({"k": a}, {"j": a})


@pytest.mark.parametrize("case", ["attention/a-p21-d1x11-upstream", "attention/a-fp8-p21-d1x11-upstream"])
def test_a_norm_bug_is_named_by_a_confirmation_as_by_a_re_run(case):
    """The same names, for fewer re-runs: the norm variant's stages are rederived, the rest keep their verdicts."""
    impl = wrong_kernels.NormBf16BeforeWeight()
    along, whole = diagnosis(case, impl, True), diagnosis(case, impl, False)
    assert names(along) == names(whole) == [("rmsnorm-bf16-before-weight",)]
    assert along["unexplained"] == whole["unexplained"] == []
    assert along["confirmed"] >= 1 and whole["confirmed"] == 0
    assert along["tried"] < whole["tried"] and along["spent"] < whole["spent"]


def test_a_confirmation_stands_only_where_it_can_stand_for_a_re_run():
    """A norm variant is confirmed along the chain; a constant (read without a call), the window ids (which the
    chain takes as the golden's, never rederives) and the YaRN ramp (its tables computed before any stage)
    are left to a whole re-run."""
    component, golden, params, answer, result, message = judged(
        wrong_kernels.NormBf16BeforeWeight(), "attention/a-p21-d1x11-upstream"
    )
    first = {s.name: s.verdict for s in message.stages}

    def confirm(name: str):
        with together((variant(name),)):
            return confirmed(component, golden, dict(answer), params, CONFIG, {}, first)

    norm = confirm("rmsnorm-bf16-before-weight")
    assert norm is not None and norm.changed and all(norm.ok.values())
    assert norm.cost is not None and 0 < norm.cost < 1  # the share of the stages it rederived
    for name in ("fp8-no-amax-floor", "window-newest-first", "yarn-betas-swapped"):
        assert confirm(name) is None, name


def test_a_confirmation_judges_what_the_variant_changes_as_a_re_run_does():
    """Under a variant that computes another norm, the stages it changes fail where a re-run has them fail,
    and what it leaves as the reference computes it keeps the first verdict."""
    component, golden, params, answer, result, message = judged(
        wrong_kernels.NormBf16BeforeWeight(), "attention/a-p21-d1x11-upstream"
    )
    first = {s.name: s.verdict for s in message.stages}
    with together((variant("rmsnorm-bf16-throughout"),)):
        along = confirmed(component, golden, dict(answer), params, CONFIG, {}, first)
        whole = rejudged(component, golden, dict(answer), params, CONFIG, {})
    assert along is not None and whole is not None
    for name in ("s00.l0.qr", "s00.l0.kv"):  # the norm's own stages: failing under either norm
        assert along.ok[name] is False and whole.ok[name] is False
    kept = [n for n in first if n not in along.changed]
    assert kept and all(along.ok[n] == first[n].ok for n in kept)


def test_the_stage_screens_walk_judges_the_stage_as_the_whole_walk_does(monkeypatch):
    """`_stage_stop` passes over the stages before the screened one (nothing judged, nothing rederived):
    what a stage hands on never depends on its verdict, so the screened stage's expected value and verdict
    are those of the whole walk."""
    import v41_conformance.chain.attention as chain
    import v41_conformance.chain.stages as stages
    import v41_conformance.runner as runner

    component, golden, params, answer, result, message = judged(
        wrong_kernels.SinkLeftOut(), "attention/a-p21-d1x11-upstream"
    )
    stage = result.first_divergent_stage
    assert stage == "s00.l0.o"
    fast = _stage_stop(component, golden, dict(answer), params, CONFIG, {}, stage)
    for module in (stages, runner, chain):  # every stage before it judged and rederived
        monkeypatch.setattr(module, "unjudged", lambda name: None)
    slow = _stage_stop(component, golden, dict(answer), params, CONFIG, {}, stage)
    assert fast is not None and slow is not None
    assert fast.ok == slow.ok is False
    assert torch.equal(fast.expected, slow.expected)


def test_a_screen_that_traces_the_variants_calls_concludes_as_the_whole_screen(monkeypatch):
    """A variant that replaces functions alone, none of which rederiving the screened stage calls (probed on
    one row), leaves the stage as it is: the screen fails it without computing the stage, as computing it
    does. Over every applicable variant at a sparse-attention bug's first divergent stage."""
    import v41_conformance.chain.stages as stages
    from v41_conformance.diagnosis.diagnose import applicable
    from v41_conformance.runner import stage_expected, stage_judged

    component, golden, params, answer, result, message = judged(
        wrong_kernels.SinkLeftOut(), "attention/a-p21-d1x11-upstream"
    )
    stage = result.first_divergent_stage
    unchanged = stage_expected(component, golden, dict(answer), params, CONFIG, {}, stage)
    probes = []
    real = stages.Unreached
    monkeypatch.setattr(stages, "Unreached", type("Counted", (real,), {"__init__": lambda s, n: probes.append(n)}))

    def screen(v, traced: bool) -> bool | None:
        with together((v,)) as flip:
            p = flip(params)
            judged_ = stage_judged(
                component, golden, dict(answer), p, CONFIG, {}, stage, unchanged, traced and p == params
            )
        return None if judged_ is None else all(judged_.ok.values())

    variants = applicable("attention", params)
    traced = [screen(v, True) for v in variants]
    assert probes, "no variant was left unreached: the trace decided nothing"
    assert traced == [screen(v, False) for v in variants]
    assert [v.name for v, ok in zip(variants, traced) if ok] == ["sink-left-out"]


def test_a_screen_that_proves_failure_on_a_few_rows_concludes_as_the_whole_screen():
    """A screen rederives a few rows of its stage first (those farthest from the reference's) and fails the
    variant there where they prove the whole stage fails (harness/row_sample.py). Over every applicable
    variant at a sparse-attention bug's first divergent stage: the same verdicts as computing it whole,
    and the rows decide most of them."""
    from v41_conformance.chain.stages import Sample
    from v41_conformance.diagnosis.diagnose import applicable
    from v41_conformance.runner import _rows_fail, stage_expected, stage_judged

    component, golden, params, answer, result, message = judged(
        wrong_kernels.SinkLeftOut(), "attention/a-p21-d1x11-upstream"
    )
    stage = result.first_divergent_stage
    unchanged = stage_expected(component, golden, dict(answer), params, CONFIG, {}, stage)
    rows_fail = _rows_fail(component, golden, params, CONFIG, {})
    proofs: list[bool] = []

    def counted(*args) -> bool:
        proofs.append(rows_fail(*args))
        return proofs[-1]

    sample = Sample(counted, {stage: unchanged}, count=4)

    def screen(v, sample) -> bool | None:
        with together((v,)) as flip:
            p = flip(params)
            judged_ = stage_judged(component, golden, dict(answer), p, CONFIG, {}, stage, unchanged, False, sample)
        return None if judged_ is None else all(judged_.ok.values())

    variants = applicable("attention", params)
    sampled = [screen(v, sample) for v in variants]
    assert sampled == [screen(v, None) for v in variants]
    assert [v.name for v, ok in zip(variants, sampled) if ok] == ["sink-left-out"]
    assert sum(proofs) >= len(variants) // 2, f"{sum(proofs)} of {len(proofs)} screens decided on 4 rows"
    assert sample.chosen[stage].numel() == 4


@pytest.mark.parametrize(
    "impl", [wrong_kernels.SinkLeftOut(), wrong_kernels.NormBf16BeforeWeight()], ids=["sink", "norm"]
)
def test_the_first_judgement_keeps_its_first_failing_stage_as_the_screen_rederives_it(impl):
    """The screen tells a variant that leaves the first divergent stage unchanged by the reference's own
    rederivation of it; the first judgement keeps it (`Message.expected`) rather than rederive it again."""
    from v41_conformance.runner import stage_expected

    component, golden, params, answer, result, message = judged(impl, "attention/a-p21-d1x11-upstream")
    stage = result.first_divergent_stage
    assert list(message.expected) == [stage]
    again = stage_expected(component, golden, dict(answer), params, CONFIG, {}, stage)
    assert again is not None and torch.equal(message.expected[stage], again)


def test_the_screen_starts_at_the_cheapest_failing_stage_of_the_first_divergent_ones_kind():
    """A variant that leaves any failing output failing cannot explain every one: the screen first judges the
    failing stage of the first divergent one's kind in the step of fewest tokens (a decode step's `o`, where
    the first divergent `o` is a prefill's), and the first divergent stage only for the variants it passes."""
    from v41_conformance.runner import _cheapest_like

    schedule = [[0, 1030], [1030, 1031], [1031, 1032]]
    failing = ["s00.l0.o", "s00.l0.qr", "s01.l1.o", "s02.l0.o", "s02.l0.z"]
    assert _cheapest_like("s00.l0.o", failing, schedule) == "s01.l1.o"
    assert _cheapest_like("s00.l0.qr", failing, schedule) == "s00.l0.qr"  # the only one of its kind
    assert _cheapest_like("s00.l0.o", failing, None) == "s00.l0.o"  # no schedule: the stage itself
    assert _cheapest_like("s00.window_ids", ["s00.window_ids", "s01.window_ids"], schedule) == "s01.window_ids"
