"""`conformance fuzz`: bugs that every frozen golden misses are found on fresh cases, shrunk to a
small case, promoted to a golden, and then fail `conformance run`; the reference finds nothing."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from conftest import ROOT, make_project, results, run_cli
from v41_conformance.fuzz_sample import sample, selected_spaces

WRONG = f"{ROOT}/tests/impls/wrong_shapes.py"

# (implementation, component, cases to sample, what the shrunk case must show)
BUGS = [
    (
        "DropsLanesPastFourTiles",
        "sparse_attn",
        40,
        lambda b, p: b["k"] > 256 and b["shape"][0] * b["shape"][1] * b["shape"][2] == 1,
    ),
    ("WindowPositions16Bit", "window.indices", 60, lambda b, p: p["start"] >= 1 << 16),
    ("CompressorBatchOf3", "compressor", 40, lambda b, p: b["batch"] == 3),
]


@pytest.mark.parametrize("impl, component, cases, shrunk_ok", BUGS, ids=[b[0] for b in BUGS])
def test_a_shape_bug_is_found_shrunk_promoted_and_then_fails_run(tmp_path, impl, component, cases, shrunk_ok):
    project = make_project(tmp_path, [component], promoted=False)  # as before the fuzz found anything
    config = str(project / "conformance.yaml")
    frozen = run_cli(
        "run",
        "--impl",
        f"{WRONG}:{impl}",
        "--select",
        component,
        "--config",
        config,
        "--report-dir",
        str(tmp_path / "frozen"),
    )
    assert frozen.returncode == 0, frozen.stdout  # every frozen golden misses the bug

    report = tmp_path / "fuzz"
    proc = run_cli(
        "fuzz",
        "--impl",
        f"{WRONG}:{impl}",
        "--select",
        component,
        "--cases",
        str(cases),
        "--seed",
        "1",
        "--config",
        config,
        "--report-dir",
        str(report),
        "--promote",
        "--shrink-seconds",
        "60",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fuzz = results(report)["fuzz"]
    assert fuzz["components"][component]["failed"] >= 1
    failure = fuzz["failures"][0]
    shrunk = yaml.safe_load(failure["shrunk"]["entry"])["cases"][0]
    params, build = shrunk.get("params", {}), shrunk.get("build", {})
    assert shrunk_ok(build, params), shrunk
    assert failure["shrunk"]["steps"] >= 1  # smaller than what was first found
    assert "conformance fuzz" in failure["command"] and "--seed 1" in failure["command"]
    assert "shrunk in" in proc.stdout and failure["command"] in proc.stdout

    promoted = failure["promoted"]
    assert promoted and not promoted.startswith("not promoted"), promoted
    case_id = promoted.split(", ")[0]
    manifest = json.loads((project / "goldens" / "MANIFEST.json").read_text())
    assert case_id in manifest["cases"]
    again = run_cli(
        "run",
        "--impl",
        f"{WRONG}:{impl}",
        "--select",
        case_id,
        "--config",
        config,
        "--report-dir",
        str(tmp_path / "again"),
    )
    assert again.returncode == 1 and results(tmp_path / "again")["cases"][0]["status"] != "pass", again.stdout
    good = run_cli(
        "run", "--impl", "reference", "--select", case_id, "--config", config, "--report-dir", str(tmp_path / "good")
    )
    assert good.returncode == 0, good.stdout

    # the printed command re-creates the original failing case
    index = failure["command"].split("--index ")[1].split()[0]
    replay = run_cli(
        "fuzz",
        "--impl",
        f"{WRONG}:{impl}",
        "--select",
        component,
        "--seed",
        "1",
        "--index",
        index,
        "--config",
        config,
        "--report-dir",
        str(tmp_path / "replay"),
        "--shrink-seconds",
        "0",
    )
    replayed = results(tmp_path / "replay")["cases"]
    assert replay.returncode == 1 and [c["id"] for c in replayed] == [failure["id"]]


def test_the_reference_passes_fresh_cases_of_every_component(tmp_path):
    report = tmp_path / "fuzz"
    proc = run_cli(
        "fuzz", "--impl", "reference", "--cases", "45", "--seed", "3", "-n", "2", "--report-dir", str(report)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = results(report)
    from v41_conformance.known import components

    assert set(doc["fuzz"]["components"]) == set(components())
    assert all(c["tried"] >= 1 and c["failed"] == 0 and c["invalid"] == 0 for c in doc["fuzz"]["components"].values())
    assert doc["fuzz"]["seed"] == 3 and not doc["fuzz"]["failures"]
    assert "fuzz seed 3" in (report / "summary.md").read_text()


def test_the_same_seed_samples_the_same_cases_and_another_seed_others():
    chosen = selected_spaces([])

    def first(seed: int, count: int = 40):
        stream = sample(seed, chosen)
        return [(c.spec.id, c.entry.params, c.entry.build) for c in (next(stream) for _ in range(count))]

    assert first(5) == first(5)
    assert first(5) != first(6)
    ids = [case_id for case_id, _, _ in first(5, 60)]
    assert len(set(i.split("/")[0] for i in ids)) == len(chosen)  # the rotation reaches every component


def test_fuzz_usage_errors_name_the_problem(tmp_path):
    proc = run_cli("fuzz", "--impl", "reference", "--select", "no.such*", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "matches no component" in proc.stderr
    proc = run_cli("fuzz", "--impl", "reference", "--budget", "5", "--cases", "3", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "not both" in proc.stderr


# Fresh cases on which correct implementations that round differently once failed: a GEMM or dot
# product summed in another order landing on the other side of an intermediate bf16 rounding
# (indexer.scores, indexer.weights, kv.finish), a decode step's few flips as a share of its rows
# (compressor), an inv_freq a dozen ulps off carried into the table (rope.yarn_table).
ROUNDING_REGRESSIONS = [
    ("indexer.scores", 5, 142),
    ("indexer.scores", 5, 967),
    ("indexer.scores", 7, 2341),
    ("indexer.weights", 7, 1741),
    ("kv.finish", 5, 131),
    ("kv.finish", 7, 2474),
    ("kv.finish", 7, 3728),
    ("compressor", 8, 2368),
    ("rope.yarn_table", 8, 277),
]


def _gate_verdicts(cases):
    """(case id, gate, status, message) of both gates on the given (component, seed, index)s."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "impls"))
    from gate_float64 import Float64
    from gate_upstream import UpstreamTorch

    from v41_conformance.config import load_config
    from v41_conformance.fuzz_sample import draw
    from v41_conformance.generate import build_golden
    from v41_conformance.known import get
    from v41_conformance.runner import CaseResult, judge_golden
    from v41_conformance.spaces import spaces

    config = load_config(ROOT / "conformance.yaml")
    verdicts = []
    for component, seed, index in cases:
        case = draw(spaces()[component], seed, index)
        golden = build_golden(case.spec, config)
        for gate in (UpstreamTorch(), Float64()):
            result = CaseResult(case.spec.id, component, "error")
            judge_golden(get(component), golden, gate, config, {}, result)
            verdicts.append((case.spec.id, type(gate).__name__, result.status, result.message))
    return verdicts


