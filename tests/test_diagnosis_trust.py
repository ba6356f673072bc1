"""A diagnosis to trust (docs/diagnosis.md): on ports written apart from the catalogue
(tests/impls/ports.py), it never names a bug the port does not have, names every bug it has (two at
once, in two stages or in one), stays silent on correct ports (a token-by-token emulation, a NaN or
an inf in a correct output), reads schedules with rollbacks as their golden was made, names a tie
order only on evidence, and gives the same answer under load.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import ports
from conftest import ROOT
from v41_conformance.config import load_config
from v41_conformance.golden import read_manifest
from v41_conformance.ids import matches, parse_select
from v41_conformance.runner import run_case

CONFIG = replace(load_config(ROOT / "conformance.yaml"), diagnosis_budget=64)
MANIFEST = read_manifest(CONFIG.goldens)
STRICT = {"strict_signed_zeros": True}


def failing(impl, pattern: str, most: int = 99, conf: dict | None = None) -> list:
    ids = [c for c in sorted(MANIFEST) if matches(c, parse_select(pattern))][:most]
    results = [run_case(c, CONFIG, impl, "port", MANIFEST, conf) for c in ids]
    return [r for r in results if r.status == "fail"]


def named(result) -> set[str]:
    return {v for m in (result.diagnosis or {}).get("matches", []) for v in (*m["variants"], *m["indistinguishable"])}


def full(result) -> list[tuple[str, ...]]:
    """The matches that explain every failing output, each as its variants."""
    return [tuple(m["variants"]) for m in result.diagnosis["matches"] if len(m["outputs"]) == m["failing"]]


@pytest.mark.parametrize(
    "impl, pattern, name, conf",
    [
        # transformers' eager path: its bf16 logits alone explain this case too (both are what the port does)
        (
            ports.HfLogitsBf16(),
            "sparse_attn/multi-tile-*",
            "attention-eager-bf16-with-sinks|attention-logits-bf16",
            None,
        ),
        (ports.NormOutputBf16(), "norm.rms/*", "rmsnorm-output-bf16", None),
        (ports.NormAllBf16(), "norm.rms/*", "rmsnorm-bf16-throughout", None),
        (ports.YarnWithoutRamp(), "rope.yarn_table/*", "yarn-no-ramp", None),
        (ports.Fp8NoFloor(), "quant.fp8_ue8m0/*", "fp8-no-amax-floor-at-all", None),
        (ports.SignTimesTableE2M1(), "quant.*", "e2m1-zero-input-sign-lost", STRICT),
        (ports.CompressorNormBeforeWeight(), "compressor/*-rb*", "rmsnorm-bf16-before-weight", None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_port_written_apart_gets_its_one_bug_and_nothing_else(impl, pattern, name, conf):
    results = failing(impl, pattern, conf=conf)
    assert results, f"{type(impl).__name__} fails none of {pattern}"
    names = set(name.split("|"))  # the names of what the port does
    for r in results:
        assert full(r) and all(names & set(m) for m in full(r)), (r.id, r.diagnosis)
        assert named(r) <= names | set(_indistinguishable(r)), (r.id, r.diagnosis)
        assert f"[{name.split('|')[0]}]" in r.message and "passes its own comparison" in r.message


def _indistinguishable(result) -> list[str]:
    return [t for m in result.diagnosis["matches"] for t in m["indistinguishable"]]


def test_a_lost_minus_zero_is_never_named_as_a_tie_rule_or_a_scale_rule():
    """Under strict signed zeros a port whose only defect is +0 where its input was -0 is named by its
    variant alone: a variant that changes nothing at the differing elements explains nothing, and the
    variant that loses every -0 moves the -0s this port keeps."""
    results = failing(ports.SignTimesTableE2M1(), "quant.*", conf=STRICT)
    assert len(results) >= 3
    for r in results:
        assert named(r) == {"e2m1-zero-input-sign-lost"}, (r.id, r.diagnosis)


def test_variants_that_compute_the_same_on_a_case_are_named_together_as_indistinguishable():
    from v41_conformance.diagnosis import Rejudged, diagnose

    def rejudge(params, stop_on):  # both policy flips compute the same here; the case fails without them
        flipped = params.get("candidate_leak") == "drop"
        return Rejudged({"ids": flipped}, frozenset({"ids"}), "same" if flipped else "reference")

    found = diagnose("indexer.select", {"ids": False}, {"candidate_leak": "upstream"}, rejudge, 8)
    assert [m.variants for m in found.matches] == [("candidate-leak-other-policy",)]
    assert found.matches[0].indistinguishable == ()
    twice = diagnose(
        "indexer.select",
        {"ids": False},
        {"candidate_leak": "upstream"},
        lambda params, stop_on: Rejudged({"ids": True}, frozenset({"ids"}), "same"),
        64,
    )
    assert len(twice.matches) == 1 and twice.matches[0].indistinguishable, twice
    assert "this case cannot tell it from [" in twice.lines()[0]


def test_a_variant_that_passes_an_output_by_moving_it_away_from_the_answer_is_never_named():
    """The golden can hold an accident (an exact value that happens to meet a rule); a variant that removes
    it passes the output without reproducing the implementation. Only a move toward the answer explains."""
    from v41_conformance.diagnosis import Rejudged, diagnose

    def rejudge(toward: bool):
        return lambda params, stop_on: Rejudged({"o": True}, frozenset({"o"}), "v", nearer=lambda name: toward)

    accident = diagnose("sparse_attn", {"o": False}, {"softmax_scale": 0.125}, rejudge(False), 64)
    assert not accident.matches and accident.tried, accident
    real = diagnose("sparse_attn", {"o": False}, {"softmax_scale": 0.125}, rejudge(True), 64)
    assert real.matches


def test_moves_toward_is_measured_against_the_answer():
    from v41_conformance.runner import moves_toward

    golden = torch.tensor([1.0, 0.0, -2.0])
    answer = torch.tensor([1.0, 0.25, -2.0])
    assert moves_toward(golden, torch.tensor([1.0, 0.2, -2.0]), answer)
    assert not moves_toward(golden, torch.tensor([1.0, -0.3, -2.0]), answer)  # the 0 is gone, but farther
    assert not moves_toward(golden, golden.clone(), answer)
    assert moves_toward(torch.tensor([-0.0, 1.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]))  # a sign
    assert not moves_toward(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), torch.tensor([0.0, 1.0]))
    ids = torch.tensor([[3, 1, -1]])
    assert moves_toward(ids, torch.tensor([[1, 3, -1]]), torch.tensor([[1, 3, -1]]))
    assert not moves_toward(ids, torch.tensor([[3, 2, -1]]), torch.tensor([[1, 3, -1]]))
    assert not moves_toward(golden, golden, [1.0, 0.25, -2.0])  # no tensor: near nothing


def test_two_bugs_in_two_stages_are_both_named_with_what_each_explains():
    results = failing(ports.NormAndRopeTable(), "kv.finish/*")
    assert len(results) >= 4
    pairs = [r for r in results if full(r) == [("rmsnorm-bf16-before-weight", "rope-bf16-table")]]
    assert len(pairs) >= 3, [(r.id, r.diagnosis) for r in results]
    for r in pairs:
        (match,) = r.diagnosis["matches"]
        assert match["explains"][0] and "two known bugs at once" in r.message
    for r in results:  # a case that shows only one of them is named by that one
        assert full(r) and set(full(r)[0]) <= {"rmsnorm-bf16-before-weight", "rope-bf16-table"}, (r.id, r.diagnosis)


def test_two_bugs_in_one_stage_are_named_together():
    for r in failing(ports.ScoresRaw(), "indexer.scores/*", most=3):
        assert full(r) == [("index-scores-without-relu", "index-scores-without-head-weights")], (r.id, r.diagnosis)
        assert "(alone: none on its own)" in r.message


def test_two_bugs_in_two_stages_of_attention():
    (r,) = failing(ports.RefNormAndSink(), "attention/a-p5-d7-d9-d1x2-gen-upstream")
    assert full(r) == [("rmsnorm-bf16-before-weight", "sink-left-out")], r.diagnosis
    explains = dict(zip(r.diagnosis["matches"][0]["variants"], r.diagnosis["matches"][0]["explains"]))
    assert "s00.l0.qr" in explains["rmsnorm-bf16-before-weight"] and "s00.l0.o" in explains["sink-left-out"]


def test_a_policy_at_one_step_and_a_tie_at_another():
    """The first divergence (a tie at step 2) does not end the search: the policy of step 4 is named; the
    tie, decided by one binary choice, is not named as a tie rule, and the message says why."""
    (r,) = failing(ports.PolicyAndTies(), "attention/a-p5-d7-d9-d1x2-gen-upstream")
    assert named(r) == {"stale-index-keys-other-policy"}, r.diagnosis
    assert r.diagnosis["unexplained"] and all(n.startswith("s02.") for n in r.diagnosis["unexplained"])
    assert "[topk-lowest-index-ties] reproduces" in r.message and "by chance 1 time in 2" in r.message


@pytest.mark.parametrize("pattern", ["sparse_attn/*", "norm.rms/*"])
def test_a_correct_output_with_one_nan_or_inf_is_explained_by_nothing(pattern):
    results = failing(ports.OneNonFinite(), pattern)
    assert results
    for r in results:
        assert r.diagnosis["matches"] == [], (r.id, r.diagnosis)


def test_a_token_by_token_emulation_of_chunked_cases_gets_no_name():
    """Upstream's own arithmetic, one token at a time: correct, only torch's tie order over another
    row width can differ; no bug is named for that."""
    results = failing(ports.TokenByToken(), "indexer/*")
    assert results  # tie order over another width
    for r in results:
        assert r.diagnosis["matches"] == [], (r.id, r.diagnosis)
        assert "tie order only" in r.message


def test_the_diagnoses_are_the_same_under_load():
    """The search is bounded by re-runs, not seconds: two busy loops beside it change nothing."""
    cases = [
        ("kv.finish/*", ports.NormAndRopeTable()),
        ("indexer.scores/*", ports.ScoresRaw()),
        ("quant.*", ports.SignTimesTableE2M1()),
    ]

    def diagnoses():
        return [(r.id, r.diagnosis) for pattern, impl in cases for r in failing(impl, pattern, most=6, conf=STRICT)]

    quiet = diagnoses()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        loaded = diagnoses()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert quiet and loaded == quiet
