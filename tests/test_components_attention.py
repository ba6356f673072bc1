"""sparse_attn, attention and topology.validate through the runner: the reference passes, a plain
softmax passes, and each deliberate bug fails where it first matters (docs/attention.md)."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import ROOT, results, run_cli
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.compare import compare_output
from v41_conformance.config import load_config
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.reference.topology import validate_topology
from v41_conformance.known import get
from v41_conformance.runner import run_case
from impls.wrong_attention import OtherIndexKPolicy

CONFIG = load_config(ROOT / "conformance.yaml")
MANIFEST = read_manifest(CONFIG.goldens)
MINE = ("attention/", "sparse_attn/", "topology.validate/")
ATTENTION = sorted(c for c in MANIFEST if c.startswith("attention/"))
WRONG = f"{ROOT}/tests/impls/wrong_attention.py"
NAME_RE = re.compile(r"^s(\d\d)\.(?:l(\d)\.)?(\w+)$")


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    # The CLI runs the float64 reference GEMMs; on a loaded 2-core box two threads crawl.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def cli(tmp_path, impl: str, select: str) -> tuple[int, dict]:
    report = tmp_path / "rep"
    proc = run_cli("run", "--impl", impl, "--select", select, "--report-dir", str(report), "--no-isolate")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, results(report)


def failing(case: dict) -> list[tuple[int, int | None, str]]:
    """(step, layer or None, output) of every failing output of an attention case."""
    out = []
    for name, m in case["outputs"].items():
        if not m["ok"]:
            step, layer, base = NAME_RE.match(name).groups()
            out.append((int(step), None if layer is None else int(layer), base))
    return sorted(out, key=lambda t: (t[0], -1 if t[1] is None else t[1], t[2]))


# --- the reference and a plain softmax pass ---------------------------------------------------


def test_the_attention_path_has_its_cases():
    """The reference passes them: tests/test_cli_run.py (every golden), tests/test_chain.py (with
    every intermediate)."""
    ids = sorted(c for c in MANIFEST if c.startswith(MINE))
    assert len(ATTENTION) >= 4 and len(ids) >= 20


def test_plain_softmax_passes_sparse_attn_within_tolerance(tmp_path):
    """Its attention cases, fp8 included, are gates of tests/test_gates.py and tests/test_chain.py."""
    code, doc = cli(tmp_path, f"{WRONG}:PlainSoftmax", "sparse_attn*")
    assert code == 0 and {c["status"] for c in doc["cases"]} == {"pass"}
    for case in doc["cases"]:  # the tolerance did real work, with headroom left
        o = case["outputs"]["o"]
        assert o["max_ulps"] > 0 and o["rel_l2_headroom"] < 0.6, case["id"]


# --- sparse_attn bugs ------------------------------------------------------------------------


def test_sink_scaled_by_softmax_scale_fails_where_the_sink_matters(tmp_path):
    code, doc = cli(tmp_path, f"{WRONG}:SinkScaled", "sparse_attn*")
    assert code == 1
    status = {c["id"].split("/")[1]: c for c in doc["cases"]}
    for name in ("sink-extremes-h8-k24", "tiny-a-b2-m21-h4-k12"):
        assert status[name]["status"] == "fail" and "output 'o': not close" in status[name]["message"]
    # 150 unit-scale lanes swamp a unit sink: within the element-wise and rel L2 bounds there, but the
    # sink's shift against the logits moves o along do/dlog(scale): the logit-scale check finds it
    tiles = status["multi-tile-m8-k150"]
    assert tiles["status"] == "fail" and "the error is a scale of the logits" in tiles["message"]
    assert tiles["outputs"]["o"]["bound_used"] < 1 and tiles["outputs"]["o"]["rel_l2"] < 0.0078


def test_nan_on_all_absent_rows_fails_only_the_case_that_has_them(tmp_path):
    code, doc = cli(tmp_path, f"{WRONG}:NaNOnAbsentRows", "sparse_attn*")
    assert code == 1
    bad = {c["id"]: c for c in doc["cases"] if c["status"] != "pass"}
    assert list(bad) == ["sparse_attn/all-absent-rows-m6-k70"]
    assert "NaN positions differ" in bad["sparse_attn/all-absent-rows-m6-k70"]["message"]


def test_all_absent_rows_are_exactly_zero_in_the_golden():
    golden = load_verified(CONFIG.goldens, "sparse_attn/all-absent-rows-m6-k70", MANIFEST)
    absent = (golden.inputs["topk_idxs"] == -1).all(-1)  # [b, m]
    o = golden.outputs["o"]
    assert int(absent.sum()) == 2
    assert (o[absent] == 0).all() and not torch.isnan(o.float()).any()
    assert (o[~absent] != 0).any(-1).all()


# --- attention bugs, each at its first divergent step ----------------------------------------


def _verdicts(impl, case_id: str):
    result = run_case(case_id, CONFIG, impl, type(impl).__name__, MANIFEST)
    bad = [
        (int(step), None if layer is None else int(layer), base)
        for step, layer, base in (NAME_RE.match(n).groups() for n, m in result.outputs.items() if not m["ok"])
    ]
    return result, sorted(bad, key=lambda t: (t[0], -1 if t[1] is None else t[1], t[2]))


INDEX_SOURCES = {1, 3, 4, 6}  # config A
# One case per checkpoint and index-key policy: bf16 upstream, fp8 fixed (every case runs in test_chain).
TWO = ["attention/a-p21-d1x11-upstream", "attention/a-fp8-p21-d1x11-fixed"]


@pytest.mark.parametrize("case_id", TWO)
def test_compressed_ids_offset_by_the_chunk_length_fail_at_the_ids_from_the_first_decode_step(case_id):
    """With intermediates, exactly the index sources' ids fail (what follows is judged given
    them); without, the layers' outputs fail too."""
    from impls.gate import bare
    from impls.wrong_attention import WrongOffset

    result, bad = _verdicts(WrongOffset(), case_id)
    assert result.status == "fail" and result.first_divergent_step == 1, result.message
    assert {base for _, _, base in bad} == {"compressed_ids"} and {layer for _, layer, _ in bad} <= INDEX_SOURCES
    assert result.first_divergent_stage == "s01.l1.compressed_ids"
    result, bad = _verdicts(bare(WrongOffset)(), case_id)
    assert result.status == "fail" and result.first_divergent_step == 1
    assert (1, 1, "compressed_ids") in bad and all(layer not in (None, 0) for _, layer, _ in bad)


