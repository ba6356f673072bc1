"""The diagnosis of failing cases (docs/diagnosis.md, harness/diagnosis): every variant of the catalogue
is named for an implementation with that bug, independently written wrong kernels get theirs, a bug
outside the catalogue is named as none, correct gates get no diagnosis, and the budget holds.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest

from conftest import ROOT
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.config import load_config
from v41_conformance.diagnosis import VARIANTS
from v41_conformance.diagnosis.variants import variant
from v41_conformance.golden import read_manifest
from v41_conformance.ids import matches, parse_select
from v41_conformance.runner import run_case
from impls import wrong, wrong_attention, wrong_compressor, wrong_fp8, wrong_indexer, wrong_kernels
from impls.gate_upstream import UpstreamTorch
from impls.rope_tables import SwappedRamp

CONFIG = replace(load_config(ROOT / "conformance.yaml"), diagnosis_budget=64)
MANIFEST = read_manifest(CONFIG.goldens)

# Where each variant shows, in cheap cases (the first two of the pattern it changes are judged).
WHERE = {
    "e2m1-ties-toward-zero": "quant.e2m1/*",
    "e2m1-dequant-minus-zero-as-plus-zero": "quant.e2m1/*",
    "fp4-amax-floor-1e-4": "quant.fp4_e8m0/zero-blocks-*",
    "fp4-amax-floor-1e-12": "quant.fp4_e8m0/zero-blocks-*",
    "fp8-scale-floor-1e-4": "quant.fp8_ue8m0/zero-blocks-*",
    "rmsnorm-bf16-before-weight": "norm.rms/*",
    "rmsnorm-eps": "norm.rms/small-rows-*",
    "rope-bf16-table": "rope.apply/*",
    "rope-halves": "rope.apply/*",
    "rope-first-dims": "rope.apply/*",
    "yarn-betas-swapped": "rope.yarn_table/*",
    "e2m1-minus-zero-lost": "quant.fp4_e8m0/*",
    "e2m1-ties-away": "quant.e2m1/*",
    "pow2-scale-floor": "quant.fp8_ue8m0/*",
    "fp8-blocks-64": "quant.fp8_ue8m0/*",
    "fp8-blocks-128": "quant.fp8_ue8m0/*",
    "fp8-no-amax-floor": "quant.fp8_ue8m0/zero-blocks-*",
    "fp4-e4m3-as-pow2-blocks-32": "quant.fp4_e4m3/*",
    "fp4-e4m3-scale-bf16": "quant.fp4_e4m3/*",
    "fp8-linear-without-act-quant": "linear.fp8/*-4x256x64",
    "index-scores-without-relu": "indexer.scores/*",
    "index-scores-without-head-weights": "indexer.scores/*",
    "index-scores-scale-on-scores": "indexer.weights/*",
    "topk-lowest-index-ties": "indexer.select/ties-*",
    "candidate-leak-other-policy": "indexer.select/leak-*",
    "candidate-blocks-zero-padding": "candidates.select/r1-prefill-*",
    "window-newest-first": "window.indices/*",
    "gate-softmax-over-channels": "compressor/r2-tiny-*",
    "sink-left-out": "sparse_attn/*",
    "sink-scaled": "sparse_attn/*",
    "stale-index-keys-other-policy": "attention/a-p21-d3-d4-d1x4-gen-fixed",
    "rmsnorm-bf16-throughout": "norm.rms/*",
    "rmsnorm-output-bf16": "norm.rms/fp32-*",
    "yarn-no-ramp": "rope.yarn_table/*",
    "e2m1-zero-input-sign-lost": "quant.fp4_e4m3/zero-blocks-*",
    "fp8-no-amax-floor-at-all": "quant.fp8_ue8m0/zero-blocks-*",
    "attention-logits-bf16": "sparse_attn/*",
    "attention-eager-bf16-with-sinks": "sparse_attn/*",
}
STRICT = {"strict_signed_zeros": True}  # the sign of zero is accepted otherwise: nothing to diagnose


class WithVariant(ReferenceAdapter):
    """The reference with one variant of the catalogue: a port that has exactly that bug."""

    def __init__(self, name: str):
        self.variant = variant(name)

    def run(self, component, inputs, params):
        if self.variant.params is not None:
            return super().run(component, inputs, self.variant.params(params))
        with self.variant.apply():
            return super().run(component, inputs, params)


def cases(pattern: str, most: int = 2) -> list[str]:
    return [c for c in sorted(MANIFEST) if matches(c, parse_select(pattern))][:most]


def diagnosed(impl, pattern: str, most: int = 2, impl_conf: dict | None = None) -> list:
    return [
        r
        for r in (run_case(c, CONFIG, impl, "x", MANIFEST, impl_conf) for c in cases(pattern, most))
        if r.status in ("fail", "error")
    ]


def named(result) -> list[str]:
    return [v for m in (result.diagnosis or {}).get("matches", []) for v in (*m["variants"], *m["indistinguishable"])]


def test_every_variant_is_placed_and_documented():
    assert set(WHERE) == {v.name for v in VARIANTS}
    doc = (ROOT / "docs" / "diagnosis.md").read_text()
    for v in VARIANTS:
        assert f"`{v.name}`" in doc, v.name
    assert f"each of {len(VARIANTS)} known porting bugs" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(WHERE))
def test_a_port_with_the_bug_gets_that_diagnosis(name):
    conf = STRICT if name.startswith("e2m1-") and "zero" in name else None
    failed = diagnosed(WithVariant(name), WHERE[name], most=3, impl_conf=conf)
    assert failed, f"{name} changes none of {WHERE[name]}"
    for result in failed:
        if result.status == "error":  # a protocol error (scale bytes of another block count): still an error,
            assert result.kind == "shape error"  # its message leading with the shape, and named by the variant
            assert result.message.startswith("output '") and " shape " in result.message.splitlines()[0]
            assert name in named(result), (result.id, result.diagnosis)
        assert name in named(result), (result.id, result.diagnosis, result.message[:400])
        assert f"[{name}]" in result.message and "passes its own comparison" in result.message


INDEPENDENT = [  # wrong kernels written apart from the catalogue (tests/impls), and what they are
    (wrong_compressor.ChannelSoftmax(), "compressor/r2-tiny-*", "gate-softmax-over-channels"),
    (wrong_kernels.NormBf16BeforeWeight(), "attention/a-p21-d1x11-upstream", "rmsnorm-bf16-before-weight"),
    (wrong_kernels.WindowNewestFirst(), "attention/a-p21-d1x11-upstream", "window-newest-first"),
    (wrong_attention.SinkScaled(), "sparse_attn/*", "sink-scaled"),
    (wrong.TiesAwayE2M1(), "quant.e2m1/*", "e2m1-ties-away"),
    (wrong_fp8.Block128(), "linear.fp8/*-4x256x64", "fp8-blocks-128"),
    (wrong_fp8.Unquantised(), "linear.fp8/*-4x256x64", "fp8-linear-without-act-quant"),
    (wrong_indexer.ScoresWithoutRelu(), "indexer.scores/*", "index-scores-without-relu"),
    (wrong_indexer.LowestIndexTies(), "indexer.select/ties-*", "topk-lowest-index-ties"),
    # fp32 scores with the scale applied to them pass the indexer (more precision); the weights output
    # without the scale is another meaning
    (wrong_indexer.SoftmaxScaleOnScores(), "indexer.weights/*", "index-scores-scale-on-scores"),
    (wrong_indexer.ArgpartitionTies(), "indexer/r1-chunk-*", "topk-lowest-index-ties"),
    (wrong_indexer.OtherLeakPolicy(), "indexer/leak-*", "candidate-leak-other-policy"),
    (SwappedRamp(), "rope.yarn_table/*", "yarn-betas-swapped"),
    (
        wrong_fp8.BareAttentionSkipsActQuant(),
        "attention/a-fp8-p5-d7-d9-d1x2-gen-upstream",
        "fp8-linear-without-act-quant",
    ),
]


@pytest.mark.parametrize("impl, pattern, name", INDEPENDENT, ids=[n for _, _, n in INDEPENDENT])
def test_independently_written_wrong_kernels_get_their_diagnosis(impl, pattern, name):
    failed = diagnosed(impl, pattern)
    assert failed
    for result in failed:
        assert named(result)[:1] == [name] or name in named(result), (result.id, result.diagnosis)
        first = [line for line in result.message.splitlines() if line.startswith("diagnosis")]
        assert first and "matches:" in first[0]


def test_a_bug_outside_the_catalogue_is_named_as_none():
    for impl, pattern in (
        (wrong_compressor.RingOneSlotSmall(), "compressor/r2-hd512-*"),
        # as precise as the reference by the rows' exact value, less than rmsnorm-bf16-before-weight is: that
        # variant was named here while a variant's output was judged with the reference's exact value
        (wrong_compressor.PooledTowardZero(), "compressor/r2-a-p21-d1x11"),
        (wrong_indexer.Bf16HeadSum(), "indexer.scores/*"),
        (wrong_indexer.UnpinnedCandidates(), "candidates.select/*"),
    ):
        failed = diagnosed(impl, pattern)
        assert failed
        for result in failed:
            assert result.diagnosis["matches"] == [] and result.diagnosis["tried"] > 0
            assert "known porting bug(s) that can change this component explains these outputs" in result.message


def test_correct_gates_get_no_diagnosis():
    for case_id in cases("indexer*", 40) + cases("compressor/r2-tiny-*", 4) + cases("quant.*", 20):
        result = run_case(case_id, CONFIG, UpstreamTorch(), "upstream", MANIFEST)
        assert result.status in ("pass", "unsupported") and result.diagnosis is None, (case_id, result.status)


def test_the_budget_bounds_the_diagnosis_and_zero_turns_it_off():
    impl = wrong_compressor.ChannelSoftmax()
    case_id = cases("compressor/r2-tiny-*", 1)[0]
    for budget in (1, 3):  # re-runs of the whole case; screening a schedule's first steps costs their share
        tight = run_case(case_id, replace(CONFIG, diagnosis_budget=budget), impl, "x", MANIFEST)
        assert (
            tight.diagnosis["spent"] <= budget and f"budget of {budget} re-run(s) spent" in tight.diagnosis["stopped"]
        )
        assert f"diagnosis stopped: budget of {budget} re-run(s)" in tight.message
    assert tight.diagnosis["tried"] >= 2
    off = run_case(case_id, replace(CONFIG, diagnosis_budget=0), impl, "x", MANIFEST)
    assert off.status == "fail" and off.diagnosis is None and "diagnosis" not in off.message


def test_the_diagnosis_is_in_every_report(tmp_path):
    from conftest import results, run_cli

    out = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong_indexer.py:ScoresWithoutRelu",
        "--select",
        "indexer.scores/*",
        "--report-dir",
        str(out),
        "--diagnosis-budget",
        "30",
    )
    assert proc.returncode == 1
    doc = results(out)
    failing = [c for c in doc["cases"] if c["status"] == "fail"]
    assert failing and all(c["diagnosis"]["matches"][0]["variants"] == ["index-scores-without-relu"] for c in failing)
    said = "matches: index scores without the ReLU"
    assert said in proc.stdout
    for report in ("summary.md", "report.html", "junit.xml"):
        assert said in (out / report).read_text(), report


def test_no_variant_leaks_out_of_its_block():
    """Each variant restores what it replaced: the reference passes its own goldens afterwards."""
    for v in VARIANTS:
        with v.apply() if v.params is None else contextlib.nullcontext():
            pass
    for case_id in cases("quant.*", 20) + cases("norm.rms/*", 4) + cases("rope.apply/*", 5):
        assert run_case(case_id, CONFIG, ReferenceAdapter(), "reference", MANIFEST).status == "pass", case_id


def test_the_first_divergent_stage_is_screened_first_and_the_names_stay(monkeypatch):
    """Along a chain every applicable variant is first judged on the first divergent stage alone (nothing
    re-run); those under which it passes, and the tie orders, are re-run whole first. The same names as
    re-running every variant whole (the screen answering nothing), for 4 re-runs instead of 52."""
    import v41_conformance.runner as runner

    case = "attention/a-p21-d1x11-upstream"
    impl = wrong_kernels.ScoresWithoutRelu()
    (screened,) = diagnosed(impl, case)
    d = screened.diagnosis
    assert named(screened) == ["index-scores-without-relu"] and d["screened"] == d["applicable"] > 30
    assert d["tried"] <= 4 and not d["stopped"]
    monkeypatch.setattr(runner, "stage_judged", lambda *args, **kwargs: None)
    (whole,) = diagnosed(impl, case)
    assert named(whole) == named(screened) and whole.diagnosis["matches"] == d["matches"]
    assert whole.diagnosis["tried"] > 10 * d["tried"]


def test_the_stage_screen_rederives_the_compressors_latent_under_the_variant():
    """With the fp8 checkpoint an RMSNorm rounding before its weight first shows at the compressor's `latent`
    (one rounding more than the reference, failing by its share of differing elements and its precision).
    The screen replays the compressor under each variant there: the norm variant passes; another norm
    variant fails; a variant that leaves the stage as the reference computes it is judged as the reference
    is (with the exact value), and fails."""
    from v41_conformance import regenerated
    from v41_conformance.diagnosis.variants import together
    from v41_conformance.golden import load_verified
    from v41_conformance.known import get
    from v41_conformance.runner import CaseResult, _execute, _judge, stage_expected, stage_judged

    case = "attention/a-fp8-p21-d1x11-upstream"
    golden = load_verified(CONFIG.goldens, case, MANIFEST, CONFIG.generate_command)
    component = get("attention")
    regenerated.restore(golden, component)
    params = component.with_defaults(golden.meta["params"])
    result = CaseResult(case, "attention", "error")
    actual = _execute(component, wrong_kernels.NormBf16BeforeWeight(), golden, params, result)
    _judge(component, golden, dict(actual), params, CONFIG, {}, result)
    stage = result.first_divergent_stage
    assert stage == "s00.l1.latent"
    unchanged = stage_expected(component, golden, actual, params, CONFIG, {}, stage)

    def screened(name: str):
        with together((variant(name),)) as flipped:
            return stage_judged(component, golden, actual, flipped(params), CONFIG, {}, stage, unchanged)

    assert screened("rmsnorm-bf16-before-weight").ok == {stage: True}
    for name in ("rmsnorm-bf16-throughout", "window-newest-first"):
        assert screened(name).ok == {stage: False}, name
    assert screened("window-newest-first").changed == frozenset()  # it leaves the stage as it is


def test_an_fp8_norm_bug_at_the_latent_is_named_for_three_re_runs():
    """The whole diagnosis of that case: the screen leads with the norm variant, so 3 re-runs name it (54,
    the whole catalogue, when the screen judged every variant against the golden's latent rows)."""
    (result,) = diagnosed(wrong_kernels.NormBf16BeforeWeight(), "attention/a-fp8-p21-d1x11-upstream")
    assert result.first_divergent_stage == "s00.l1.latent"
    assert named(result) == ["rmsnorm-bf16-before-weight"] and result.diagnosis["tried"] <= 3
