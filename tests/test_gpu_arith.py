"""The CPU models of GPU arithmetic (tests/impls/gpu_arith.py) are faithful: each keeps the bits, order
and error its docstring states, on constructed examples and small random ones.

Whether the gates built from them pass the harness is measured by benchmarks/gpu_arith_report.py;
here only the models, and that the gates swap nothing but what they say.
"""

from __future__ import annotations

import math

import pytest
import torch

import upstream_ops as up
from conftest import ROOT
from impls import gpu_arith as ga
from impls.gate_upstream import UpstreamTorch
from impls.rounding import _truncate
from v41_conformance.config import load_config
from v41_conformance.golden import read_manifest
from v41_conformance.reference.fp8_linear import quantise_weight
from v41_conformance.runner import run_case

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- 14-bit accumulation -----------------------------------------------------------------------------


def test_truncation_keeps_14_significant_bits_toward_zero():
    x = torch.tensor([1 + 2.0**-13 + 2.0**-14, -(1 + 2.0**-13 + 2.0**-14), 3 * 2.0**-20 + 2.0**-40, 0.0], dtype=F64)
    assert ga.truncate_significant(x, 14).tolist() == [1 + 2.0**-13, -(1 + 2.0**-13), 3 * 2.0**-20, 0.0]
    r = torch.randn(10_000, generator=gen(), dtype=F64) * 1e3
    assert torch.equal(ga.truncate_significant(r, 14), _truncate(r, 14))  # rounding.py's frexp form


def test_sequential_accumulator_keeps_14_bits_after_every_addition():
    # 1, then 31 times 2^-14: each addition's exact sum 1 + 2^-14 needs 15 bits, so it truncates back to 1
    a = torch.tensor([[1.0] + [2.0**-14] * 31], dtype=F64)
    w = torch.ones(32, 1, dtype=F64)
    assert ga.block_sum_sequential(a, w).item() == 1.0
    # the small ones first: they add up exactly to 31 * 2^-14 = 15.5 * 2^-13 before the 1 arrives, and
    # 1 + 15.5 * 2^-13 keeps 1 + 15 * 2^-13
    assert ga.block_sum_sequential(a.flip(-1), w).item() == 1 + 15 * 2.0**-13
    values = torch.randn(8, 32, generator=gen(1), dtype=F64).to(torch.float8_e4m3fn).double()
    weights = torch.randn(32, 16, generator=gen(2), dtype=F64).to(torch.float8_e4m3fn).double()
    s = ga.block_sum_sequential(values, weights)
    assert torch.equal(ga.truncate_significant(s, 14), s) and not torch.equal(s, values @ weights)


def test_aligned_sum_truncates_each_product_below_the_largest_and_differs_from_sequential():
    # products 2^-14, 2^-14, 1: aligned to 1 (last bit kept 2^-13), both small ones vanish;
    # the sequential accumulator adds them first, exactly, and keeps 1 + 2^-13
    a = torch.tensor([[2.0**-14, 2.0**-14, 1.0]], dtype=F64)
    w = torch.ones(3, 1, dtype=F64)
    assert ga.block_sum_aligned(a, w).item() == 1.0
    assert ga.block_sum_sequential(a, w).item() == 1 + 2.0**-13
    # in general: each product loses less than one unit of 2^(e_max - 13), toward zero
    values = torch.randn(16, 32, generator=gen(3), dtype=F64).to(torch.float8_e4m3fn).double()
    weights = torch.randn(32, 24, generator=gen(4), dtype=F64).to(torch.float8_e4m3fn).double()
    products = values[:, :, None] * weights[None]
    unit = 2.0 ** (torch.floor(torch.log2(products.abs().amax(1))) - 13)
    error = ga.block_sum_aligned(values, weights) - products.sum(1)
    assert bool((error.abs() < 32 * unit).all()) and bool((error != 0).any())
    assert not torch.equal(ga.block_sum_aligned(values, weights), ga.block_sum_sequential(values, weights))


def _fp8_operands(m: int, k: int, n: int, seed: int = 0) -> ga.Fp8Operands:
    weight = quantise_weight(torch.randn(n, k, generator=gen(seed)) * 0.05)
    x = torch.randn(m, k, generator=gen(seed + 1)).to(BF16)
    return ga.fp8_operands(up.act_quant(x), weight.codes, weight.scale_bytes), x, weight


