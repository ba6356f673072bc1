"""The chain on the production tier (docs/verdicts.md, "The chain"; docs/tiers.md): the fp8 checkpoint
at production dimensions, where one ulp upstream of an fp8 or fp4 decision moves whole blocks.

Marked `production`: `make test-production` builds the tier's goldens and runs these (tens of
minutes on 2 cores: each implementation runs the 1,030-token case once, and is judged with its
intermediates and without them). `make test` leaves them out.

- every correct implementation passes, given its own intermediates: upstream's arithmetic, float64,
  the six attention cores, the two GEMM orders, the four forms that drop one internal rounding (and
  the two index forms pass the production indexer cases);
- every mutant of tests/impls/wrong_kernels.py fails at the stage that holds its bug, and without its
  intermediates still fails (the block-size bug included: the window rows' boundary allowance is
  the element's own, not its block's);
- a softmax scale held in bf16 fails at the prefill's `o`, judged given its own `q`, as a scale of the
  logits.
"""

from __future__ import annotations

import pytest

from conftest import ROOT
from v41_conformance import regenerated
from v41_conformance.config import load_config
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.known import get
from v41_conformance.runner import CaseResult, _execute, _judge
from impls import attention_cores, gemm_orders, gpu_arith, precise_roundings, wrong_kernels
from impls.gate_float64 import Float64
from impls.gate_upstream import UpstreamTorch
from impls.wrong_attention import PlainSoftmax, ScaleBf16

pytestmark = pytest.mark.production
CASE = "attention/production-p1030-d1x4-upstream"
GATES = [
    UpstreamTorch,
    Float64,
    PlainSoftmax,
    attention_cores.TiledFp32P,
    attention_cores.Tiles128,
    attention_cores.OnePassBf16P,
    attention_cores.SinkColumn64,
    attention_cores.SinkFactor64,
    gemm_orders.Fp8K128,
    gemm_orders.BlasBf16,
    gemm_orders.Fp32Sequential,
    precise_roundings.ExactHeadDots,
    precise_roundings.ExactHeadProducts,
    precise_roundings.ExactPooledRow,
    precise_roundings.ExactZ,
]


@pytest.fixture(scope="module")
def production():
    config = load_config(ROOT / "conformance.yaml").for_tier("production")
    manifest = read_manifest(config.goldens)
    component = get("attention")
    golden = load_verified(config.goldens, CASE, manifest, config.generate_command)  # GoldenError: build it first
    regenerated.restore(golden, component)
    return config, component, golden


def run_once(production, impl):
    """(judged with its intermediates, judged without them) from one execution of the case."""
    config, component, golden = production
    params = golden.meta["params"]
    results = []
    for keep in (True, False):
        result = CaseResult(CASE, "attention", "error")
        if not results:
            actual = _execute(component, impl, golden, params, result)
            assert actual is not None, result.message
        shown = actual if keep else {k: v for k, v in actual.items() if component.intermediate_spec(k) is None}
        _judge(component, golden, shown, params, config, {}, result)
        results.append(result)
    return results


@pytest.mark.parametrize("gate", GATES, ids=lambda c: c.__name__)
def test_correct_implementations_pass_the_production_case(production, gate):
    given, bare = run_once(production, gate())
    assert given.status == "pass", given.message
    ids = [m for n, m in given.outputs.items() if n.endswith(".compressed_ids")]
    assert not any(m.get("rows_miss") for m in ids) and all(
        m["ok"] for n, m in given.outputs.items() if n.endswith(".candidates")
    )
    if bare.status != "pass":  # without intermediates only unattributed differences may fail, each with its hint
        for name, m in bare.outputs.items():
            assert m["ok"] or m.get("hint"), (name, m)


@pytest.mark.parametrize("mutant", list(wrong_kernels.MUTANTS), ids=lambda c: c.__name__)
def test_each_bug_fails_at_its_stage_on_the_production_case(production, mutant):
    given, bare = run_once(production, mutant())
    assert given.status == "fail", mutant.__name__
    stage = wrong_kernels.FP8_STAGES.get(mutant, wrong_kernels.MUTANTS[mutant])  # the case holds the fp8 checkpoint
    assert given.first_divergent_stage.rsplit(".", 1)[-1] == stage, given.first_divergent_stage
    assert bare.status == "fail", (mutant.__name__, "absorbed without intermediates")


