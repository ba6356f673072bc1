"""Diagnosis variants traced to public GPU libraries' quantisers (docs/diagnosis.md, "Traced to GPU
libraries' own code"): each computes differently from upstream exactly where the library does, equals
the library's rule on every bf16 input it is checked on, is named for a port with that one library
behaviour (tests/impls/library_ports.py), and is named for no port with another bug and no correct gate.
"""

from __future__ import annotations

import pytest
import torch

import library_ports as lp
from impls import wrong
from impls.gate_float64 import Float64
from impls.gate_upstream import UpstreamTorch
from test_diagnosis import CONFIG, MANIFEST, STRICT, WHERE, WithVariant, cases, diagnosed, named
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.diagnosis.variants import together, variant
from v41_conformance.reference import numerics as nx
from v41_conformance.runner import run_case

# Where each library variant shows, in cheap cases (as test_diagnosis.WHERE places the others).
LIBRARY_WHERE = {
    "e2m1-ties-toward-zero": "quant.e2m1/*",
    "e2m1-dequant-minus-zero-as-plus-zero": "quant.e2m1/*",
    "fp4-amax-floor-1e-4": "quant.fp4_e8m0/zero-blocks-*",
    "fp4-amax-floor-1e-12": "quant.fp4_e8m0/zero-blocks-*",
    "fp8-scale-floor-1e-4": "quant.fp8_ue8m0/zero-blocks-*",
}
LIBRARY = frozenset(LIBRARY_WHERE)


