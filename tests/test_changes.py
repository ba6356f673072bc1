"""Reports for a kernel team's CI: `diff` against a baseline, `merge` of shards, the pictures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from conftest import ROOT, make_project, results, statuses
from v41_conformance.cli import main
from v41_conformance.config import load_config
from v41_conformance.report import render_summary
from v41_conformance.report.headroom import worst_per_output
from v41_conformance.report.pictures import step_cells
from v41_conformance.session import RunOptions
from v41_conformance.session import run as run_session

WRONG_SINK = f"{ROOT}/tests/impls/wrong_attention.py:SinkScaled"
FLOAT64 = f"{ROOT}/tests/impls/gate_float64.py:Float64"
SELECT = ["sparse_attn/*", "quant.e2m1/*", "compressor/r2-long-p3*"]


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def run_in_process(report_dir: Path, impl: str = "reference", select=SELECT, config: Path | None = None, **kw) -> dict:
    options = RunOptions(impl=impl, select=list(select), report_dir=report_dir, isolate=False, **kw)
    return run_session(load_config(config or ROOT / "conformance.yaml"), options)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A passing reference run, a run that breaks sparse_attn, and a correct run that rounds
    differently (float64), over the same cases."""
    base = tmp_path_factory.mktemp("runs")
    dirs = {"pass": base / "pass", "wrong": base / "wrong", "float64": base / "float64"}
    run_in_process(dirs["pass"])
    run_in_process(dirs["wrong"], WRONG_SINK)
    run_in_process(dirs["float64"], FLOAT64)
    return dirs


# --- diff ----------------------------------------------------------------------------------------


def test_diff_names_regressions_in_every_format_and_gates_on_them(runs):
    assert set(statuses(results(runs["pass"])).values()) == {"pass"}
    sparse = sorted(i for i, s in statuses(results(runs["wrong"])).items() if s != "pass")
    assert sparse and all(i.startswith("sparse_attn/") for i in sparse)
    code, text = cli("diff", str(runs["pass"]), str(runs["wrong"]))
    assert code == 1, text
    assert f"REGRESSED ({len(sparse)})" in text
    for case_id in sparse:
        assert f"{case_id}: pass -> fail" in text
    assert "output 'o': not close" in text  # why, in the implementation's terms
    assert "gates: regressions=1" in text

    code, markdown = cli("diff", str(runs["pass"]), str(runs["wrong"]), "--format", "markdown")
    assert code == 1 and f"**regressed** ({len(sparse)})" in markdown
    assert "| `sparse_attn` | " + str(len(sparse)) in markdown

    code, raw = cli("diff", str(runs["pass"] / "results.json"), str(runs["wrong"]), "--format", "json")
    doc = json.loads(raw)
    assert code == 1 and [e["id"] for e in doc["regressed"]] == sparse
    assert doc["components"]["sparse_attn"]["regressed"] == len(sparse)
    assert doc["components"]["quant.e2m1"]["regressed"] == 0 and not doc["fixed"] and not doc["new"]

    # the way back is a fix, and a run that still fails what failed before did not regress
    code, text = cli("diff", str(runs["wrong"]), str(runs["pass"]))
    assert code == 0 and f"FIXED ({len(sparse)})" in text
    code, text = cli("diff", str(runs["wrong"]), str(runs["wrong"]))
    assert code == 0 and f"{len(sparse)} still failing" in text
    code, _ = cli("diff", str(runs["wrong"]), str(runs["wrong"]), "--fail-on", "any")
    assert code == 1


def test_diff_shows_how_the_headroom_moved(runs):
    code, raw = cli("diff", str(runs["pass"]), str(runs["float64"]), "--format", "json")
    doc = json.loads(raw)
    assert code == 0 and not doc["regressed"]
    moved = {(h["output"], h["bound"]): h for h in doc["components"]["sparse_attn"]["headroom"]}
    float64 = results(runs["float64"])
    worst = max(
        m["bound_used"] for c in float64["cases"] if c["component"] == "sparse_attn" for m in c["outputs"].values()
    )
    assert moved[("o", "bound_used")]["before"] == 0.0
    assert moved[("o", "bound_used")]["after"] == pytest.approx(worst) and worst > 0
    code, text = cli("diff", str(runs["pass"]), str(runs["float64"]))
    assert f"sparse_attn o element bound 0.00 -> {worst:.2f} of the bound" in text


