"""Verdicts a correct implementation can trust (docs/verdicts.md): transcendental tables, rounding
boundaries, near ties, dtype-following policies, -0 == +0 in ties, late-bound quantisers.

Each verdict kind is shown both ways: the differences a correct implementation produces are
accepted (and counted), and a real bug next to the same boundary is still a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from v41_conformance.boundary import FORMATS, classify_quantised, pre_tolerance
from v41_conformance.compare import compare_output
from v41_conformance.config import load_config
from v41_conformance.golden import read_manifest
from v41_conformance.index_verdict import classify_index_rows
from v41_conformance.policy import Policy
from v41_conformance.reference import numerics as nx
from v41_conformance.known import get
from v41_conformance.runner import run_case
from impls import rope_tables
from impls.patching import patched

CONFIG = load_config(ROOT / "conformance.yaml")
MANIFEST = read_manifest(CONFIG.goldens)
TABLE_CASES = sorted(c for c in MANIFEST if c.startswith("rope.yarn_table/"))


def run(impl, case_id: str, impl_conf: dict | None = None):
    return run_case(case_id, CONFIG, impl, type(impl).__name__, MANIFEST, impl_conf)


# --- transcendental outputs: the RoPE table ---------------------------------------------------


@pytest.mark.parametrize("impl", rope_tables.CORRECT, ids=lambda c: c.__name__)
def test_every_way_of_building_the_rope_table_passes(impl):
    for case_id in TABLE_CASES:
        result = run(impl(), case_id)
        assert result.status == "pass", (case_id, result.message)


def test_the_table_tolerance_did_real_work():
    """torch's own fp32 cos/sin is not correctly rounded: the golden is, so they differ somewhere."""
    worst = max(run(rope_tables.TorchCosSin(), c).outputs["table"]["max_ulps"] for c in TABLE_CASES)
    assert worst >= 1