def test_promotion_adds_scaled_block_sums_in_fp32_like_the_reference():
    ops, x, weight = _fp8_operands(5, 256, 96)
    assert torch.equal(ga.fp8_exact(ops).to(BF16), up.fp8_linear(x, weight.codes, weight.scale_bytes)[0])
    exact_blocks = ga.fp8_promoted(lambda a, w: a @ w)(ops)  # exact block sums through the promotion path
    assert torch.equal(exact_blocks, ga.fp8_exact(ops))
    narrow = ga.fp8_promoted(ga.block_sum_sequential)(ops)
    assert not torch.equal(narrow, exact_blocks)


def test_without_promotion_the_narrow_accumulator_loses_percent_level_precision_at_k_4096():
    """DeepSeek-V3's report: ~2% relative error at K = 4096 without promotion; promoted, far less."""
    ops, _, _ = _fp8_operands(2, 4096, 16, seed=5)
    exact = ga.fp8_exact(ops).double()
    scale = exact.abs().amax()
    unpromoted = float((ga.fp8_unpromoted(ops).double() - exact).abs().max() / scale)
    promoted = float((ga.fp8_promoted(ga.block_sum_sequential)(ops).double() - exact).abs().max() / scale)
    assert 2.0**-10 < unpromoted < 0.1 and promoted < unpromoted / 10, (unpromoted, promoted)


def test_bf16_block_accumulator_rounds_after_every_block():
    ops, _, _ = _fp8_operands(3, 512, 32, seed=7)
    out = ga.fp8_bf16_block_accumulator(ops)
    assert torch.equal(out.to(BF16).float(), out)  # bf16 values
    assert not torch.equal(out, ga.fp8_exact(ops).to(BF16).float())


# --- split-K bf16 GEMM --------------------------------------------------------------------------------


def test_split_bounds_cover_k_in_whole_k_steps():
    for k, splits in [(300, 4), (64, 4), (16, 4), (128, 8), (5120, 4)]:
        bounds = ga.split_bounds(k, splits, 16)
        assert bounds[0][0] == 0 and bounds[-1][1] == k and len(bounds) <= splits
        assert all(a == prev for (_, prev), (a, _) in zip(bounds, bounds[1:]))
        assert all(a % 16 == 0 for a, _ in bounds)


def test_split_k_partials_each_sum_in_fp32_and_add_in_chunk_order():
    x = torch.randn(7, 300, generator=gen(8)).to(BF16)
    w = torch.randn(50, 300, generator=gen(9)).to(BF16)
    total = None
    for k0, k1 in ga.split_bounds(300, 4, 16):
        partial = ga.split_k_matmul(x[:, k0:k1], w[:, k0:k1], splits=1)
        total = partial if total is None else total + partial
    assert torch.equal(ga.split_k_matmul(x, w, splits=4), total)
    # one k-step of 16 products: their exact sum, rounded once
    one_step = (x[:, :16].double() @ w[:, :16].double().T).float()
    assert torch.equal(ga.split_k_matmul(x[:, :16], w[:, :16], splits=1), one_step)
    exact = x.double() @ w.double().T
    bound = 300 * 2.0**-24 * (x.double().abs() @ w.double().abs().T)
    assert bool(((ga.split_k_matmul(x, w).double() - exact).abs() <= bound).all())


# --- index logits -------------------------------------------------------------------------------------


def _indexer_operands(seed: int = 10):
    q = up.fp4_act_quant_e8m0(torch.randn(1, 6, 4, 64, generator=gen(seed)).to(BF16)).y
    k = up.fp4_act_quant_e8m0(torch.randn(1, 9, 64, generator=gen(seed + 1)).to(BF16)).y
    w = (torch.randn(1, 6, 4, generator=gen(seed + 2)) * 0.25).to(BF16)
    return q, k, w


def test_fp32_index_logits_round_once():
    q, k, w = _indexer_operands()
    exact = (torch.einsum("bshd,btd->bsht", q.double(), k.double()).relu() * w.double().unsqueeze(-1)).sum(2)
    out = ga.index_logits_fp32(q, k, w)
    ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(exact.abs().clamp_min(2.0**-100))[1] - 8)
    assert bool(((out.double() - exact).abs() <= 0.5 * ulp + 4 * 2.0**-24 * ga.index_logit_terms(q, k, w)).all())
    assert not torch.equal(out, up.index_scores(q, k, w))  # upstream rounds each head to bf16


