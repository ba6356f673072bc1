"""What the chain skips to judge faster, and that no verdict moves for it (benchmarks/production_judging.py
measures the time; nothing here does):

- a stage the golden holds whose inputs are all the reference's own values (`Given.reference`) takes the
  golden's rows as its expected values instead of rederiving them: `out` given a z the implementation did
  not return projects nothing through wo_b; its accumulator context is still computed, so the verdict and
  every metric are the rederived one's;
- an intermediate the implementation did not return is a stand-in: its rows are computed without the
  comparator's context (no fp8 GEMM term magnitudes for a qr or kv nobody judges);
- within a chain, each fp8 weight is converted to values once (`fp8_linear.weight_cache`), bit for bit
  the values it converts to without the cache; the accumulator model's magnitudes agree with a plain
  float64 sum over blocks;
- the verdicts with and without the shortcut agree (status, kind, message, every output's record) on
  small-tier attention cases for a synthetic answer, the reference's own intermediates, a GPU gate and
  a GPU mutant (which still fails at its stage).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch

import gpu_gates
from conftest import ROOT
from v41_conformance import regenerated
from v41_conformance.accumulation import WALK, fp8_terms
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.chain import attention as chain_attention
from v41_conformance.chain.attention import AttentionChain
from v41_conformance.config import load_config
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.known import get
from v41_conformance.reference import numerics as nx
from v41_conformance.reference.fp8_linear import (
    BLOCK,
    Fp8Weight,
    e4m3_value,
    fp8_gemm,
    quantise_weight,
    weight_blocks,
    weight_cache,
)
from v41_conformance.runner import CaseResult, _execute, _judge

sys.path.insert(0, str(ROOT / "benchmarks"))
from production_judging import perturbed  # noqa: E402

CONFIG = replace(load_config(ROOT / "conformance.yaml"), diagnosis_budget=0)
MANIFEST = read_manifest(CONFIG.goldens)
FP8_CASE = "attention/a-fp8-p5-d7-d9-d1x2-gen-upstream"  # the smallest fp8 attention case
BF16_CASE = "attention/a-p5-d7-d9-d1x2-gen-upstream"


def _golden(case_id: str):
    golden = load_verified(CONFIG.goldens, case_id, MANIFEST, CONFIG.generate_command)
    component = get(golden.meta["component"])
    regenerated.restore(golden, component)
    return golden, component, component.with_defaults(golden.meta["params"])


def _moved(golden, component, names=None) -> dict[str, torch.Tensor]:
    """The golden's outputs with one bf16 ulp added at 1 element in 64 of each tolerance-judged output
    (of `names` only, where given): an answer the chain rederives rows for."""

    def tolerant(name):
        return config_policy(component, name, golden).tolerant and (names is None or name.endswith(names))

    return perturbed(golden.outputs, tolerant)


def config_policy(component, name, golden):
    return CONFIG.policy(component, name, {}, dtype=golden.outputs[name].dtype)


def _judged(golden, component, params, answer, shortcut: bool, monkeypatch) -> tuple[CaseResult, AttentionChain]:
    chains: list[AttentionChain] = []
    run = AttentionChain.run

    def recorded(self):
        chains.append(self)
        return run(self)

    with monkeypatch.context() as m:
        m.setattr(AttentionChain, "shortcut", shortcut)
        m.setattr(AttentionChain, "run", recorded)
        result = CaseResult(golden.meta.get("case_id", "case"), component.name, "error")
        _judge(component, golden, dict(answer), params, CONFIG, {}, result)
    assert len(chains) == 1  # judged along the chain (not the bit-for-bit fast path)
    return result, chains[0]


def _same(a: CaseResult, b: CaseResult) -> None:
    assert (a.status, a.kind, a.first_divergent_stage, a.first_divergent_step) == (
        b.status,
        b.kind,
        b.first_divergent_stage,
        b.first_divergent_step,
    )
    assert a.message == b.message
    assert a.outputs == b.outputs  # every output's verdict record: ok, metrics, what it was judged given


def _counting(monkeypatch, name: str) -> list[object]:
    """The weights the chain's `name(x, weight)` is called with, recorded as it runs."""
    seen: list[object] = []
    original = getattr(chain_attention, name)

    def counting(x, weight):
        seen.append(weight)
        return original(x, weight)

    monkeypatch.setattr(chain_attention, name, counting)
    return seen