@pytest.mark.parametrize("impl", rope_tables.WRONG, ids=lambda c: c.__name__)
def test_wrong_tables_still_fail_on_the_output_that_is_wrong(impl):
    results = {c: run(impl(), c) for c in TABLE_CASES}
    yarn = [c for c in TABLE_CASES if "window" not in c]  # the window table has no YaRN ramp
    for case_id in yarn:
        assert results[case_id].status == "fail", (case_id, impl.__name__)
        assert "output 'table': not close" in results[case_id].message
    if impl in (rope_tables.SwappedRamp, rope_tables.OtherBase):
        assert all("output 'inv_freq': not close" in results[c].message for c in yarn)


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_torch_tables_pass_with_every_aten_cpu_capability(capability):
    """ATen picks scalar, AVX2 or AVX-512 kernels at start-up; each must pass (where the CPU has it)."""
    code = (
        "import sys, torch; sys.path[:0] = ['tests', 'tests/impls'];"
        "print(torch.backends.cpu.get_cpu_capability());"
        "from test_verdicts import run, TABLE_CASES; from impls import rope_tables as t;"
        "bad = [(c, i.__name__) for i in (t.TorchPolar, t.TorchCosSin) for c in TABLE_CASES"
        " if run(i(), c).status != 'pass']; print(bad); sys.exit(1 if bad else 0)"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    used = proc.stdout.split("\n", 1)[0].strip().lower()
    if used != capability:
        pytest.skip(f"this CPU runs ATen's {used} kernels, not {capability}")
    if proc.returncode == -signal.SIGILL:  # ATen accepted the request, the CPU lacks the instructions
        pytest.skip(f"this CPU cannot execute ATen's {capability} kernels (SIGILL)")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- rounding boundaries of quantised outputs -------------------------------------------------

FP8 = FORMATS["fp8_ue8m0"]
FP4_E4M3 = FORMATS["fp4_e4m3"]


def _block(values: list[float], size: int, fill: float = 0.25) -> torch.Tensor:
    """One bf16 block [1, size]: `values` first, then `fill` (below every amax used here)."""
    return torch.tensor([values + [fill] * (size - len(values))], dtype=torch.float32).to(torch.bfloat16)


def _bump(x: torch.Tensor, index: int, ulps: int) -> torch.Tensor:
    """x with element `index` moved by `ulps` bf16 ulps (what another rounding of x may give)."""
    y = x.clone()
    y[0, index] = (x[0, index].float() + ulps * 2.0 ** (torch.frexp(x[0, index].float()).exponent - 8)).bfloat16()
    return y


def _fp8_outputs(x: torch.Tensor) -> dict[str, torch.Tensor]:
    q = nx.fp8_qdq_ue8m0(x)
    return {"values": q.y, "codes": q.codes, "scale_bytes": q.scale_bytes}


def _verdict(fmt, x, actual_of, expected_of, encoding, ulps=2.0):
    return classify_quantised(expected_of[encoding], actual_of[encoding], x, pre_tolerance(x, ulps), fmt, encoding)


def test_an_element_next_to_an_e4m3_midpoint_may_round_either_way():
    # amax 3 -> scale 2^-7; element 1 sits exactly on the e4m3 midpoint 1.0625 * 2^-7 (ties to 1.0)
    x = _block([3.0, 1.0625 * 2**-7], 32)
    ref, other = _fp8_outputs(x), _fp8_outputs(_bump(x, 1, +1))  # the value one bf16 ulp higher
    for encoding in ("values", "codes"):
        v = _verdict(FP8, x, other, ref, encoding)
        assert (v.differ, v.flips, v.mismatched) == (1, 1, 0), (encoding, v.describe())
        assert "element [0, 1]" in v.first_flip and "from the boundary" in v.first_flip
    strict = _verdict(FP8, x, other, ref, "values", ulps=0.0)  # no tolerance: a mismatch
    assert strict.mismatched == 1


def test_two_steps_or_a_value_far_from_the_boundary_is_a_mismatch():
    x = _block([3.0, 1.0625 * 2**-7, 1.5 * 2**-7], 32)
    ref = _fp8_outputs(x)
    two_steps = dict(ref, values=ref["values"].clone())
    two_steps["values"][0, 1] = 1.25 * 2**-7  # 2 e4m3 steps from 1.0
    far = dict(ref, values=ref["values"].clone())
    far["values"][0, 2] = 1.625 * 2**-7  # element 2 is an exact grid value, nowhere near a boundary
    for wrong in (two_steps, far):
        v = _verdict(FP8, x, wrong, ref, "values")
        assert v.mismatched == 1 and v.flips == 0 and "first mismatch: element" in v.describe()


def test_a_scale_at_an_e4m3_boundary_flips_and_its_block_follows():
    # amax / 6 = 0.53125, the e4m3 midpoint between 0.5 and 0.5625: one bf16 ulp more takes 0.5625
    x = _block([3.1875, -2.0, 1.3, 0.7], 16)
    ref, other = nx.fp4_qdq_e4m3(x), nx.fp4_qdq_e4m3(_bump(x, 0, +1))
    assert int(ref.scale_bytes) + 1 == int(other.scale_bytes)
    enc = lambda q: {"values": q.y, "packed": nx.pack_nibbles(q.codes), "scale_bytes": q.scale_bytes}  # noqa: E731
    for encoding in ("values", "packed", "scale_bytes"):
        v = _verdict(FP4_E4M3, x, enc(other), enc(ref), encoding)
        assert v.mismatched == 0 and v.flips == v.differ > 0, (encoding, v.describe())
    assert _verdict(FP4_E4M3, x, enc(other), enc(ref), "values").scale_flips == 1


def test_a_scale_rounded_down_is_not_a_boundary_flip():
    """The power-of-two scale floored instead of ceiled: one step off, but only blocks whose amax
    is near a power of two could have rounded that way, so nearly every block is a mismatch."""
    x = (torch.randn(16, 64, generator=torch.Generator().manual_seed(1)) * 2).to(torch.bfloat16)
    ref = _fp8_outputs(x)
    ceil = nx.pow2_ceil
    with patched(nx, "pow2_ceil", lambda y: ceil(y) * 0.5):
        floored = _fp8_outputs(x)
    for encoding in ("values", "codes", "scale_bytes"):
        v = classify_quantised(ref[encoding], floored[encoding], x, pre_tolerance(x, 2.0), FP8, encoding)
        assert v.mismatched > 0.9 * v.differ and v.differ > 0, (encoding, v.describe())


def test_the_rope_tail_is_judged_by_its_pairs_norm():
    x = torch.tensor([[1.0, 0.001, 0.5, 0.001]], dtype=torch.bfloat16)
    plain, tail = pre_tolerance(x, 1.0), pre_tolerance(x, 1.0, tail=2)
    assert torch.equal(plain[0, :2], tail[0, :2])
    assert float(tail[0, 3]) == float(tail[0, 2]) == 2.0**-8  # bf16 ulp of |(0.5, 0.001)| ~ 0.5


def test_boundary_flips_are_counted_accepted_and_can_be_made_strict():
    x = _block([3.0, 1.0625 * 2**-7], 32)
    ref, other = _fp8_outputs(x), _fp8_outputs(_bump(x, 1, +1))
    policy = Policy("quantised", quant="fp8_ue8m0", pre="pre", boundary_ulps=2)
    verdict = compare_output("y", ref["values"], other["values"], policy, {"pre": x})
    assert verdict.ok and verdict.metrics["boundary_flips"] == 1
    assert "only at rounding boundaries (accepted by policy)" in verdict.message
    strict = compare_output(
        "y", ref["values"], other["values"], Policy(**{**policy.__dict__, "accept_boundary": False}), {"pre": x}
    )
    assert not strict.ok and strict.metrics["boundary_flips"] == 1


def test_strict_boundaries_comes_from_the_implementation_entry():
    component = get("kv.finish")
    relaxed = CONFIG.policy(component, "main")
    strict = CONFIG.policy(component, "main", {"strict_boundaries": True})
    assert relaxed.accept_boundary and not strict.accept_boundary and strict.boundary_ulps == relaxed.boundary_ulps


# --- near ties of index outputs ---------------------------------------------------------------

SCORES = torch.tensor([[3.0, 2.0, 2.0 - 2.0**-7, 1.0]])  # id 2 is one bf16 ulp below the k-th score


def test_a_pick_within_one_ulp_of_the_kth_score_is_a_near_tie():
    expected, near, far = torch.tensor([[0, 1]]), torch.tensor([[0, 2]]), torch.tensor([[0, 3]])
    v = classify_index_rows(expected, near, SCORES, order="set", near_ulps=1)
    assert (v.tie, v.near, v.miss) == (0, 1, 0)
    assert "near-tie rows" in v.describe() and "lie within 0.0156 of it" in v.describe()
    assert classify_index_rows(expected, far, SCORES, order="set", near_ulps=1).miss == 1
    assert classify_index_rows(expected, near, SCORES, order="set").miss == 1  # no band: a miss


def test_near_ties_fail_by_default_and_pass_with_accept_near_ties():
    policy = Policy("index", scores="s", order="set", near_tie_ulps=1)
    expected, near = torch.tensor([[0, 1]]), torch.tensor([[0, 2]])
    default = compare_output("ids", expected, near, policy, {"s": SCORES})
    assert not default.ok and default.metrics["rows_near_tie"] == 1 and "1 near tie, 0 miss" in default.message
    accepted = compare_output(
        "ids", expected, near, Policy(**{**policy.__dict__, "accept_near_ties": True}), {"s": SCORES}
    )
    assert accepted.ok and "near ties accepted by policy" in accepted.message


def test_a_near_score_past_the_visible_prefix_is_a_miss():
    """A selection that reads one row past the query's prefix picks an id whose stored score is
    close to the k-th: the id limit makes it a miss, never a near tie."""
    scores = torch.tensor([[3.0, 2.0, 1.0, 2.0 - 2.0**-7]])
    v = classify_index_rows(
        torch.tensor([[0, 1]]), torch.tensor([[0, 3]]), scores, order="set", near_ulps=1, id_limit=torch.tensor([3])
    )
    assert v.miss == 1 and v.near == 0 and v.violations["out_of_range"] == 1


# --- the policy follows the output's dtype ----------------------------------------------------


class Bf16RoundedNorm:
    """norm.rms computed right, then rounded through bf16 before the fp32 output."""

    def supports(self, component):
        return component == "norm.rms"

    def run(self, component, inputs, params):
        y = nx.rms_norm(inputs["x"], inputs["weight"])
        return {"y": y.to(torch.bfloat16).to(y.dtype)}


def test_an_fp32_output_is_judged_in_fp32_ulps():
    result = run(Bf16RoundedNorm(), "norm.rms/fp32-input-4x64")
    assert result.status == "fail" and "f32: |a-e|" in result.message
    assert run(Bf16RoundedNorm(), "norm.rms/latent-6x128").status == "pass"  # bf16 output: identical
    policy = CONFIG.policy(get("norm.rms"), "y", dtype=torch.float32)
    assert policy.kind == "f32" and CONFIG.policy(get("norm.rms"), "y", dtype=torch.bfloat16).kind == "bf16"


# --- -0.0 ties with +0.0 ----------------------------------------------------------------------


class NegativeZeroFirst:
    """torch.topk with -0.0 ranked below +0.0: a legitimate total order on equal values."""

    def supports(self, component):
        return component == "topk.torch_cpu"

    def run(self, component, inputs, params):
        v = inputs["values"]
        key = torch.where((v == 0) & torch.signbit(v), torch.tensor(-1e-300, dtype=torch.float64), v.double())
        _, idx = torch.topk(
            key, int(params["k"]), largest=bool(params.get("largest", True)), sorted=bool(params.get("sorted", True))
        )
        return {"values": torch.gather(v, -1, idx), "indices": idx}


def test_signed_zeros_are_tied_in_sorted_and_unsorted_top_k():
    for case_id in ("topk.torch_cpu/nth-special-n100-k30", "topk.torch_cpu/nth-special-n100-k30-smallest-unsorted"):
        ids = run(NegativeZeroFirst(), case_id).outputs["indices"]
        assert ids["rows_miss"] == 0 and ids["rows_tie"] > 0, (case_id, ids)


# --- one override point for the quantisers ----------------------------------------------------


def test_replacing_a_numerics_quantiser_reaches_the_quant_components_too():
    from v41_conformance.adapters.reference import ReferenceAdapter

    original = nx.fp4_qdq_e4m3

    def broken(x, block=16):
        q = original(x, block)
        return q._replace(y=(q.y.float() * 2).to(torch.bfloat16))

    with patched(nx, "fp4_qdq_e4m3", broken):
        quant = run(ReferenceAdapter(), "quant.fp4_e4m3/latent-rows-4x512")
        finish = run(ReferenceAdapter(), "kv.finish/r2-a-prefill-g10")
    assert quant.status == "fail" and "output 'y'" in quant.message
    assert finish.status == "fail" and "output 'main'" in finish.message


# --- boundary flips inside a computation: the indexer's fp4 query -----------------------------


def _fresh_indexer_golden(name: str, label: str):
    import dataclasses

    from v41_conformance.cases import load_cases
    from v41_conformance.generate import build_golden

    spec = next(s for s in load_cases(CONFIG.cases, [f"indexer/{name}"]))
    return build_golden(dataclasses.replace(spec, name=f"{spec.name}-{label}"), CONFIG)


def _judge(impl, golden, impl_conf=None):
    from v41_conformance.runner import CaseResult, judge_golden

    result = CaseResult(golden.meta["case_id"], "indexer", "error")
    judge_golden(get("indexer"), golden, impl, CONFIG, impl_conf or {}, result)
    return result


def test_a_query_value_on_an_fp4_boundary_is_explained_not_failed():
    """Fresh data (seed label found by benchmarks/calibrate_verdicts.py) where the float64 gate's
    query crosses an e2m1 boundary in one head: its scores move by 24 ulps in that query row. The
    flip is found, the scores and ids are judged against the reference recomputed with it."""
    from impls.gate_float64 import BareFloat64, Float64

    golden = _fresh_indexer_golden("r1-prefill-s21", "calibration-3")
    result = _judge(BareFloat64(), golden)  # no index_q returned: the flip is searched for
    assert result.status == "pass" and result.boundary_flips == 1, result.message
    assert "of the fp4 query" in result.boundary_example and "query row [0, 20]" in result.boundary_example
    assert "judged against the reference recomputed with" in result.outputs["scores"]["note"]
    strict = _judge(BareFloat64(), golden, {"strict_boundaries": True})
    assert strict.status == "fail" and "output 'scores': not close" in strict.message
    # with its own query the scores are judged given it: nothing to search for
    result = _judge(Float64(), golden)
    assert result.status == "pass" and result.boundary_flips == 0, result.message
    assert result.outputs["scores"]["given"] == ["index_q"] and result.outputs["scores"]["rederived_rows"] > 0


class FlooredQueryScale:
    """The indexer's query quantised with its power-of-two scale floored (a real bug)."""

    def supports(self, component):
        return component == "indexer"

    def run(self, component, inputs, params):
        from v41_conformance.adapters.reference import ReferenceAdapter

        ceil = nx.pow2_ceil
        with patched(nx, "pow2_ceil", lambda y: ceil(y) * 0.5):
            return ReferenceAdapter().run(component, inputs, params)


def test_a_wrong_query_scale_is_not_explained_by_boundary_flips():
    from impls.gate import bare

    golden = _fresh_indexer_golden("r1-prefill-s21", "calibration-3")
    for impl in (FlooredQueryScale(), bare(FlooredQueryScale)()):  # given its query, and searched for flips
        result = _judge(impl, golden)
        assert result.status == "fail" and result.boundary_flips == 0
        assert "output 'scores': not close" in result.message and result.first_divergent_stage == "scores"


# --- rotated channels: a cancelled pair -----------------------------------------------------------

ROTATION_CASES = sorted(c for c in MANIFEST if c.split("/")[0] in ("rope.apply", "kv.finish"))
CANCELLED_PAIR = "kv.finish/fuzz-s35-1649-m279"  # cases/kv_finish_fuzz.yaml


def test_a_rotated_pair_that_cancels_may_move_by_the_fp32_products_rounding():
    """A float64 rotation lands 2 ulps from the golden on one element of 145,920 (5.9e-7, a pair that
    cancels; 4 ulps on the fresh case before shrinking); the floor 2^-20 of max|main_rope| passes it."""
    from impls.gate_float64 import Float64

    result = run(Float64(), CANCELLED_PAIR)
    assert result.status == "pass", result.message
    assert result.outputs["main_rope"]["max_ulps"] >= 2
    floorless = {"tolerances": {"kv.finish": {"main_rope": {"atol_rel": 0}}}}
    result = run(Float64(), CANCELLED_PAIR, floorless)
    assert result.status == "fail" and "output 'main_rope'" in result.message


@pytest.mark.parametrize("impl", __import__("impls.rope_rotations", fromlist=["WRONG"]).WRONG, ids=lambda c: c.__name__)
def test_a_rotation_off_by_a_bf16_ulp_of_its_pair_still_fails(impl):
    failed = {}
    for case_id in ROTATION_CASES:
        result = run(impl(), case_id)
        if result.status != "pass":
            failed[case_id] = result.message
    rotated = {c: m for c, m in failed.items() if "output 'main_rope'" in m or "output 'y'" in m}
    assert any(c.startswith("rope.apply/") for c in rotated) and any(c.startswith("kv.finish/") for c in rotated)
    assert len(rotated) >= len(ROTATION_CASES) // 2, sorted(failed)