def test_bf16_head_sum_rounds_after_every_head():
    q, k, w = _indexer_operands(20)
    terms = torch.einsum("bshd,btd->bsht", q.float(), k.float()).relu() * w.float().unsqueeze(-1)
    expected = torch.zeros(1, 6, 9, dtype=BF16)
    for h in range(4):
        expected = (expected.float() + terms[:, :, h]).to(BF16)
    assert torch.equal(ga.index_logits_head_sum_bf16(q, k, w), expected)


# --- fast math ---------------------------------------------------------------------------------------


def _ulps_off(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    return (approx.double() - exact).abs() / ga.fp32_ulp(exact.float())


def test_ex2_approx_is_one_or_two_ulps_off_deterministically_and_flushes_subnormals():
    x = torch.linspace(-120, 120, 50_001, dtype=F32)
    y = ga.ex2_approx(x)
    off = _ulps_off(y, torch.exp2(x.double()))
    assert float(off.max()) <= 2.5 and float(off.min()) >= 0.5
    assert torch.equal(y, ga.ex2_approx(x.clone()))
    assert ga.ex2_approx(torch.tensor([-130.0, float("-inf"), 0.0])).tolist()[:2] == [0.0, 0.0]
    assert 0.99999 < ga.ex2_approx(torch.tensor([0.0])).item() < 1.00001


def test_fast_exp_errs_by_ex2s_ulps_plus_the_rounding_of_x_log2e():
    """fp32(log2 e) and the product's rounding move the exponent by up to 2^-24 |x log2 e| each, e^x by
    up to 1.173 |x| ulps; ex2 adds its 2.5: __expf's documented 2 + floor(1.173 |x|) ulps (CUDA C++
    Programming Guide), with the model's half ulp more."""
    x = torch.linspace(-80, 80, 40_001, dtype=F32)
    off = _ulps_off(ga.exp_fast(x), torch.exp(x.double()))
    assert bool((off <= 2.5 + 1.173 * x.abs().double()).all())
    assert float(off[x.abs() > 40].max()) > 3  # the product's rounding is really there


def test_rsqrt_approx_is_one_ulp_off():
    x = torch.logspace(-30, 30, 20_001, dtype=F32)
    off = _ulps_off(ga.rsqrt_approx(x), 1.0 / torch.sqrt(x.double()))
    assert float(off.max()) <= 1.5 and float(off.min()) >= 0.5
    assert float((ga.rsqrt_approx(x).double() * torch.sqrt(x.double()) - 1).abs().max()) < 1.5 * 2.0**-23


# --- reductions and RMSNorm --------------------------------------------------------------------------


def test_warp_tree_sums_lane_strided_then_by_butterfly():
    v = torch.randn(3, 100, generator=gen(30)) * torch.logspace(-4, 4, 100)
    out = []
    for row in range(3):
        part = [torch.tensor(0.0, dtype=F32) for _ in range(32)]
        for i in range(100):  # lane i % 32 adds its elements in order
            part[i % 32] = part[i % 32] + v[row, i]
        for offset in (16, 8, 4, 2, 1):  # every lane adds its partner's value (all at once)
            part = [part[lane] + part[lane ^ offset] for lane in range(32)]
        out.append(part[0])
    assert torch.equal(ga.warp_tree_sum(v), torch.stack(out))
    assert torch.allclose(ga.warp_tree_sum(v).double(), v.double().sum(-1), rtol=1e-5)


def test_norm_arith_defaults_are_upstreams_rms_norm():
    x = torch.randn(4, 1280, generator=gen(31)).to(BF16)
    weight = torch.randn(1280, generator=gen(32)).to(BF16)
    assert torch.equal(ga.NormArith().rms_norm(x, weight, 1e-6), up.rms_norm(x, weight, 1e-6))
    fast = ga.NormArith(row_sum=ga.warp_tree_sum, rsqrt=ga.rsqrt_approx).rms_norm(x, weight, 1e-6)
    assert (fast.float() - up.rms_norm(x, weight, 1e-6).float()).abs().max() <= 2.0**-6  # an ulp of values < 2


# --- attention ---------------------------------------------------------------------------------------


def _attention_operands(k: int = 150, seed: int = 40):
    b, m, h, d, n = 2, 5, 4, 64, 60
    q = torch.randn(b, m, h, d, generator=gen(seed)).to(BF16)
    kv = torch.randn(b, n, d, generator=gen(seed + 1)).to(BF16)
    ids = torch.randint(-1, n, (b, m, k), generator=gen(seed + 2)).int()
    ids[0, 0] = -1  # a row with no lane present
    sink = torch.randn(h, generator=gen(seed + 3))
    return q, kv, sink, ids


def test_the_online_core_with_upstream_arithmetic_is_upstreams_kernel():
    q, kv, sink, ids = _attention_operands()
    mine = ga.sparse_attention(q, kv, sink, ids, 0.125, ga.SoftmaxArith())
    assert torch.equal(mine, up.sparse_attn(q, kv, sink, ids, 0.125))


def _softmax64(q, kv, sink, ids, scale):
    """float64 softmax over the present lanes plus the sink (the mathematical value)."""
    rows = kv[torch.arange(kv.shape[0]).view(-1, 1, 1), ids.long().clamp_min(0)].double()
    s = torch.einsum("bmhd,bmtd->bmht", q.double(), rows) * scale
    s = s.masked_fill(~(ids >= 0).unsqueeze(2), float("-inf"))
    full = torch.cat([s, sink.double().view(1, 1, -1, 1).expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(full, -1)[..., :-1]
    return torch.einsum("bmht,bmtd->bmhd", p, rows), torch.logsumexp(s, -1) / math.log(2)


@pytest.mark.parametrize("splits", [1, 4])
def test_online_softmax_and_its_lse_merge_equal_the_one_pass_softmax(splits):
    q, kv, sink, ids = _attention_operands()
    scale = 0.125
    exact, lse2 = _softmax64(q, kv, sink, ids, scale)
    part = ga.online_softmax(q, kv, ids, scale, ga.SoftmaxArith(folded=True, bf16_p=False))
    present = part.l > 0
    assert torch.allclose((torch.log2(part.l.double()) + part.top)[present], lse2[present], atol=1e-5)
    arith = ga.SoftmaxArith(folded=True, reciprocal=True, bf16_p=False, max_splits=splits)
    sink2 = ga._sink_units(sink, arith).view(1, 1, -1)
    o = ga._split_kv(q, kv, sink2, ids, scale, arith) if splits > 1 else None
    if o is None:
        o = ga._normalise(part.acc, part.l + ga.exp2_fp32(sink2 - part.top), True)
    assert torch.allclose(o.double(), exact, atol=1e-5, rtol=1e-5)
    assert bool((o[0, 0] == 0).all())  # no lane present: 0, as upstream
    assert len(ga.partition_bounds(150, 4)) == 3 and len(ga.partition_bounds(12, 4)) == 2


def test_flash_mla_and_split_kv_round_p_to_bf16_as_the_kernels_do():
    q, kv, sink, ids = _attention_operands(k=300, seed=50)
    exact, _ = _softmax64(q, kv, sink, ids, 0.125)
    for arith in (ga.FLASH_MLA, ga.SplitKvDecode.softmax, ga.AllGpu.softmax):
        o = ga.sparse_attention(q, kv, sink, ids, 0.125, arith)
        assert o.dtype == BF16 and float((o.double() - exact).abs().max()) < 2.0**-7 * float(exact.abs().max())


# --- the gates swap only what they say ---------------------------------------------------------------


def test_registry_lists_gates_and_mutants_with_their_stages():
    assert set(ga.GATES) == {
        "Fp8Tc14",
        "Fp8Tc14Aligned",
        "SplitKBf16",
        "Bf16TcTruncating",
        "Fp32IndexLogits",
        "FlashMlaSparse",
        "SplitKvDecode",
        "FastMath",
        "WarpTree",
        "AllGpu",
    }
    stages = {"qr", "kv", "index_q", "index_scores", "index_k_rows", "o", "z", "out"}
    for name, spec in ga.MUTANTS.items():
        assert issubclass(spec.cls, ga.GpuGate) and spec.stage in stages and spec.outputs, name
    for cls in ga.GATES.values():
        assert cls().patches(), cls.__name__


def test_a_gate_returns_upstreams_outputs_and_intermediates_and_restores_upstream_ops():
    config = load_config(ROOT / "conformance.yaml")
    manifest = read_manifest(config.goldens)
    before = {name: getattr(up, name) for name in ("fp8_linear", "linear", "index_scores", "sparse_attn", "rms_norm")}
    case = "indexer/r1-decode-start25"
    names = set(run_case(case, config, UpstreamTorch(), "upstream", manifest).outputs)
    for cls in (ga.AllGpu, ga.IndexLogitsNoFp4K):
        result = run_case(case, config, cls(), cls.__name__, manifest)
        assert set(result.outputs) == names and result.status in ("pass", "fail"), (cls.__name__, result.message)
    assert before == {name: getattr(up, name) for name in before}