def test_correct_implementations_that_round_differently_pass_fresh_cases():
    """The gates (upstream's torch arithmetic, float64) pass fresh cases of every component, and
    the fresh cases they once failed: fuzz must not report a correct kernel as failing."""
    from v41_conformance.known import components

    cases = [(name, 31, index) for name in sorted(components()) for index in range(8)] + ROUNDING_REGRESSIONS
    bad = [v for v in _gate_verdicts(cases) if v[2] not in ("pass", "unsupported")]
    assert not bad, "\n".join(f"{i} {g}: {s}: {m[:400]}" for i, g, s, m in bad)


def _forms_on_fresh_cases(component: str, seed: int, draws: int) -> list[tuple[str, str, str, str]]:
    """(case id, form, status, message) of every correct form that reaches `component` (the GPU models,
    the attention cores, the GEMM orders: tests/impls/correct_forms.py) on `draws` fresh cases."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "impls"))
    import correct_forms as forms

    from v41_conformance.config import load_config
    from v41_conformance.fuzz_sample import draw
    from v41_conformance.generate import build_golden
    from v41_conformance.known import get
    from v41_conformance.runner import CaseResult, judge_golden
    from v41_conformance.spaces import spaces

    config = load_config(ROOT / "conformance.yaml")
    verdicts = []
    for index in range(draws):
        case = draw(spaces()[component], seed, index)
        golden = build_golden(case.spec, config)
        for name in (*forms.GPU, *forms.CORES, *forms.ORDERS, *forms.PRECISE):
            if forms.reaches(name, component):
                result = CaseResult(case.spec.id, component, "error")
                judge_golden(get(component), golden, forms.MAKERS[name](), config, {}, result)
                verdicts.append((case.spec.id, name, result.status, result.message))
    return verdicts


# The fixed-seed smoke of `benchmarks/fuzz_gates.py --all` (docs/verdicts.md, "Gates"): every GPU model,
# attention core and GEMM order on fresh cases of the components they change most.
# (component, seed, draws); attention's seed 71 draws a prefill of 40 and a decode step at a fifth of the
# cost of seed 35's draw (16 forms run it).
FORM_SMOKE = [
    ("sparse_attn", 35, 4),
    ("attention", 71, 1),
    ("indexer", 35, 2),
    ("indexer.scores", 35, 3),
    ("linear.fp8", 35, 2),
    ("compressor", 35, 2),
    ("kv.finish", 35, 2),
    ("norm.rms", 35, 2),
]


@pytest.mark.parametrize("component, seed, draws", FORM_SMOKE, ids=[c for c, _, _ in FORM_SMOKE])
def test_every_correct_form_passes_fresh_cases(component, seed, draws):
    bad = [v for v in _forms_on_fresh_cases(component, seed, draws) if v[2] not in ("pass", "unsupported")]
    assert not bad, "\n".join(f"{i} {g}: {s}: {m[:400]}" for i, g, s, m in bad)


def test_accepted_intermediate_flips_are_counted():
    """An index score 2 ulp off where its largest head term allows it passes only through the term
    allowance, and its flip is counted. (Built, not drawn: which fresh case a gate flips depends on the
    CPU's bf16 kernels, AVX2 or AVX-512.)"""
    from v41_conformance.adapters.reference import ReferenceAdapter
    from v41_conformance.config import load_config
    from v41_conformance.fuzz_sample import draw
    from v41_conformance.generate import build_golden
    from v41_conformance.known import get
    from v41_conformance.runner import CaseResult, judge_golden
    from v41_conformance.spaces import spaces
    from v41_conformance.ulps import ulp_of

    config = load_config(ROOT / "conformance.yaml")
    golden = build_golden(draw(spaces()["indexer.scores"], 5, 142).spec, config)
    scores, terms = golden.outputs["scores"], golden.aux["term_scale"]
    room = (ulp_of(terms, torch.bfloat16) / ulp_of(scores, torch.bfloat16)).reshape(-1)
    room[~torch.isfinite(scores.reshape(-1)) | (scores.reshape(-1) == 0)] = 0
    at = int(room.argmax())
    assert float(room[at]) >= 1  # a head term at least as large as the score: 2 ulp of it are allowed
    moved = scores.clone().reshape(-1)
    moved[at] = (moved[at].double() + 2 * ulp_of(moved[at], torch.bfloat16)).to(torch.bfloat16)

    class TwoUlp(ReferenceAdapter):
        def run(self, component, inputs, params):
            return {"scores": moved.reshape(scores.shape)}

    result = CaseResult(golden.meta["case_id"], "indexer.scores", "error")
    judge_golden(get("indexer.scores"), golden, TwoUlp(), config, {}, result)
    assert result.status == "pass", result.message
    assert (
        "differ only at rounding boundaries (accepted by policy)" in result.message
        or "bf16-rounded term rounding the other way" in result.message
    ), result.message
    assert result.outputs["scores"]["boundary_flips"] == 1


def test_a_promoted_case_whose_present_row_cancels_to_zero_passes_the_correct_cores():
    """sparse_attn/fuzz-s1-182-m33 (cases/sparse_attn_fuzz.yaml) holds an exact 0 in a row with present
    lanes: a value, judged by the tolerance, not an absent-row marker. The fp32-P cores pass it; an
    implementation whose absent rows leak still fails the cases that have them."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "impls"))
    import correct_forms as forms
    from wrong_attention import NaNOnAbsentRows

    from v41_conformance.config import load_config
    from v41_conformance.golden import load_verified, read_manifest
    from v41_conformance.runner import run_case

    config = load_config(ROOT / "conformance.yaml")
    manifest = read_manifest(config.goldens)
    case = "sparse_attn/fuzz-s1-182-m33"
    golden = load_verified(config.goldens, case, manifest)
    present = (golden.inputs["topk_idxs"] != -1).any(-1)
    assert bool(((golden.outputs["o"] == 0) & present[..., None, None]).any())  # the accident is in the golden
    for name in forms.CORES:
        result = run_case(case, config, forms.MAKERS[name](), name, manifest)
        assert result.status == "pass", (name, result.message)
    leak = run_case("sparse_attn/all-absent-rows-m6-k70", config, NaNOnAbsentRows(), "nan", manifest)
    assert leak.status == "fail" and "absent rows (every lane of in.topk_idxs is -1)" in leak.message, leak.message
