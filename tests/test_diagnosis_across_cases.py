"""Tie-order evidence gathered across a run (harness/diagnosis/across_cases.py, docs/diagnosis.md
"Evidence across a run"): cases that each hold a bit or two name a tie rule together once their
distinct tied rows pass the threshold; shared rows count once, a contradicting case withholds the
name, a single case behaves as alone; and the per-case records come from a real diagnosis."""

from __future__ import annotations

import pytest

from v41_conformance.diagnosis.across_cases import name_across_cases
from v41_conformance.diagnosis.variants import TIE_EVIDENCE_BITS

RULE = "topk-lowest-index-ties"


def case(case_id: str, rows: dict[str, float] | None = None, contradicts: bool = False) -> dict:
    diagnosis = {"tie_support": {RULE: rows} if rows else {}, "tie_contradicts": [RULE] if contradicts else []}
    return {"id": case_id, "status": "fail", "message": f"{case_id} failed", "diagnosis": diagnosis}


def test_seven_cases_of_a_bit_or_two_name_the_rule_together_and_each_case_says_so():
    cases = [case(f"indexer/c{i}", {f"row{i}a": 1.0, f"row{i}b": 0.5}) for i in range(7)]
    named = name_across_cases(cases)
    assert [n["variant"] for n in named] == [RULE] and named[0]["bits"] == pytest.approx(10.5)
    assert named[0]["rows"] == 14 and len(named[0]["cases"]) == 7
    for c in cases:
        assert c["diagnosis"]["run_level"]["variant"] == RULE
        assert "named from 7 cases of this run: 10.5 bits" in c["message"]


def test_rows_two_cases_share_count_once():
    shared = {"prefix-row1": 1.0, "prefix-row2": 1.0, "prefix-row3": 1.0}
    cases = [case("attention/s-a", shared), case("attention/s-b", dict(shared))]
    assert 2 * sum(shared.values()) >= TIE_EVIDENCE_BITS > sum(shared.values())  # counted twice it would name
    assert name_across_cases(cases) == []
    assert all("run_level" not in c["diagnosis"] and "run level" not in c["message"] for c in cases)
    cases.append(case("attention/s-c", {"own-row": 1.5}))
    assert name_across_cases(cases)[0]["bits"] == pytest.approx(4.5)


def test_a_case_the_rule_contradicts_withholds_the_name():
    cases = [case(f"indexer/c{i}", {f"r{i}": 2.0}) for i in range(4)] + [case("indexer/other", contradicts=True)]
    assert name_across_cases(cases) == []
    assert all("run_level" not in c["diagnosis"] for c in cases)


def test_one_case_is_judged_alone():
    cases = [case("indexer/only", {f"r{i}": 1.0 for i in range(8)})]  # 8 bits, but its own diagnosis decided
    assert name_across_cases(cases) == [] and "run_level" not in cases[0]["diagnosis"]


WEAK = (  # a tie order LowestIndexTies reproduces in each, on 1, 1.58 and 2 bits: unnamed alone
    "indexer.select/consumer-r1-prefill-s21-blocks2-top3",
    "indexer.select/ties-ninf-runs-r1-chunk-start12",
    "indexer/r2-prefill-s21-b2",
)


def test_a_run_of_three_weak_cases_names_the_tie_rule_and_a_run_of_one_does_not(tmp_path, monkeypatch):
    from conftest import results, run_cli

    monkeypatch.setenv("CONFORMANCE_DIAGNOSIS_BUDGET", "64")  # the suite turns it off (tests/conftest.py)
    impl = "tests/impls/wrong_indexer.py:LowestIndexTies"
    proc = run_cli("run", "--impl", impl, "--select", ",".join(WEAK), "--report-dir", str(tmp_path / "all"))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = results(tmp_path / "all")
    assert [n["variant"] for n in doc["run_diagnosis"]] == [RULE], doc["run_diagnosis"]
    assert doc["run_diagnosis"][0]["cases"] == sorted(WEAK) and doc["run_diagnosis"][0]["bits"] >= TIE_EVIDENCE_BITS
    for c in doc["cases"]:
        assert c["diagnosis"]["run_level"]["variant"] == RULE and "named from 3 cases of this run" in c["message"]
    assert f"diagnosis across 3 cases: [{RULE}]" in proc.stdout
    assert f"[{RULE}]" in (tmp_path / "all" / "summary.md").read_text()
    alone = run_cli("run", "--impl", impl, "--select", WEAK[2], "--report-dir", str(tmp_path / "one"))
    assert alone.returncode == 1 and results(tmp_path / "one")["run_diagnosis"] == []
    assert "run level" not in results(tmp_path / "one")["cases"][0]["message"]


def test_naming_again_over_a_merged_run_counts_each_case_once():
    """`conformance merge` names again over every shard's cases: a case a shard already named is not named
    twice, and its message keeps one run-level line."""
    cases = [case(f"indexer/c{i}", {f"r{i}": 1.5}) for i in range(3)]
    first = name_across_cases(cases)
    again = name_across_cases(cases)
    assert first == again and all(c["message"].count("diagnosis (run level)") == 1 for c in cases)