def all_bf16() -> torch.Tensor:
    """Every finite bf16 value, as fp32."""
    v = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    return v[torch.isfinite(v)]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def one_block_per_amax(block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x bf16 [N, block], amax fp32 [N]): a row per positive finite bf16 value, that value first and the
    rest zeros, and an all-zero row."""
    v = all_bf16()
    amax = torch.cat([torch.zeros(1), v[v > 0]])
    x = torch.zeros(amax.numel(), block)
    x[:, 0] = amax
    return x.to(torch.bfloat16), amax


def same(a: nx.QuantResult, b: nx.QuantResult) -> bool:
    return all(torch.equal(bits(getattr(a, f)), bits(getattr(b, f))) for f in ("y", "codes", "scale_bytes"))


def _under(name: str, function: str, *args):
    """numerics.`function`(*args) with the variant `name` in force."""
    with variant(name).apply():
        return getattr(nx, function)(*args)


# --- what each variant computes ----------------------------------------------------------------


def test_ties_toward_zero_moves_only_the_three_midpoints_upstream_rounds_up():
    v = all_bf16()
    v = v[v.abs() <= 8]
    up = nx.e2m1_round(v)
    with variant("e2m1-ties-toward-zero").apply():
        down = nx.e2m1_round(v)
    moved = bits(down) != bits(up)
    assert sorted(set(v[moved].abs().tolist())) == [0.75, 1.75, 3.5]
    lower, upper = {0.75: 0.5, 1.75: 1.5, 3.5: 3.0}, {0.75: 1.0, 1.75: 2.0, 3.5: 4.0}
    for x, a, b in zip(v[moved].tolist(), down[moved].tolist(), up[moved].tolist()):
        assert (a, b) == (lower[abs(x)] * (1 if x > 0 else -1), upper[abs(x)] * (1 if x > 0 else -1))
    others = torch.tensor([0.25, 1.25, 2.5, 5.0])  # the midpoints whose even code is the lower one
    assert nx.e2m1_round(others).tolist() == _under("e2m1-ties-toward-zero", "e2m1_round", others).tolist()
    assert nx.e2m1_round(others).tolist() == [0.0, 1.0, 2.0, 4.0]


def test_deepgemm_e2m1_codes_are_ties_toward_zero_with_the_minus_zero_lost_on_every_bf16_value():
    """`_quantize_to_fp4_e2m1`'s codes (tests/impls/library_ports.py transcribes its rule) are the two
    variants together, and neither alone, on every bf16 value in [-8, 8] (saturation included)."""
    v = all_bf16()
    v = v[v.abs() <= 8]
    deepgemm = lp.e2m1_codes_deepgemm(v)
    with together([variant("e2m1-ties-toward-zero"), variant("e2m1-minus-zero-lost")]):
        both = nx.e2m1_encode(nx.e2m1_round(v))
    assert torch.equal(both, deepgemm)
    for alone in ("e2m1-ties-toward-zero", "e2m1-minus-zero-lost"):
        with variant(alone).apply():
            assert not torch.equal(nx.e2m1_encode(nx.e2m1_round(v)), deepgemm), alone
    assert torch.equal(lp.e2m1_round_lower_midpoints(v), _under("e2m1-ties-toward-zero", "e2m1_round", v))


def test_the_dequantisation_table_differs_only_at_code_8_and_leaves_the_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    up, plus = nx.e2m1_decode(codes), _under("e2m1-dequant-minus-zero-as-plus-zero", "e2m1_decode", codes)
    assert torch.equal(plus, lp.e2m1_decode_deepgemm(codes))  # DeepGEMM's `_dequantize_from_fp4_e2m1`
    assert (bits(plus) != bits(up)).nonzero().flatten().tolist() == [8]
    assert torch.signbit(up[8]) and not torch.signbit(plus[8])

    x = torch.zeros(1, 32)
    x[0, :6] = torch.tensor([6.0, -0.1, 0.1, -0.0, -1.0, 0.3])  # -0.1 / 1 rounds to -0: code 8
    x = x.to(torch.bfloat16)
    q, p = nx.fp4_qdq_e8m0(x), _under("e2m1-dequant-minus-zero-as-plus-zero", "fp4_qdq_e8m0", x)
    assert torch.equal(p.codes, q.codes) and torch.equal(p.scale_bytes, q.scale_bytes)
    assert q.codes[0, 1] == 8 and q.codes[0, 3] == 8
    differ = (bits(p.y) != bits(q.y)).nonzero()[:, 1].tolist()
    assert differ == [1, 3] and (p.y[0, differ] == 0).all() and not torch.signbit(p.y[0, differ].float()).any()


@pytest.mark.parametrize(
    "name, floor, divide",
    [("fp4-amax-floor-1e-4", 1e-4, True), ("fp4-amax-floor-1e-12", 1e-12, False)],
    ids=["deepgemm", "tensorrt-llm"],
)
def test_an_fp4_amax_floor_is_the_librarys_scale_rule_on_every_bf16_amax(name, floor, divide):
    """DeepGEMM (amax / 6.0, floor 1e-4) and TensorRT-LLM (amax * fp32(1/6), floor 1e-12) give the
    variant's scales, codes and values on a block of every bf16 amax; upstream's differ exactly on
    blocks whose amax is below the floor (the all-zero block among them: only its scale byte)."""
    x, amax = one_block_per_amax(32)
    library = lp.fp4_pow2(x, floor, divide)
    floored = _under(name, "fp4_qdq_e8m0", x)
    assert same(floored, library)
    upstream = nx.fp4_qdq_e8m0(x)
    moved = (floored.scale_bytes != upstream.scale_bytes).flatten()
    assert moved[0] and bool((amax[moved] < floor).all())
    assert same(
        nx.QuantResult(*(t[amax >= floor] for t in floored)), nx.QuantResult(*(t[amax >= floor] for t in upstream))
    )
    scale_of_zero = {"fp4-amax-floor-1e-4": 127 - 15, "fp4-amax-floor-1e-12": 127 - 42}[name]
    assert (int(upstream.scale_bytes[0, 0]), int(floored.scale_bytes[0, 0])) == (1, scale_of_zero)
    assert torch.equal(floored.codes[0], upstream.codes[0]) and torch.equal(bits(floored.y[0]), bits(upstream.y[0]))


def test_the_fp8_scale_floor_is_flashmlas_rule_on_every_bf16_amax():
    """FlashMLA's `_cast_scale_inv_to_ue8m0` (amax / 448 floored at 1e-4, torch's log2 and ceil) gives
    the variant's fp8 on a block of every bf16 amax; upstream's differs exactly where amax <= 448 * 2^-14."""
    x, amax = one_block_per_amax(32)
    floored = _under("fp8-scale-floor-1e-4", "fp8_qdq_ue8m0", x)
    assert same(floored, lp.fp8_scale_floored(x))
    upstream = nx.fp8_qdq_ue8m0(x)
    moved = (floored.scale_bytes != upstream.scale_bytes).flatten()
    assert torch.equal(moved, amax <= 448.0 * 2.0**-14)
    assert bool((floored.scale_bytes.flatten()[moved] == 127 - 13).all())
    kept = ~moved
    assert same(nx.QuantResult(*(t[kept] for t in floored)), nx.QuantResult(*(t[kept] for t in upstream)))


# --- what the diagnosis names --------------------------------------------------------------------


def full(result) -> list[tuple[str, ...]]:
    return [tuple(m["variants"]) for m in result.diagnosis["matches"] if len(m["outputs"]) == m["failing"]]


def failing(impl, pattern: str, conf: dict | None = None) -> list:
    results = [run_case(c, CONFIG, impl, "port", MANIFEST, conf) for c in cases(pattern, 99)]
    assert not [r.id for r in results if r.status == "error"], [r.message[:300] for r in results]
    return [r for r in results if r.status == "fail"]


PORTS = [
    (lp.DeepGemmTiesTowardZero(), "quant.*", "e2m1-ties-toward-zero", None),
    (lp.DeepGemmTiesTowardZero(), "quant.*", "e2m1-ties-toward-zero", STRICT),
    (lp.DeepGemmDequantTable(), "quant.*", "e2m1-dequant-minus-zero-as-plus-zero", STRICT),
    (lp.DeepGemmAmaxFloor(), "quant.fp4_e8m0/*", "fp4-amax-floor-1e-4", None),
    (lp.TrtllmAmaxFloor(), "quant.fp4_e8m0/*", "fp4-amax-floor-1e-12", None),
    (lp.FlashMlaScaleFloor(), "quant.fp8_ue8m0/*", "fp8-scale-floor-1e-4", None),
]


@pytest.mark.parametrize(
    "impl, pattern, name, conf", PORTS, ids=[f"{type(i).__name__}{'-strict' if c else ''}" for i, _, _, c in PORTS]
)
def test_a_port_with_one_library_behaviour_is_named_by_that_variant_alone(impl, pattern, name, conf):
    results = failing(impl, pattern, conf)
    assert results, f"{type(impl).__name__} fails none of {pattern}"
    for r in results:
        assert full(r) == [(name,)] and set(named(r)) == {name}, (r.id, r.diagnosis)
        assert f"[{name}]" in r.message and "passes its own comparison" in r.message


def test_the_dequantisation_table_passes_where_signed_zeros_are_accepted():
    """Its values differ from upstream's only in the sign of a zero: accepted by default, nothing to name."""
    for r in [run_case(c, CONFIG, lp.DeepGemmDequantTable(), "port", MANIFEST) for c in cases("quant.*", 99)]:
        assert r.status == "pass" and r.diagnosis is None, (r.id, r.status)