@pytest.mark.parametrize("case_id", TWO)
def test_reindex_layer_reading_its_own_empty_keys_fails_its_scores_at_prefill(case_id):
    from impls.gate import bare
    from impls.wrong_attention import OwnEmptyIndexKeys

    result, bad = _verdicts(OwnEmptyIndexKeys(), case_id)
    assert result.status == "fail" and result.first_divergent_step == 0
    assert result.first_divergent_stage == "s00.l6.index_scores" and {layer for _, layer, _ in bad} == {6}
    assert "judged given your index_q, index_k_seen" in result.message
    result, bad = _verdicts(bare(OwnEmptyIndexKeys)(), case_id)  # without its scores: a genuine miss
    assert (0, 6, "compressed_ids") in bad and {layer for _, layer, _ in bad} == {6}
    assert result.outputs["s00.l6.compressed_ids"]["rows_miss"] > 0
    assert "return s00.l6.index_scores" in result.message


@pytest.mark.parametrize("case_id", TWO)
def test_skipped_inverse_rope_fails_every_layer_at_o(case_id):
    from impls.gate import bare
    from impls.wrong_attention import NoInverseRope

    result, bad = _verdicts(NoInverseRope(), case_id)
    assert result.status == "fail" and result.first_divergent_step == 0
    assert {base for _, _, base in bad} == {"o"} and {layer for step, layer, _ in bad if step == 0} == set(range(8))
    result, bad = _verdicts(bare(NoInverseRope)(), case_id)
    assert {base for _, _, base in bad} == {"out"} and {layer for step, layer, _ in bad if step == 0} == set(range(8))


def test_the_other_index_k_policy_diverges_at_the_first_even_decode_step():
    for case_id, step in (
        ("attention/a-p21-d1x11-upstream", 2),
        ("attention/a-p21-d1x11-fixed", 2),
        ("attention/a-p5-d7-d9-d1x2-gen-upstream", 4),
    ):
        result = run_case(case_id, CONFIG, OtherIndexKPolicy(), "other-policy", MANIFEST)
        assert result.status == "fail" and result.first_divergent_step == step, (case_id, result.message)
        assert not result.outputs[f"s{step:02d}.published"]["ok"]
        layers = {n.split(".")[1] for n, m in result.outputs.items() if not m["ok"] and n.startswith(f"s{step:02d}.l")}
        assert layers <= {"l1", "l2", "l3"}, layers  # only the ratio-2 layers read index_k