def test_a_regenerated_golden_is_reported_as_such_not_as_a_regression(runs, tmp_path):
    doc = results(runs["wrong"])
    changed = next(c for c in doc["cases"] if c["component"] == "sparse_attn")
    changed["golden_sha256"] = "f" * 64
    gone = doc["cases"].pop(next(i for i, c in enumerate(doc["cases"]) if c["component"] == "quant.e2m1"))
    (tmp_path / "results.json").write_text(json.dumps(doc))
    code, raw = cli("diff", str(runs["pass"]), str(tmp_path / "results.json"), "--format", "json")
    diff = json.loads(raw)
    assert [e["id"] for e in diff["golden_changed"]] == [changed["id"]]
    assert changed["id"] not in [e["id"] for e in diff["regressed"]]
    assert [e["id"] for e in diff["gone"]] == [gone["id"]]
    code, text = cli("diff", str(runs["pass"]), str(tmp_path / "results.json"))
    assert f"{changed['id']}: pass -> fail  (golden " in text and "judged as a new case" in text


def test_diff_says_when_the_two_runs_judged_different_golden_stores(runs, tmp_path):
    code, text = cli("diff", str(runs["pass"]), str(runs["float64"]))
    assert "WARNING" not in text and results(runs["pass"])["store"]["origin"] == "checkout"
    for field, value in (("manifest_sha256", "e" * 64), ("version", "0.0.9")):
        doc = results(runs["float64"])
        doc["store"] = {**doc["store"], "origin": "package", field: value}
        (tmp_path / "results.json").write_text(json.dumps(doc))
        code, text = cli("diff", str(runs["pass"]), str(tmp_path / "results.json"))
        assert "WARNING: the runs judged different golden stores: base checkout store of v41-conformance" in text
        assert ("manifest eeeeeeeeeeee" if field == "manifest_sha256" else "v41-conformance 0.0.9") in text
        code, raw = cli("diff", str(runs["pass"]), str(tmp_path / "results.json"), "--format", "markdown")
        assert "**Warning:** the runs judged different golden stores" in raw


def test_diff_of_a_missing_or_damaged_report_is_a_usage_error_naming_the_file(runs, tmp_path):
    code, text = cli("diff", str(tmp_path / "nowhere"), str(runs["pass"]))
    assert code == 2 and "nowhere/results.json not found" in text
    (tmp_path / "bad.json").write_text("{\"cases\": 3}")
    code, text = cli("diff", str(tmp_path / "bad.json"), str(runs["pass"]))
    assert code == 2 and "bad.json: not a conformance results document" in text
    (tmp_path / "junk.json").write_text("{")
    code, text = cli("diff", str(runs["pass"]), str(tmp_path / "junk.json"))
    assert code == 2 and "junk.json: not valid JSON" in text


def test_run_with_a_baseline_adds_the_changes_to_every_report(runs, tmp_path):
    report = tmp_path / "rep"
    doc = run_in_process(report, WRONG_SINK, baseline=runs["pass"])
    failing = sum(1 for c in doc["cases"] if c["status"] == "fail")
    assert doc["exit_code"] == 1 and len(doc["baseline"]["regressed"]) == failing > 0
    summary = (report / "summary.md").read_text()
    assert "### Changes since the baseline" in summary and f"**regressed** ({failing})" in summary
    html = (report / "report.html").read_text()
    assert "<section id='changes'>" in html and f"regressed ({failing})" in html
    # the baseline may be the report dir being rewritten: it is read before the run starts
    again = run_in_process(report, "reference", baseline=report)
    assert len(again["baseline"]["fixed"]) == failing


# --- merge ---------------------------------------------------------------------------------------

