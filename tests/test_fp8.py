"""linear.fp8 and the fp8 checkpoint path: the reference's arithmetic, correct kernels that round
otherwise pass, and the classic fp8 GEMM bugs fail on the output they break."""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT, results, run_cli
from v41_conformance.reference import fp8_linear as fp8
from v41_conformance.reference import numerics as nx

IMPLS = ROOT / "tests" / "impls"


def test_weights_round_trip_through_their_tiles():
    w = torch.randn(72, 96, dtype=torch.float64) * torch.logspace(-3, 2, 96, dtype=torch.float64)
    weight = fp8.quantise_weight(w)
    assert weight.codes.shape == (72, 96) and weight.scale_bytes.shape == (3, 3)
    scale = nx.e8m0_value(weight.scale_bytes).double().repeat_interleave(32, 0)[:72].repeat_interleave(32, 1)
    # half an e4m3 step of the value, or half the subnormal step 2^-9 of its tile's scale
    err = (fp8.dequantise_weight(weight).double() - w).abs()
    assert (err <= torch.maximum(w.abs() * 2**-4, scale * 2**-10)).all()
    assert (w.abs() / scale).max() <= 448 and (w.abs() / scale).amax() > 224


def test_the_gemm_is_the_block_scaled_sum_of_the_quantised_operands():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    weight = fp8.quantise_weight(torch.randn(40, 64, generator=gen, dtype=torch.float64))
    result = fp8.linear_fp8(x, weight)
    q = nx.fp8_qdq_ue8m0(x)
    exact = q.y.double() @ fp8.dequantise_weight(weight).double().T
    assert torch.equal(result.x_codes, q.codes) and torch.equal(result.x_scale_bytes, q.scale_bytes)
    assert ((result.y.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-30).all()


def _run(tmp_path, impl, select="linear.fp8"):
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", impl, "--select", select, "--report-dir", str(report), "--no-isolate")
    return proc, results(report)


def test_a_narrow_tensor_core_accumulator_passes(tmp_path):
    # the sequential 14-bit sums are slow in Python: the small cases and one production shape
    proc, doc = _run(
        tmp_path,
        f"{IMPLS}/rounding.py:NarrowAccumulatorFp8",
        "linear.fp8/ragged*,linear.fp8/saturating*,linear.fp8/zero*,linear.fp8/wq_a*",
    )
    assert proc.returncode == 0, proc.stdout
    assert max(c["outputs"]["y"]["rel_l2"] for c in doc["cases"]) > 1e-4  # it does round differently


@pytest.mark.parametrize(
    "impl, broken", [("PerRowScales", ["y"]), ("Block128", ["x_codes", "x_scale_bytes"]), ("Unquantised", ["y"])]
)
def test_classic_fp8_gemm_bugs_fail_on_the_output_they_break(tmp_path, impl, broken):
    proc, doc = _run(
        tmp_path, f"{IMPLS}/wrong_fp8.py:{impl}", "linear.fp8/ragged*,linear.fp8/saturating*,linear.fp8/wq_*"
    )
    assert proc.returncode == 1
    production = [c for c in doc["cases"] if "production" in c["id"]]
    assert production and all(c["status"] == "fail" for c in production)
    for case in production:
        failing = sorted(n for n, m in case["outputs"].items() if not m["ok"])
        assert set(broken) <= set(failing), (case["id"], failing)
        assert all(f"output '{name}'" in case["message"] for name in broken)


def test_attention_with_fp8_weights_fails_where_act_quant_is_skipped(tmp_path):
    proc, doc = _run(
        tmp_path, f"{IMPLS}/wrong_fp8.py:AttentionSkipsActQuant", "attention/a-fp8-*,attention/a-p21-d1x11-*"
    )
    assert proc.returncode == 1
    for case in doc["cases"]:
        fp8_case = "-fp8-" in case["id"]
        assert case["status"] == ("fail" if fp8_case else "pass"), case["id"]
        if fp8_case:  # each stage with an fp8 Linear inside fails: qr (wq_a), kv (wkv), q (wq_b), out (wo_b)
            assert case["first_divergent_step"] == 0 and case["first_divergent_stage"] == "s00.l0.qr"
            failing = {n for n, m in case["outputs"].items() if not m["ok"]}
            assert {"s00.l0.qr", "s00.l0.kv", "s00.l0.q", "s00.l0.out", "s00.l1.index_q"} <= failing, sorted(failing)
            assert not any(n.endswith(".z") for n in failing)  # wo_a is bf16: z is right given the o
    proc, doc = _run(tmp_path, f"{IMPLS}/wrong_fp8.py:BareAttentionSkipsActQuant", "attention/a-fp8-*")
    for case in doc["cases"]:  # without intermediates: window rows and every layer's output
        assert case["status"] == "fail" and case["first_divergent_step"] == 0
        assert "output 's00.window_rows'" in case["message"] and "output 's00.l0.out'" in case["message"]


def test_wo_b_may_quantise_z_before_or_after_its_bf16_rounding(tmp_path):
    """A fused kernel feeds wo_b's act_quant wo_a's fp32 accumulator, never rounding z (ExactZ): at the
    bf16 z's e4m3 ties it takes the other code, and judged given its z alone it fails 3 of 3 fp8 cases.
    Judged again from z's accumulator (rederived from its own o), every case passes."""
    proc, doc = _run(tmp_path, f"{IMPLS}/precise_roundings.py:ExactZ", "attention/a-fp8-*")
    assert proc.returncode == 0, proc.stdout
    outs = [m for c in doc["cases"] for n, m in c["outputs"].items() if n.endswith(".out")]
    assert any(m.get("given") == ["z", "o"] for m in outs)  # the second form stood where the first failed


@pytest.mark.parametrize("impl", ["FusedZFloatScales", "FusedZTowardZero"])
def test_a_fused_wo_b_with_a_wrong_quantisation_still_fails_at_out(tmp_path, impl):
    """Next to that allowance: the fused kernel with fp32 (not power-of-two) block scales, or truncating
    to e4m3, fails at `out`, the stage with the bug, under both forms."""
    proc, doc = _run(tmp_path, f"{IMPLS}/wrong_fp8.py:{impl}", "attention/a-fp8-*")
    assert proc.returncode == 1
    for case in doc["cases"]:
        assert case["status"] == "fail" and case["first_divergent_stage"] == "s00.l0.out", case["id"]
        failing = {n for n, m in case["outputs"].items() if not m["ok"]}
        assert failing and all(n.endswith(".out") for n in failing), sorted(failing)


def test_a_kept_projection_serves_only_what_computes_it_the_same():
    """Within `weight_cache()` a projection through an fp8 weight is kept by its input, its weight and what
    it is computed with, as bound now (`fp8_linear._computed_with`). Under every variant of the diagnosis's
    catalogue, the projection served after the reference's was kept is the one computed afresh under it:
    a variant that changes what a projection computes replaces something the key holds."""
    from v41_conformance.diagnosis.variants import VARIANTS, together
    from v41_conformance.reference import fp8_linear

    gen = torch.Generator().manual_seed(5)
    weight = fp8_linear.quantise_weight(torch.randn(64, 96, generator=gen))
    x = (torch.randn(5, 96, generator=gen) * 3).bfloat16()
    x[1, :32] = 0  # an all-zero block: the amax floors
    x[2, 40] = 1e-30  # a tiny one
    checked = 0
    with fp8_linear.weight_cache():
        reference = fp8_linear.project(x, weight)
        assert torch.equal(fp8_linear.project(x, weight), reference)  # served, the same
        for v in VARIANTS:
            with together((v,)):
                served = fp8_linear.project(x, weight)
                with fp8_linear._PROJECTIONS.get().suspend():  # noqa: SLF001
                    fresh = fp8_linear.project(x, weight)
            assert torch.equal(served.view(torch.int16), fresh.view(torch.int16)), v.name
            checked += not torch.equal(fresh.view(torch.int16), reference.view(torch.int16))
    assert checked >= 3  # the fp8 variants change it, and were served their own