# --- the interface: errors name the step and the layer --------------------------------------


class PublishesForeignSlot(ReferenceAdapter):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "attention" and params["layer"] == 2:
            out["rt.compress_kv"] = inputs["rt.compress_kv"]  # a Reuse layer publishes nothing
        return out


class ShrinksItsRing(ReferenceAdapter):
    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "attention" and "comp_ring" in out and params["step"] == 1:
            out["comp_ring"] = out["comp_ring"][:, :3]
        return out


def test_interface_errors_name_the_step_and_the_layer():
    case_id = "attention/a-p21-d1x11-fixed"
    result = run_case(case_id, CONFIG, PublishesForeignSlot(), "foreign-slot", MANIFEST)
    assert result.status == "error" and result.first_divergent_step == 0
    assert "layer 2 (Reuse, ratio 2)" in result.message and "unexpected ['rt.compress_kv']" in result.message
    result = run_case(case_id, CONFIG, ShrinksItsRing(), "small-ring", MANIFEST)
    assert result.status == "error" and result.first_divergent_step == 1
    assert "layer 1" in result.message and "comp_ring" in result.message and "layout" in result.message


# --- goldens: metadata, and chunked schedules equal the one-shot prefill -----------------------


def test_goldens_record_the_policy_and_the_schedule_kind():
    for case_id in ATTENTION:
        params = load_verified(CONFIG.goldens, case_id, MANIFEST).meta["params"]
        assert case_id.endswith("-" + params["index_k_policy"])
        assert params["generalisation"] == ("-gen-" in case_id)
        assert params["schedule_kind"].startswith("harness-generalisation" if params["generalisation"] else "upstream")
        assert params["config"]["compress_ratios"] == [0, 2, 2, 2, 1, 1, 1, 1]
    policies = {load_verified(CONFIG.goldens, c, MANIFEST).meta["params"]["index_k_policy"] for c in ATTENTION}
    assert policies == {"upstream", "fixed"}


def _by_position(outputs: dict, schedule, layer: int, name: str) -> torch.Tensor:
    return torch.cat([outputs[f"s{i:02d}.l{layer}.{name}"] for i in range(len(schedule))], dim=1)


def _selections(outputs: dict, aux: dict, schedule, layer: int, win: int) -> list:
    """Per position: (selected compressed rows per batch row, their scores over compressed rows)."""
    out = []
    for i, (start, end) in enumerate(schedule):
        S = end - start
        offset = S if start == 0 else (win if S == 1 else win + S)
        ids, scores = outputs[f"s{i:02d}.l{layer}.compressed_ids"], aux.get(f"s{i:02d}.l{layer}.scores")
        for t in range(S):
            rows = [sorted(int(v) - offset for v in ids[bi, t] if v >= 0) for bi in range(ids.shape[0])]
            out.append((rows, None if scores is None else scores[:, t, offset:].float()))
    return out


def _tie_only(a: list[int], b: list[int], scores: torch.Tensor) -> bool:
    """Both are top-k of `scores` and differ only in rows tied with the k-th score."""
    kth = scores[a].min()
    return len(a) == len(b) and bool((scores[list(set(a) ^ set(b))] == kth).all()) and bool(scores[b].min() == kth)