def test_a_softmax_scale_held_in_bf16_fails_at_o_given_its_q_on_the_production_case(production):
    """The prefill's 65,920 (query, head) rows resolve a scale of 1 - 1.1e-4 from P's roundings, with o
    judged given the implementation's own q (docs/verdicts.md, "The logit scale"); the small tier's
    attention steps cannot."""
    given, _ = run_once(production, ScaleBf16())
    assert given.status == "fail" and given.first_divergent_stage == "s00.l0.o", given.first_divergent_stage
    assert "the error is a scale of the logits: s00.l0.o moves as if every logit were times 1 - 0.000" in given.message
    metrics = given.outputs["s00.l0.o"]
    assert metrics["given"][0] == "q" and abs(metrics["logit_scale"] + 1.1e-4) < 1e-5, metrics
    assert metrics["logit_scale_z"] < -6, metrics


# --- GPU arithmetic (docs/verdicts.md, "GPU arithmetic") ----------------------------------------------
# The gates of tests/impls/gpu_arith.py on upstream's torch ops (the production cases run upstream's
# schedules), and the bugs beside each allowance with the stage that holds each.
GPU_MUTANTS = {
    "Fp8Tc14NoPromotion": "qr|kv",
    "Fp8BlockSumsBf16": "qr|kv",
    "IndexLogitsNoFp4Q": "index_scores",
    "IndexLogitsNoFp4K": "index_k_rows",
    "IndexLogitsHeadSumBf16": "index_scores",
}
INDEXER = [
    "indexer/r1-chunk-start600-s16-production",
    "indexer/r1-consumer-start600-s8-production",
    "indexer/r2-decode-start1026-production",
]


# The aligned tensor-core model costs hours per production attention run on a CPU (it aligns every
# product of every 32-wide block to its largest exponent): it runs on the small tier, the production
# shapes of linear.fp8 included (tests/test_gpu_arithmetic.py), where the sequential model runs too.
PRODUCTION_GATES = sorted(set(gpu_arith.GATES) - {"Fp8Tc14Aligned"})


@pytest.mark.parametrize("gate", PRODUCTION_GATES)
def test_gpu_arithmetic_passes_the_production_case(production, gate):
    given, _ = run_once(production, gpu_arith.GATES[gate]())
    assert given.status == "pass", given.message


@pytest.mark.parametrize("gate", ["Fp8Tc14", "Fp32IndexLogits", "AllGpu"])
def test_gpu_arithmetic_passes_the_production_indexer_cases(gate):
    from v41_conformance.runner import run_case

    config = load_config(ROOT / "conformance.yaml").for_tier("production")
    manifest = read_manifest(config.goldens)
    for case_id in INDEXER:
        result = run_case(case_id, config, gpu_arith.GATES[gate](), gate, manifest)
        assert result.status == "pass", (case_id, result.message[:2000])


@pytest.mark.parametrize("form", ["ExactHeadDots", "ExactHeadProducts"])
def test_index_forms_with_one_rounding_fewer_pass_the_production_indexer_cases(form):
    from v41_conformance.runner import run_case

    config = load_config(ROOT / "conformance.yaml").for_tier("production")
    manifest = read_manifest(config.goldens)
    for case_id in INDEXER:
        result = run_case(case_id, config, getattr(precise_roundings, form)(), form, manifest)
        assert result.status == "pass", (case_id, result.message[:2000])


@pytest.mark.parametrize("mutant", sorted(GPU_MUTANTS))
def test_a_gpu_arithmetic_bug_fails_at_its_stage_on_the_production_case(production, mutant):
    given, _ = run_once(production, gpu_arith.MUTANTS[mutant].cls())
    assert given.status == "fail", mutant
    assert given.first_divergent_stage.rsplit(".", 1)[-1] in GPU_MUTANTS[mutant].split("|"), given.first_divergent_stage