# --- the shortcut: a stage with only the reference's inputs is judged against the golden as it stands --


def test_out_given_the_references_z_is_not_projected_again_and_is_judged_the_same(monkeypatch):
    golden, component, params = _golden(FP8_CASE)
    answer = _moved(golden, component)  # outputs only, out moved: z is the reference's own, as a stand-in
    projected = _counting(monkeypatch, "project")
    fast, chain = _judged(golden, component, params, answer, True, monkeypatch)
    assert fast.status == "pass"
    assert not _through(projected, chain, "wo_b")  # not one row of out rederived through wo_b
    outs = [n for n in chain.taken_as_golden if n.endswith(".out")]
    assert outs and all(fast.outputs[n]["rederived_rows"] for n in outs)
    assert all("accumulation_flips" in fast.outputs[n] for n in outs)  # the context still came with it
    projected.clear()
    full, chain = _judged(golden, component, params, answer, False, monkeypatch)
    assert not chain.taken_as_golden and _through(projected, chain, "wo_b")
    _same(fast, full)


def _through(weights: list, chain: AttentionChain, *names: str) -> list:
    """Those of `weights` that are one of the chain's layers' `names` (indexer.wq_b: the indexer's)."""

    def key(w):
        return id(w.codes) if isinstance(w, Fp8Weight) else id(w)

    mine = set()
    for layer in chain.weights.values():
        for name in names:
            owner, _, attr = name.rpartition(".")
            holder = getattr(layer, owner) if owner else layer
            if holder is not None:
                mine.add(key(getattr(holder, attr)))
    return [w for w in weights if key(w) in mine]


def test_an_intermediate_nobody_judges_is_computed_without_the_comparators_context(monkeypatch):
    golden, component, params = _golden(FP8_CASE)
    answer = _moved(golden, component)  # no qr, kv or index_q returned: each a stand-in
    termed = _counting(monkeypatch, "gemm_terms")
    _, chain = _judged(golden, component, params, answer, True, monkeypatch)
    assert termed and not _through(termed, chain, "wq_a", "wkv", "indexer.wq_b")  # only wo_b's, for out
    assert len(_through(termed, chain, "wo_b")) == len(termed)


def test_a_stage_given_the_implementations_own_value_is_still_rederived(monkeypatch):
    golden, component, params = _golden(FP8_CASE)
    reference = _execute(component, ReferenceAdapter(), golden, params, CaseResult("c", "attention", "error"))
    assert reference is not None
    qr = sorted(n for n in reference if n.endswith(".qr"))[0]
    call = qr.rsplit(".", 1)[0]
    answer = {**_moved(golden, component, ("out",)), qr: _bumped(reference[qr])}  # one call's own qr, moved
    fast, chain = _judged(golden, component, params, answer, True, monkeypatch)
    outs = [n for n in fast.outputs if n.endswith(".out") and fast.outputs[n].get("rederived_rows")]
    assert f"{call}.out" in outs  # its o, z and out rederived from that qr: never the golden's rows
    assert f"{call}.out" not in chain.taken_as_golden
    assert set(outs) - {f"{call}.out"} <= set(chain.taken_as_golden)  # every other call's out is
    full, _ = _judged(golden, component, params, answer, False, monkeypatch)
    _same(fast, full)


def _bumped(t: torch.Tensor) -> torch.Tensor:
    """`t` with one element in 64 moved up by one bf16 ulp."""
    flat = t.clone().reshape(-1)
    flat[::64] = (flat[::64].float() * (1 + 2.0**-7)).to(t.dtype)
    return flat.reshape(t.shape)


# --- the verdicts agree with and without it --------------------------------------------------------------


def _answers(golden, component, params) -> dict[str, dict]:
    out = {"outputs only, out moved": _moved(golden, component)}
    reference = _execute(component, ReferenceAdapter(), golden, params, CaseResult("c", "attention", "error"))
    assert reference is not None
    out["the reference's intermediates, out moved"] = {**reference, **_moved(golden, component, ("out",))}
    return out


@pytest.mark.parametrize("case_id", [FP8_CASE, BF16_CASE, "attention/single-compressed-row-chunks-1-1-1-upstream"])
def test_verdicts_agree_with_and_without_the_shortcut(case_id, monkeypatch):
    golden, component, params = _golden(case_id)
    for what, answer in _answers(golden, component, params).items():
        fast, _ = _judged(golden, component, params, answer, True, monkeypatch)
        full, _ = _judged(golden, component, params, answer, False, monkeypatch)
        assert fast.status == "pass", what
        _same(fast, full)