@pytest.mark.parametrize(
    "case_id,one_shot",
    [
        ("attention/a-p5-d7-d9-d1x2-gen-upstream", [[0, 21], [21, 22], [22, 23]]),
        ("attention/a-p21-d3-d4-d1x4-gen-fixed", [[0, 32]]),
        ("attention/a-p21-d1x11-fixed", [[0, 32]]),
    ],
)
def test_chunked_schedules_equal_the_one_shot_prefill(case_id, one_shot):
    """Ids and cache rows identical, out within tolerance, except where torch's top-k breaks a
    tie differently: its tie order depends on the row length T = end // r (docs/attention.md)."""
    component = get("attention")
    golden = load_verified(CONFIG.goldens, case_id, MANIFEST)
    params, schedule = golden.meta["params"], golden.meta["params"]["schedule"]
    win = params["config"]["window_size"]
    ref = component.execute(component.reference, dict(golden.inputs), {**params, "schedule": one_shot})
    policy = CONFIG.policy(component, "s00.l0.out")
    for layer, ratio in enumerate(params["config"]["compress_ratios"]):
        mine, theirs = _by_position(golden.outputs, schedule, layer, "out"), _by_position(ref, one_shot, layer, "out")
        keep = torch.ones(mine.shape[1], dtype=torch.bool)
        if ratio:
            pairs = zip(
                _selections(golden.outputs, golden.aux, schedule, layer, win),
                _selections(ref, {}, one_shot, layer, win),
            )
            for pos, ((a, scores), (b, _)) in enumerate(pairs):
                if a != b:
                    assert all(_tie_only(x, y, s) for x, y, s in zip(a, b, scores)), (layer, pos, a, b)
                    keep[pos] = False
            assert keep.float().mean() > 0.9, layer
        verdict = compare_output("out", theirs[:, keep], mine[:, keep], policy)
        assert verdict.ok, (layer, verdict.message)
        assert verdict.metrics["rel_l2"] < 0.1 * policy.rel_l2, (layer, verdict.metrics)  # a few ulps, no more
        for name in ("compress_rows", "index_k_rows"):
            if f"s00.l{layer}.{name}" in golden.outputs:
                a = _by_position(golden.outputs, schedule, layer, name)
                assert torch.equal(a, _by_position(ref, one_shot, layer, name)), (layer, name)


# --- topology.validate --------------------------------------------------------------------------


def test_topology_example_is_accepted_and_rejections_name_the_layer_and_both_sources():
    assert validate_topology([0, 0, 0, 0], [0, 0, 2, 2], [0, 1, 2, 3]).accepted
    verdict = validate_topology([0, 0, 0, 0], [0, 0, 2, 2], [0, 1, 1, 3])
    assert not verdict.accepted
    assert re.search(r"layer 2: index source 1 .* index-K source is 2", verdict.message)
    verdict = validate_topology([0, 0, 2, 0], [0, 0, 2, 2], [0, 1, 2, 3])
    assert not verdict.accepted and "layer 3: main-KV source 0 is shadowed by layer 2" in verdict.message
    for case_id in sorted(c for c in MANIFEST if c.startswith("topology.validate/")):
        golden = load_verified(CONFIG.goldens, case_id, MANIFEST)
        rejected = case_id.split("/")[1].startswith("reject-")
        assert bool(golden.outputs["accepted"]) is not rejected, case_id
        message = golden.meta["build"]["expected_message"]
        assert message.startswith("ok:") is not rejected, (case_id, message)
        if rejected and "entries" not in message:
            assert re.match(r"layer \d+: ", message), message
        if "lies in" in message:  # a refinement failure names the layer and both sources
            assert len(re.findall(r"\d+", message.split(";")[0])) >= 3, message


def test_a_tie_between_candidate_blocks_follows_the_blocks_verdict_as_in_candidates_select():
    """a-p21-d1x11-upstream s00.l4, query row 11: blocks 0 and 4 share the maximum 1.3984375 and a
    port keeping the lower id keeps the other one. The mask is judged as candidates.select judges
    it: its kept blocks as an index output (tie order: counted, fails unless accept_ties), then the
    mask given those blocks (exactly their rows)."""
    from impls.wrong_indexer import LowestIndexBlockTies

    case_id = "attention/a-p21-d1x11-upstream"
    strict = run_case(case_id, CONFIG, LowestIndexBlockTies(), "block-ties", MANIFEST)
    blocks = strict.outputs["s00.l4.candidate_blocks"]
    assert strict.status == "fail" and strict.first_divergent_stage == "s00.l4.candidate_blocks", strict.message
    assert blocks["rows_tie"] == 1 and blocks["rows_miss"] == 0 and not blocks["ok"]
    mask = strict.outputs["s00.l4.candidates"]
    assert mask["ok"] and mask["given"] == ["candidate_blocks"]
    assert "row (0, 11): k-th reference score 1.3984375" in strict.message
    lenient = run_case(case_id, CONFIG, LowestIndexBlockTies(), "block-ties", MANIFEST, {"accept_ties": True})
    assert lenient.status == "pass" and lenient.tie_rows == strict.tie_rows >= 1, lenient.message