MERGED = ["quant.e2m1", "sparse_attn", "norm.rms"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> dict:
    """One full run of a small project and the same run cut three ways; floors: sparse_attn needs
    all 6 of its cases (no shard has them), quant.e2m1 asks for more cases than exist."""
    project = make_project(tmp_path_factory.mktemp("project"), MERGED)
    conf = yaml.safe_load((project / "conformance.yaml").read_text())
    conf["floors"] = {"sparse_attn": 6, "quant.e2m1": 99}
    (project / "conformance.yaml").write_text(yaml.safe_dump(conf))
    config = project / "conformance.yaml"
    whole = run_in_process(project / "reports" / "whole", select=[], config=config)
    shards = [project / "reports" / f"shard{i}" for i in (1, 2, 3)]
    for i, folder in enumerate(shards, 1):
        run_in_process(folder, select=[], config=config, shard=(i, 3))
    return {"project": project, "whole": whole, "shards": shards, "config": config}


def test_merge_of_three_shards_equals_the_unsharded_run_and_enforces_floors_on_the_union(sharded, tmp_path):
    shards, whole = sharded["shards"], sharded["whole"]
    parts = [results(s) for s in shards]
    assert all(p["components"][c]["floor_ok"] for p in parts for c in p["components"])  # no shard can tell
    assert sum(len(p["cases"]) for p in parts) == len(whole["cases"])
    out = tmp_path / "merged"
    code, text = cli("merge", str(out), *map(str, shards), "--config", str(sharded["config"]))
    merged = results(out)
    assert code == whole["exit_code"] == 1, text
    assert statuses(merged) == statuses(whole)
    assert {n: e["verdict"] for n, e in merged["components"].items()} == {
        n: e["verdict"] for n, e in whole["components"].items()
    }
    assert merged["components"]["sparse_attn"]["floor_ok"] and merged["components"]["sparse_attn"]["verdict"] == "pass"
    assert not merged["components"]["quant.e2m1"]["floor_ok"]
    assert any("quant.e2m1: ran" in p and "floor of 99" in p for p in merged["problems"])
    assert merged["problems"] == whole["problems"] and merged["floors_enforced"]
    assert [p["shard"] for p in merged["merged_from"]] == [[1, 3], [2, 3], [3, 3]]
    for name in ("summary.md", "junit.xml", "report.html"):
        assert (out / name).stat().st_size > 0
    assert "merged from 3 part(s)" in (out / "summary.md").read_text()


def test_merge_detects_a_missing_shard_a_duplicate_and_parts_of_other_runs(sharded, tmp_path):
    one, two, three = sharded["shards"]
    code, text = cli("merge", str(tmp_path / "m1"), str(one), str(three), "--config", str(sharded["config"]))
    merged = results(tmp_path / "m1")
    assert code == 1 and any("shard 2/3 is missing" in p for p in merged["problems"])
    assert not merged["floors_enforced"]  # a partial union cannot be held to the floors
    code, text = cli("merge", str(tmp_path / "m2"), str(one), str(two), str(three), str(one))
    problems = results(tmp_path / "m2")["problems"]
    assert code == 1 and any("shard 1/3 is given twice" in p for p in problems)
    code, text = cli("merge", str(tmp_path / "m3"), str(one), str(sharded["project"] / "reports" / "whole"))
    assert code == 1 and any("ran unsharded beside shards" in p for p in results(tmp_path / "m3")["problems"])
    code, text = cli("merge", str(tmp_path / "m4"), str(one), str(tmp_path / "nothing-here"))
    assert code == 2 and "nothing-here/results.json not found" in text


# --- pictures and the summary ---------------------------------------------------------------------


def _attrs(tag: str) -> dict[str, str]:
    return dict(re.findall(r"(data-[a-z]+)='([^']*)'", tag))


def test_headroom_bars_and_histograms_carry_the_numbers_of_results_json(runs):
    for name in ("wrong", "float64"):
        doc = results(runs[name])
        html = (runs[name] / "report.html").read_text()
        for component in ("sparse_attn", "compressor"):
            cases = [c for c in doc["cases"] if c["component"] == component]
            svg = re.search(rf"<svg class='headroom' data-component='{component}'.*?</svg>", html, re.S).group(0)
            bars = {a["data-output"]: a for a in map(_attrs, re.findall(r"<g class='bar'[^>]*>", svg))}
            worst = worst_per_output(cases)
            assert set(bars) == set(worst)
            for output, w in worst.items():
                assert float(bars[output]["data-value"]) == w.value
                assert (
                    bars[output]["data-ok"]
                    == str(all(m["ok"] for c in cases for n, m in c["outputs"].items() if n.endswith(output))).lower()
                )
    doc = results(runs["wrong"])
    html = (runs["wrong"] / "report.html").read_text()
    histograms = {
        (a["data-case"], a["data-output"]): a["data-counts"]
        for a in map(_attrs, re.findall(r"<svg class='histogram'[^>]*>", html))
    }
    failing = [(c["id"], n, m) for c in doc["cases"] for n, m in c["outputs"].items() if not m["ok"]]
    assert failing and set(histograms) == {(c, n) for c, n, _ in failing}
    for case_id, name, metrics in failing:
        counts = metrics["ulps_histogram"]["counts"]
        assert histograms[(case_id, name)] == ",".join(map(str, counts))
        assert 0 < sum(counts) <= metrics["numel"] and counts[0] < sum(counts)  # some elements erred


def test_the_step_strip_marks_the_first_divergent_step_and_layer(tmp_path):
    doc = run_in_process(
        tmp_path / "rep",
        f"{ROOT}/tests/impls/wrong_attention.py:WrongOffset",
        select=["attention/a-p5-d7-d9-d1x2-gen-upstream"],
    )
    case = doc["cases"][0]
    assert case["status"] == "fail"
    html = (tmp_path / "rep" / "report.html").read_text()
    strip = re.search(r"<svg class='steps'.*?</svg>", html, re.S).group(0)
    cells = [_attrs(t) for t in re.findall(r"<rect class='cell'[^>]*>", strip)]
    expected = step_cells(case["outputs"])
    assert len(cells) == len(expected)
    first = [c for c in cells if c["data-state"] == "first"]
    assert len(first) == 1 and int(first[0]["data-step"]) == case["first_divergent_step"]
    for cell in cells:
        ok = expected[(int(cell["data-step"]), int(cell["data-layer"]))]
        assert (cell["data-state"] == "pass") == ok
        if not ok and cell["data-state"] == "later":
            assert (int(cell["data-step"]), int(cell["data-layer"])) > (
                int(first[0]["data-step"]),
                int(first[0]["data-layer"]),
            )


def test_summary_stays_small_whatever_the_messages():
    message = "output 'o': not close " + "x" * 200_000 + "\n" + "|<>" * 50_000
    cases = [
        {
            "id": f"sparse_attn/case-{i:05d}",
            "component": "sparse_attn",
            "status": "fail",
            "message": message,
            "outputs": {"o": {"ok": False}},
        }
        for i in range(5000)
    ]
    doc = {
        "impl": "x" * 10_000,
        "impl_kind": "python",
        "device": "cpu",
        "exit_code": 1,
        "duration_s": 1.0,
        "versions": {"torch": "t", "harness": "h"},
        "cases": cases,
        "problems": ["p" * 100_000] * 100,
        "components": {f"c{i}": {"verdict": "fail", "cases": 1, "fail": 1} for i in range(200)},
    }
    doc["baseline"] = {
        "runs": {
            "base": {"impl": "b", "label": "l" * 5000, "cases": 1},
            "new": {"impl": "n", "label": "l", "cases": 1},
        },
        **{
            k: [
                {"id": c["id"], "component": "sparse_attn", "before": "pass", "after": "fail", "why": message}
                for c in cases
            ]
            for k in ("regressed", "fixed", "golden_changed", "new", "gone", "still_failing", "unjudged")
        },
        "component_regressions": [],
        "components": {},
        "gates": {"regressions": 1},
    }
    summary = render_summary(doc)
    assert len(summary.encode()) < 100 * 1024  # GitHub's step summary limit is 1 MiB
    assert "regressed" in summary and "did not pass" in summary


def test_zero_counts_are_dots_in_html_and_markdown(runs):
    html = (runs["wrong"] / "report.html").read_text()
    row = re.search(r"<tr><td><a href='#quant.e2m1'>.*?</tr>", html).group(0)
    assert "<td class='zero'>·</td>" in row and ">0<" not in row
    summary = (runs["wrong"] / "summary.md").read_text()
    line = next(l for l in summary.splitlines() if l.startswith("| `quant.e2m1`"))
    assert " 0 " not in line and "·" in line


def test_bound_used_is_the_fraction_of_the_element_bound_and_the_histogram_counts_every_element():
    import torch

    from v41_conformance.compare import compare_output
    from v41_conformance.policy import Policy

    expected = torch.tensor([1.0, 2.0, 4.0, 0.0], dtype=torch.float32)
    policy = Policy(kind="f32", ulps=4.0, rel_l2=1.0)
    ulp = torch.tensor([2.0**-23, 2.0**-22, 2.0**-21, 2.0**-149])
    near = compare_output("x", expected, expected + 2 * ulp * torch.tensor([1.0, 0, 0, 0]), policy)
    assert near.ok and near.metrics["bound_used"] == pytest.approx(0.5)
    over = compare_output("x", expected, expected + ulp * torch.tensor([0.0, 16, 2, 0]), policy)
    assert not over.ok and over.metrics["bound_used"] == pytest.approx(4.0)
    histogram = over.metrics["ulps_histogram"]
    assert sum(histogram["counts"]) == 4 and len(histogram["counts"]) == len(histogram["edges"]) + 1
    assert histogram["counts"][0] == 2  # two exact elements
    assert histogram["counts"][histogram["edges"].index(2.0)] == 1  # (1, 2] ulps
    assert histogram["counts"][histogram["edges"].index(16.0)] == 1  # (8, 16] ulps