@pytest.mark.parametrize(
    "impl, status, stage",
    [
        (gpu_gates.GATES["Fp8Tc14"], "pass", None),
        (gpu_gates.MUTANTS["Fp8BlockSumsBf16"], "fail", ("qr", "kv")),  # at the first fp8 GEMM's output
    ],
    ids=["Fp8Tc14", "Fp8BlockSumsBf16"],
)
def test_a_gpu_gate_and_mutant_are_judged_the_same_with_and_without_the_shortcut(impl, status, stage, monkeypatch):
    golden, component, params = _golden(FP8_CASE)
    answer = _execute(component, impl(), golden, params, CaseResult("c", "attention", "error"))
    assert answer is not None
    fast, _ = _judged(golden, component, params, answer, True, monkeypatch)
    full, _ = _judged(golden, component, params, answer, False, monkeypatch)
    _same(fast, full)
    assert fast.status == status
    if stage is not None:
        assert fast.first_divergent_stage.rsplit(".", 1)[-1] in stage


# --- fp8 weights converted once; the accumulator model's magnitudes -----------------------------------------


def test_within_the_weight_cache_each_fp8_weight_is_converted_once_and_to_the_same_values(monkeypatch):
    torch.manual_seed(0)
    weight = quantise_weight(torch.randn(96, 128) * 0.05)
    q = nx.fp8_qdq_ue8m0(torch.randn(5, 128).to(torch.bfloat16), BLOCK)
    plain = fp8_gemm(q.codes, q.scales, weight)
    converted: list[torch.Tensor] = []
    values = e4m3_value

    def counting(codes):
        converted.append(codes)
        return values(codes)

    monkeypatch.setattr("v41_conformance.reference.fp8_linear.e4m3_value", counting)
    with weight_cache():
        first = fp8_gemm(q.codes, q.scales, weight)
        second = fp8_gemm(q.codes, q.scales, weight)
        assert weight_blocks(weight) is weight_blocks(weight)
        weight.codes[0, 0] ^= 1  # changed in place: converted again
        changed = weight_blocks(weight)
    weight.codes[0, 0] ^= 1
    assert sum(c is weight.codes for c in converted) == 2
    assert torch.equal(first.view(torch.int32), plain.view(torch.int32)) and torch.equal(first, second)
    assert not torch.equal(changed, weight_blocks(weight))
    outside = len(converted)
    fp8_gemm(q.codes, q.scales, weight)
    fp8_gemm(q.codes, q.scales, weight)
    assert len(converted) == outside + 4  # no cache outside: each call converts (activation and weight)


def _terms_by_block(x: torch.Tensor, weight: Fp8Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """A and R as their definition reads: each block's T_b in float64, summed and summed in quadrature."""
    n, k = weight.shape
    q = nx.fp8_qdq_ue8m0(x, BLOCK)
    qa = e4m3_value(q.codes).abs().double() * q.scales.double().repeat_interleave(BLOCK, -1)
    sw = nx.e8m0_value(weight.scale_bytes).double().repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)
    qw = e4m3_value(weight.codes).abs().double() * sw
    t = torch.stack([qa[:, b : b + BLOCK] @ qw[:, b : b + BLOCK].T for b in range(0, k, BLOCK)])
    return WALK * t.sum(0), WALK * t.square().sum(0).sqrt()


@pytest.mark.parametrize("scale", [1e-3, 0.05, 4.0])
def test_the_term_magnitudes_are_the_blocks_sums(scale):
    torch.manual_seed(1)
    weight = quantise_weight(torch.randn(80, 256) * scale)
    x = (torch.randn(7, 256) * torch.logspace(-3, 3, 256)).to(torch.bfloat16)
    peak, rms = _terms_by_block(x, weight)
    terms = fp8_terms(x, weight)
    assert torch.allclose(terms.peak, peak, rtol=1e-14, atol=0)  # float64 throughout
    assert torch.allclose(terms.rms, rms, rtol=1e-6, atol=0)  # fp32 block sums: an allowance's size
    with weight_cache():
        cached = fp8_terms(x, weight)
    assert torch.equal(cached.peak, terms.peak) and torch.equal(cached.rms, terms.rms)