def test_deepgemms_whole_e2m1_is_named_as_ties_toward_zero_and_under_strict_zeros_with_the_lost_minus_zero():
    default = failing(lp.DeepGemmE2M1(), "quant.e2m1/*")
    assert default and all(set(named(r)) == {"e2m1-ties-toward-zero"} for r in default), [r.diagnosis for r in default]
    strict = {r.id: r for r in failing(lp.DeepGemmE2M1(), "quant.e2m1/*", STRICT)}
    pair = ("e2m1-minus-zero-lost", "e2m1-ties-toward-zero")
    assert full(strict["quant.e2m1/midpoints"]) == [pair], strict["quant.e2m1/midpoints"].diagnosis
    assert "two known bugs at once" in strict["quant.e2m1/midpoints"].message
    for r in strict.values():  # a case without a midpoint 0.75, 1.75 or 3.5 shows the lost -0 alone
        assert full(r) in ([pair], [("e2m1-minus-zero-lost",)]), (r.id, r.diagnosis)


@pytest.mark.parametrize("name", sorted(LIBRARY_WHERE))
def test_the_reference_with_the_variant_gets_that_diagnosis(name):
    """As test_diagnosis.py's `test_a_port_with_the_bug_gets_that_diagnosis`, for the library variants."""
    conf = STRICT if name.startswith("e2m1-") and "zero" in name else None
    failed = diagnosed(WithVariant(name), LIBRARY_WHERE[name], most=3, impl_conf=conf)
    assert failed, f"{name} changes none of {LIBRARY_WHERE[name]}"
    for result in failed:
        assert name in named(result), (result.id, result.diagnosis, result.message[:400])


