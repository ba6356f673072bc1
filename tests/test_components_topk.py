"""topk.torch_cpu through the runner: the emulation agrees with torch, and index verdicts tell
tie order from a miss."""

from __future__ import annotations

import platform

import pytest
import torch

from conftest import ROOT, make_project, results, run_cli
from v41_conformance.config import load_config
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.runner import run_case
from impls.wrong_topk import DropsLarger, LowestIndexTopk, lowest_index_topk

CONFIG = load_config(ROOT / "conformance.yaml")
MANIFEST = read_manifest(CONFIG.goldens)
TOPK_CASES = sorted(c for c in MANIFEST if c.startswith("topk.torch_cpu/"))
LIBSTDCXX = platform.system() == "Linux" and "GCC" in torch.__config__.show()


@pytest.mark.skipif(not LIBSTDCXX, reason="torch here is not a libstdc++ (Linux GCC) build: its tie order differs")
@pytest.mark.parametrize("case_id", TOPK_CASES)
def test_goldens_agree_with_real_torch_topk(case_id):
    golden = load_verified(CONFIG.goldens, case_id, MANIFEST)
    p = golden.meta["params"]
    got = torch.topk(
        golden.inputs["values"], int(p["k"]), dim=-1, largest=p.get("largest", True), sorted=p.get("sorted", True)
    )
    assert torch.equal(got.indices, golden.outputs["indices"])


def _sorted_cases():
    """The cases whose order is torch's by contract (sorted=True; an unsorted one is judged as a set)."""
    return [c for c in TOPK_CASES if load_verified(CONFIG.goldens, c, MANIFEST).meta["params"].get("sorted", True)]


def test_lowest_index_tie_breaking_is_tie_order_only_on_exactly_the_tied_rows():
    impl = LowestIndexTopk()
    seen_tie = seen_exact = 0
    for case_id in _sorted_cases():
        golden = load_verified(CONFIG.goldens, case_id, MANIFEST)
        p = golden.meta["params"]
        _, mine = lowest_index_topk(golden.inputs["values"], int(p["k"]), p.get("largest", True))
        differing_rows = int((mine != golden.outputs["indices"]).any(dim=-1).sum())
        result = run_case(case_id, CONFIG, impl, "lowest-index", MANIFEST)
        metrics = result.outputs["indices"]
        assert metrics["rows_miss"] == 0, (case_id, result.message)
        assert metrics["rows_tie"] == differing_rows, case_id
        assert result.status == ("fail" if differing_rows else "pass"), case_id
        if differing_rows:
            assert "tie order only" in result.message and "k-th" in result.message
        seen_tie += differing_rows
        seen_exact += metrics["rows_exact"]
    assert seen_tie > 0 and seen_exact > 0


def test_accept_ties_lets_tie_order_differences_pass_but_still_counts_them():
    impl = LowestIndexTopk()
    case_id = "topk.torch_cpu/nth-all-ninf-n1000-k16"
    strict = run_case(case_id, CONFIG, impl, "lowest-index", MANIFEST)
    lenient = run_case(case_id, CONFIG, impl, "lowest-index", MANIFEST, {"accept_ties": True})
    assert strict.status == "fail" and lenient.status == "pass"
    assert lenient.tie_rows == strict.tie_rows == 2


def test_dropping_a_strictly_larger_score_is_a_miss():
    result = run_case("topk.torch_cpu/distinct-n1000-k100", CONFIG, DropsLarger(), "drops", MANIFEST)
    assert result.status == "fail"
    assert result.outputs["indices"]["rows_miss"] == 4 and "miss" in result.message


def test_tie_verdict_through_the_cli_and_conformance_yaml(tmp_path):
    project = make_project(tmp_path, ["topk.torch_cpu"])
    config = project / "conformance.yaml"
    config.write_text(
        config.read_text()
        + f"""  lowest-lenient:
    python: {ROOT}/tests/impls/wrong_topk.py:LowestIndexTopk
    accept_ties: true
"""
    )
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        "lowest-lenient",
        "--config",
        str(config),
        "--report-dir",
        str(report),
        "--select",
        "topk.torch_cpu/nth-all-ninf*,topk.torch_cpu/partial-*",
        "--no-isolate",
    )
    assert proc.returncode == 0, proc.stdout
    doc = results(report)
    assert doc["components"]["topk.torch_cpu"]["tie_rows"] == 3
    assert "ties" in proc.stdout


UNSORTED = [c for c in TOPK_CASES if not load_verified(CONFIG.goldens, c, MANIFEST).meta["params"].get("sorted", True)]


def test_an_unsorted_top_k_is_judged_as_its_pairs_in_any_order():
    """sorted=False leaves the order unspecified: the reference's (index, value) pairs in another
    order pass (no tie order, nothing to accept); a wrong value fails at values, a wrong index is a
    miss; an implementation that promises torch's order (strict_topk_order) is held to it."""
    from impls.wrong_topk import PermutedPairs, PermutedWrongIndex, PermutedWrongValue

    assert len(UNSORTED) >= 8
    strict_failures = 0
    for case_id in TOPK_CASES:
        result = run_case(case_id, CONFIG, PermutedPairs(), "permuted", MANIFEST)
        assert result.status == "pass" and not result.tie_rows, (case_id, result.message)
        strict = run_case(case_id, CONFIG, PermutedPairs(), "permuted", MANIFEST, {"strict_topk_order": True})
        strict_failures += strict.status == "fail"
        assert strict.status == ("fail" if case_id in UNSORTED else "pass"), case_id
    assert strict_failures == len(UNSORTED)
    for case_id in UNSORTED:
        value = run_case(case_id, CONFIG, PermutedWrongValue(), "wrong-value", MANIFEST, {"accept_ties": True})
        assert value.status == "fail" and value.outputs["indices"]["ok"] and not value.outputs["values"]["ok"], case_id
        assert (
            value.outputs["values"]["mismatched"] == 1 and "judged as the set of (index, value) pairs" in value.message
        )
        index = run_case(case_id, CONFIG, PermutedWrongIndex(), "wrong-index", MANIFEST, {"accept_ties": True})
        assert index.status == "fail" and index.outputs["indices"]["rows_miss"] == 1, (case_id, index.message)
