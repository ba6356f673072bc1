"""Declining one output (v41_conformance.Declined, or the program's `declined` metadata): the case is judged
on the rest and reported `partial`, never as a pass of the declined output."""

from __future__ import annotations

import sys
import textwrap

from conftest import make_project, results, run_cli

from v41_conformance import Declined
from v41_conformance.adapters.reference import ReferenceAdapter


def declining(component: str, output: str, reason: str) -> type:
    """The reference, declining one output of one component."""

    class Declining(ReferenceAdapter):
        def run(self, name, inputs, params):
            out = super().run(name, inputs, params)
            if name == component:
                out[output] = Declined(reason)
            return out

    return Declining


IdsOnly = declining("indexer", "scores", "ids only: the scores are never materialised")  # never materialised
NoRowPositions = declining("compressor", "row_positions", "positions are implicit in our cache layout")
DeclinesTheRing = declining("compressor", "ring", "no state")  # state: never declinable


class IdsOnlyWrongIds(IdsOnly):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "indexer":
            out["ids"] = out["ids"].flip(-1).contiguous()
        return out


class DeclinesEverything(ReferenceAdapter):
    def run(self, component, inputs, params):
        return {name: Declined("not yet") for name in super().run(component, inputs, params)}


PROGRAM = textwrap.dedent('''
    import json, sys
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from v41_conformance.adapters.reference import ReferenceAdapter

    def run(component, inp, out):
        tensors = load_file(inp)
        with safe_open(inp, framework="pt") as f:
            params = json.loads(f.metadata()["params"])
        inputs = {k: v for k, v in tensors.items() if not k.startswith("param.")}
        result = ReferenceAdapter().run(component, inputs, params)
        del result["codes"]
        save_file(result, out, metadata={"declined": json.dumps({"codes": "we keep values only"})})

    if sys.argv[1] == "components":
        print("quant.fp4_e8m0")
    elif sys.argv[1] == "serve":
        for line in sys.stdin:
            _, component, inp, out = line.split()
            run(component, inp, out)
            print("ok", flush=True)
    else:
        run(*sys.argv[2:])
''')


def _run(tmp_path, impl: str, select: str, config=None):
    report = tmp_path / "rep"
    args = ["run", "--impl", impl, "--select", select, "--report-dir", str(report), "--no-isolate"]
    if config:
        args += ["--config", str(config)]
    return run_cli(*args), report


def test_a_declined_output_makes_the_case_partial_never_a_pass_of_it(tmp_path):
    proc, report = _run(tmp_path, f"{__file__}:IdsOnly", "indexer/r1-prefill-s21,indexer/r2-decode-*")
    assert proc.returncode == 0, proc.stdout
    doc = results(report)
    for case in doc["cases"]:
        assert case["status"] == "partial" and case["declined"] == ["scores"], case["message"]
        assert case["outputs"]["scores"] == {
            "ok": None,
            "declined": "ids only: the scores are never materialised",
            "policy": case["outputs"]["scores"]["policy"],
        }
        assert case["outputs"]["ids"]["ok"] is True
        assert case["message"].startswith("declined output(s), not judged: scores (ids only")
    assert doc["components"]["indexer"]["verdict"] == "partial" and doc["components"]["indexer"]["partial"] == 3
    assert "partial" in proc.stdout and "declined ['scores']" in proc.stdout
    assert "<system-out>declined output(s)" in (report / "junit.xml").read_text()


def test_the_rest_is_still_judged_and_a_case_declining_everything_is_unsupported(tmp_path):
    proc, report = _run(tmp_path, f"{__file__}:IdsOnlyWrongIds", "indexer/r1-prefill-s21")
    case = results(report)["cases"][0]
    assert proc.returncode == 1 and case["status"] == "fail" and case["outputs"]["ids"]["ok"] is False
    assert "declined output(s), not judged: scores" in case["message"]
    (tmp_path / "b").mkdir()
    proc, report = _run(tmp_path / "b", f"{__file__}:DeclinesEverything", "quant.e2m1/midpoints")
    case = results(report)["cases"][0]
    assert case["status"] == "unsupported" and "declined every output" in case["message"]


def test_a_program_declines_an_output_in_its_output_metadata(tmp_path):
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    project = make_project(tmp_path, ["quant.fp4_e8m0"])
    config = project / "conformance.yaml"
    config.write_text(
        config.read_text().replace(
            "impls:\n", f"impls:\n  values-only:\n    command: [{sys.executable}, {program}]\n    batch: true\n", 1
        )
    )
    proc, report = _run(tmp_path, "values-only", "quant.fp4_e8m0/*", config)
    doc = results(report)
    assert proc.returncode == 0, proc.stdout
    assert {c["status"] for c in doc["cases"]} == {"partial"}
    assert all(c["outputs"]["codes"]["declined"] == "we keep values only" for c in doc["cases"])
    assert all(c["outputs"]["y"]["ok"] and c["outputs"]["scale_bytes"]["ok"] for c in doc["cases"])


def test_a_stepped_component_declines_an_output_of_every_step_but_never_its_state(tmp_path):
    proc, report = _run(tmp_path, f"{__file__}:NoRowPositions", "compressor/r2-q6-p5-d4-rb2-d3")
    case = results(report)["cases"][0]
    assert proc.returncode == 0 and case["status"] == "partial", case["message"]
    assert case["declined"] == ["s00.row_positions", "s01.row_positions", "s02.row_positions"]
    assert all(m["ok"] for n, m in case["outputs"].items() if not n.endswith("row_positions"))
    (tmp_path / "b").mkdir()
    proc, report = _run(tmp_path / "b", f"{__file__}:DeclinesTheRing", "compressor/r2-q6-p5-d4-rb2-d3")
    case = results(report)["cases"][0]
    assert case["status"] == "error" and "state the next step needs, which cannot be declined" in case["message"]


def test_a_declined_output_is_neither_passed_nor_failed_in_any_count(tmp_path):
    """`outputs` and `outputs_failed` count the judged outputs only; the declined one is counted apart,
    and no report calls it failed (the console's, the page's output table, the step strip)."""
    proc, report = _run(tmp_path, f"{__file__}:IdsOnly", "indexer/r1-prefill-s21")
    case = results(report)["cases"][0]
    judged = [n for n, m in case["outputs"].items() if m["ok"] is not None]
    assert "scores" not in judged and len(case["outputs"]) == len(judged) + 1
    assert case["metrics"]["outputs"] == len(judged) and case["metrics"]["outputs_failed"] == 0
    assert case["metrics"]["outputs_declined"] == 1
    page = (report / "report.html").read_text()
    assert "<td>scores</td><td>declined</td>" in page
    (tmp_path / "b").mkdir()
    proc, report = _run(tmp_path / "b", f"{__file__}:IdsOnlyWrongIds", "indexer/r1-prefill-s21")
    case = results(report)["cases"][0]
    assert case["metrics"]["outputs"] == len(judged) and case["metrics"]["outputs_failed"] == 1
    from v41_conformance.report.pictures import step_cells
    from v41_conformance.report.text import failing_lines

    assert step_cells({"s00.a": {"ok": True}, "s00.b": {"ok": None}}) == {(0, None): True}
    assert not any("more failing output" in line for line in failing_lines(case, most=1))