OTHER_BUGS = sorted(n for n, p in WHERE.items() if n not in LIBRARY and p.startswith(("quant.", "linear.fp8")))


@pytest.mark.parametrize("name", OTHER_BUGS)
def test_a_port_with_another_quantiser_bug_is_not_named_as_a_library_variant(name):
    conf = STRICT if name.startswith("e2m1-") and "zero" in name else None
    failed = diagnosed(WithVariant(name), WHERE[name], most=3, impl_conf=conf)
    for r in failed:
        assert not set(named(r)) & LIBRARY, (r.id, r.diagnosis)
        assert r.status == "error" or name in named(r), (r.id, r.diagnosis)


def test_ties_away_from_zero_is_still_named_as_ties_away():
    failed = diagnosed(wrong.TiesAwayE2M1(), "quant.*", most=99)
    assert failed
    for r in failed:
        assert set(named(r)) == {"e2m1-ties-away"}, (r.id, r.diagnosis)


@pytest.mark.parametrize("impl", [ReferenceAdapter(), UpstreamTorch(), Float64()], ids=lambda i: type(i).__name__)
@pytest.mark.parametrize("conf", [None, STRICT], ids=["default", "strict"])
def test_correct_implementations_get_no_diagnosis(impl, conf):
    for case_id in cases("quant.*", 99):
        result = run_case(case_id, CONFIG, impl, "correct", MANIFEST, conf)
        assert result.status in ("pass", "unsupported") and result.diagnosis is None, (case_id, result.status)


# --- protocol errors a variant reproduces ----------------------------------------------------------


def test_an_output_of_another_shape_that_a_variant_produces_is_named_and_stays_an_error():
    results = [
        run_case(c, CONFIG, lp.SglangCompressedKvBlocks32(), "x", MANIFEST) for c in cases("quant.fp4_e4m3/*", 6)
    ]
    reshaped = [r for r in results if r.status == "error"]
    assert reshaped, [(r.id, r.status) for r in results]
    for r in reshaped:
        assert r.kind == "shape error" and "scale_bytes" in r.message.splitlines()[0], (r.id, r.message[:300])
        assert "fp4-e4m3-as-pow2-blocks-32" in named(r), (r.id, r.diagnosis)
        assert "diagnosis" in r.message and "matches:" in r.message


def test_a_shape_no_variant_produces_is_the_protocol_error_it_is_with_no_name():
    for case_id in cases("quant.fp4_e4m3/*", 2):
        r = run_case(case_id, CONFIG, lp.ScalesPerRow(), "x", MANIFEST)
        assert r.status == "error" and r.kind == "shape error", (r.id, r.status)
        assert r.diagnosis is None and "diagnosis" not in r.message, r.message[:600]
