"""Indexer, candidate, window and address components: lab 27's figures, what the goldens hold,
and wrong implementations through the real CLI (tests/impls/wrong_indexer.py)."""

from __future__ import annotations

import re

import itertools
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import ROOT, make_project, results, run_cli
from v41_conformance.index_verdict import classify_index_rows
from v41_conformance.reference.topk import uses_partial_sort
from v41_conformance.known import get

WRONG = f"{ROOT}/tests/impls/wrong_indexer.py"
OURS = [
    "indexer.weights",
    "indexer.scores",
    "indexer.select",
    "indexer",
    "candidates.select",
    "candidates.restore",
    "window.indices",
    "address.prefill",
    "address.decode",
]
SELECTING = ["indexer.select", "indexer"]
INF = float("inf")
BF = torch.bfloat16


def golden(case_id: str) -> dict[str, torch.Tensor]:
    manifest = json.loads((ROOT / "goldens" / "MANIFEST.json").read_text())
    return load_file(ROOT / "goldens" / manifest["cases"][case_id]["file"])


def golden_ids(component: str) -> list[str]:
    manifest = json.loads((ROOT / "goldens" / "MANIFEST.json").read_text())
    return sorted(c for c in manifest["cases"] if c.split("/")[0] == component)


def params_of(case_id: str) -> dict:
    manifest = json.loads((ROOT / "goldens" / "MANIFEST.json").read_text())
    path = ROOT / "goldens" / manifest["cases"][case_id]["file"]
    header = json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])
    return json.loads(header["__metadata__"]["conformance"])["params"]


def call(component: str, params: dict, **inputs) -> dict[str, torch.Tensor]:
    return get(component).execute(get(component).reference, inputs, params)


def lowest_index_ids(masked: torch.Tensor, k: int, offset: int) -> torch.Tensor:
    """Top-k rows of masked scores [b, S, T], ties to the lowest index, ascending, + offset."""
    order = torch.sort(masked.float(), dim=-1, descending=True, stable=True).indices[..., :k]
    return order.sort(dim=-1).values + offset


# ------------------------------------------------------------------ lab 27, every figure


def test_lab27_scores_and_head_weights():
    w = call(
        "indexer.weights",
        {"index_head_dim": 2},
        x=torch.tensor([[[1.0]]], dtype=BF),
        weights_proj=torch.tensor([[2.0], [4.0]], dtype=BF),
    )["weights"]
    assert w.flatten().tolist() == [1.0, 2.0]  # weights 1 and 2 after the 2^-0.5 * 2^-0.5 multiplier
    q = torch.tensor([[[[1, 0], [0, 1]]]], dtype=BF)
    k = torch.tensor([[[2, 0], [0, 3], [1, 1], [-1, -1], [0, 150]]], dtype=BF)
    scores = call("indexer.scores", {}, q=q, k=k, w=w)["scores"]
    assert scores.flatten().tolist() == [2, 6, 3, 0, 300]  # "Scores: [2, 6, 3, 0, 300]"
    assert golden("indexer.scores/lab27-two-heads")["out.scores"].flatten().tolist() == [2, 6, 3, 0, 300]


def test_lab27_valid_prefix_top2_and_one_valid_row():
    scores = torch.tensor([[[2, 6, 3, 0, 300]]], dtype=BF)
    everyone = torch.ones(1, 1, 5, dtype=torch.bool)
    params = {"start": 3, "ratio": 1, "index_topk": 2, "offset": 0}  # (3 + 1) // 1 = valid prefix 4
    ids = call("indexer.select", params, scores=scores, candidates=everyone)["ids"]
    assert ids.tolist() == [[[1, 2]]]  # "Top-2 over valid rows: [1, 2]", not 4
    best = max(itertools.combinations(range(4), 2), key=lambda p: sum(scores[0, 0, list(p)].tolist()))
    assert list(best) == [1, 2]  # the lab checks the total score against all pairs of valid rows
    one = call(
        "indexer.select",
        {"start": 0, "ratio": 1, "index_topk": 3, "offset": 0},
        scores=torch.tensor([[[5, 9, 7]]], dtype=BF),
        candidates=torch.ones(1, 1, 3, dtype=torch.bool),
    )
    assert one["ids"].tolist() == [[[0, -1, -1]]]  # "One valid row, three output slots"
    assert golden("indexer.select/lab27-prefix4-top2")["out.ids"].tolist() == [[[1, 2]]]
    assert golden("indexer.select/lab27-one-valid-row-three-slots")["out.ids"].tolist() == [[[0, -1, -1]]]


def test_lab27_candidate_block_changes_token_topk():
    logits = torch.tensor([[[2, 6, 3, 0, -INF]]], dtype=BF)
    aux = get("candidates.select").aux
    unpinned = {"logits": logits, "compress_lens": torch.tensor([0])}  # the lab ranks without the pin
    out = call("candidates.select", {"topk_blocks": 1, "block_size": 2}, **unpinned)
    ranked = aux(unpinned, {"topk_blocks": 1, "block_size": 2}, out)["ranked_scores"]
    assert ranked.flatten().tolist()[:2] == [6, 3]  # "Candidate block scores: [6, 3]"
    assert out["blocks"].flatten().tolist()[0] == 0  # "retained block: 0"
    restricted = call(
        "indexer.select",
        {"start": 3, "ratio": 1, "index_topk": 2, "offset": 0},
        scores=torch.tensor([[[2, 6, 3, 0, 300]]], dtype=BF),
        candidates=out["mask"],
    )
    assert restricted["ids"].tolist() == [[[0, 1]]]  # "Top-2 within retained block: [0, 1]"
    assert golden("indexer.select/lab27-candidates-block0-top2")["out.ids"].tolist() == [[[0, 1]]]
    # Upstream pins the block holding the newest reachable row (row 3 -> block 1) instead.
    pinned = call(
        "candidates.select", {"topk_blocks": 1, "block_size": 2}, logits=logits, compress_lens=torch.tensor([4])
    )
    assert pinned["mask"].flatten().tolist() == [False, False, True, True, False]
    assert golden("candidates.select/lab27-pinned-top1")["out.blocks"].flatten().tolist() == [1, -1, -1]


def test_lab27_addresses():
    ids = torch.tensor([[[1, 2]]], dtype=torch.int32)
    assert call("address.prefill", {"base": 10}, ids=ids)["ids"].tolist() == [[[11, 12]]]
    slots = call(
        "address.decode",
        {"block_size": 8, "ratio": 2},
        ids=torch.tensor([[[1, 2, 4, -1]]], dtype=torch.int32),
        block_table=torch.tensor([[7, 2]], dtype=torch.int32),
    )["slots"]
    assert slots.tolist() == [[[29, 30, 8, -1]]]
    assert golden("address.decode/lab27-b8-r2")["out.slots"].tolist() == [[[29, 30, 8, -1]]]
    assert golden("address.prefill/lab27-base10")["out.ids"].tolist() == [[[11, 12]]]


def test_window_ids_by_hand_and_restore_examples():
    def window(**p):
        return call("window.indices", p)["ids"].tolist()

    assert window(mode="prefill", seqlen=3, win=2) == [[0, -1], [0, 1], [1, 2]]
    assert window(mode="decode", start=2, win=4) == [[-1, 0, 1, 2]]
    assert window(mode="decode", start=5, win=4) == [[2, 3, 0, 1]]
    assert window(mode="decode", start=8, win=8) == [[1, 2, 3, 4, 5, 6, 7, 0]]
    assert golden("candidates.restore/lab-mask-form")["out.ids"].tolist() == [[[0, 1, 5, -1]]]
    assert golden("candidates.restore/lab-block-form")["out.ids"].tolist() == [[[4, 1]]]


# ------------------------------------------------------------------ what the goldens hold


def test_selection_goldens_are_top_k_of_their_masked_scores():
    """Independent check of every indexer.select / indexer golden: ids ascending + offset, then
    -1; no chosen reachable score below an unchosen one; nothing past the valid prefix."""
    for component in SELECTING:
        for case_id in golden_ids(component):
            g, p = golden(case_id), params_of(case_id)
            masked, ids, off = g["aux.masked_scores"].float(), g["out.ids"].long(), int(p["offset"])
            S = masked.shape[1]
            lens = torch.div(torch.arange(p["start"] + 1, p["start"] + S + 1), p["ratio"], rounding_mode="floor")
            for (bi, s), row in zip(itertools.product(range(ids.shape[0]), range(S)), ids.reshape(-1, ids.shape[-1])):
                valid = row[row >= 0] - off
                n = len(valid)
                assert row[:n].tolist() == sorted(row[:n].tolist()) and (row[n:] == -1).all(), case_id
                assert (valid < lens[s]).all(), (case_id, bi, s)
                chosen = masked[bi, s, valid]
                rest = torch.ones(masked.shape[-1], dtype=torch.bool)
                rest[valid] = False
                if n and rest.any():
                    assert chosen.min() >= masked[bi, s, rest].max(), (case_id, bi, s)


def test_goldens_cover_ties_widths_branches_and_the_leak():
    tied = {c: _expected_tie_rows(c) for c in golden_ids("indexer.select") if "leak-upstream" not in c}
    assert sum(tied.values()) >= 40 and sum(1 for n in tied.values() if n) >= 8, tied  # tie-dense
    for case_id in (
        "ties-all-equal-r1-prefill-s24",
        "ties-bf16-levels-r1-chunk-start36",
        "ties-relu-zeros-r2-chunk-start48",
        "ties-ninf-runs-r1-chunk-start12",
        "production-r2-top512-of-16384",
        "partial-sort-top512-of-32768",
    ):
        assert tied[f"indexer.select/{case_id}"] > 0, case_id
    prod = golden("indexer.select/production-r1-top512-of-16384")
    assert prod["out.ids"].shape[-1] == 512 and prod["in.scores"].shape[-1] == 16384
    assert not uses_partial_sort(16384, 512) and uses_partial_sort(32768, 512)
    assert golden("indexer.select/partial-sort-top512-of-32768")["in.scores"].shape[-1] == 32768
    assert uses_partial_sort(300, 2) and uses_partial_sort(150, 2)
    cand = golden("candidates.select/production-2048-of-2050-blocks-b8")
    kept = (cand["out.blocks"] >= 0).sum(-1)
    assert cand["out.blocks"].shape[-1] == 2050 and kept.tolist() == [[2048, 2048]]
    assert cand["out.blocks"][0, 1].max() == 2049  # the one-row newest block, kept by the pin
    for component in SELECTING:
        up = golden(f"{component}/leak-upstream-r1-prefill-s21-blocks2-top1")
        picked = up["aux.masked_scores"].gather(-1, (up["out.ids"].long() - 21).clamp(min=0))
        leaked = (up["out.ids"] >= 0) & torch.isinf(picked)
        assert leaked.any(), component  # reachable non-candidate rows come back valid
        drop = golden(f"{component}/leak-drop-r1-prefill-s21-blocks2-top1")
        scores = drop["aux.masked_scores"].gather(-1, (drop["out.ids"].long() - 21).clamp(min=0))
        assert not ((drop["out.ids"] >= 0) & torch.isinf(scores)).any(), component
        assert params_of(f"{component}/leak-upstream-r1-prefill-s21-blocks2-top1")["candidate_leak"] == "upstream"
        assert params_of(f"{component}/leak-drop-r1-prefill-s21-blocks2-top1")["candidate_leak"] == "drop"


def test_golden_folders_stay_small():
    size = sum(f.stat().st_size for c in OURS for f in (ROOT / "goldens" / c).glob("*.safetensors"))
    assert size < 2_000_000, size


# ------------------------------------------------------------------ through the real CLI


def _run(tmp_path: Path, impl: str, select: list[str], config: Path | None = None) -> tuple[int, dict]:
    report = tmp_path / f"rep-{impl.rsplit(':', 1)[-1]}"
    args = ["run", "--impl", impl, "--select", ",".join(select), "--report-dir", str(report), "--no-isolate"]
    if config is not None:
        args += ["--config", str(config)]
    proc = run_cli(*args)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, results(report)


def _by_id(doc: dict) -> dict[str, dict]:
    return {c["id"]: c for c in doc["cases"]}


def test_float64_weights_and_scores_pass_with_the_reference_for_the_rest(tmp_path):
    # (the reference itself passes every golden: tests/test_cli_run.py)
    code, doc = _run(tmp_path, f"{WRONG}:Float64Indexer", OURS)
    assert code == 0 and all(c["status"] == "pass" for c in doc["cases"]), doc["problems"]
    assert {c["component"] for c in doc["cases"]} == set(OURS)


def test_valid_prefix_off_by_one_is_a_miss_naming_row_and_id(tmp_path):
    code, doc = _run(tmp_path, f"{WRONG}:PrefixOffByOne", SELECTING)
    assert code == 1
    cases = _by_id(doc)
    lab = cases["indexer.select/lab27-prefix4-top2"]
    assert lab["status"] == "fail" and lab["outputs"]["ids"]["rows_miss"] == 1
    # Query row (0, 0) now sees row 4 (score 300, -inf in the reference's masked scores).
    assert "row (0, 0)" in lab["message"] and "only in actual (id, score):   [(4, None)]" in lab["message"]
    assert "id out of range" in lab["message"]  # row 4 lies past the query's valid prefix
    assert "only in expected (id, score): [(2, 3.0)]" in lab["message"]
    assert cases["indexer.select/r1-prefill-s16-future-large"]["status"] == "fail"
    assert cases["indexer/r1-prefill-s21"]["status"] == "fail"
    # the extra id lies past the query's valid prefix: out of range, not merely an extra id
    assert "id out of range (out_of_range)" in cases["indexer/r1-prefill-s21"]["message"]
    # decode at ratio 1 with a buffer of exactly the written rows: nothing past T to see
    assert cases["indexer/r1-decode-start25"]["status"] == "pass"


def test_selection_over_the_whole_buffer_misses_valid_rows(tmp_path):
    code, doc = _run(tmp_path, f"{WRONG}:WholeBufferSelect", SELECTING)
    assert code == 1
    cases = _by_id(doc)
    lab = cases["indexer.select/lab27-prefix4-top2"]
    assert lab["status"] == "fail" and "-1 where the reference has a valid id (missing_id)" in lab["message"]
    assert "expected ids: [1, 2]" in lab["message"] and "actual ids:   [1, -1]" in lab["message"]
    for case_id in (
        "indexer.select/r1-prefill-s16-future-large",
        "indexer.select/r1-decode-start40-buffer48",
        "indexer/r1-prefill-s21",
        "indexer/r2-prefill-s21-b2",
    ):
        assert cases[case_id]["status"] == "fail" and cases[case_id]["outputs"]["ids"]["rows_miss"] > 0, case_id
    for case_id in ("indexer/r1-decode-start25", "indexer/r2-decode-start26-even"):  # T == prefix at decode
        assert cases[case_id]["status"] == "pass", case_id


def _expected_tie_rows(case_id: str) -> int:
    """Rows whose reference ids differ from a lowest-index selection of the same masked scores."""
    g, p = golden(case_id), params_of(case_id)
    masked, ids, off = g["aux.masked_scores"], g["out.ids"], int(p["offset"])
    S = masked.shape[1]
    lens = torch.div(torch.arange(p["start"] + 1, p["start"] + S + 1), p["ratio"], rounding_mode="floor")
    low = lowest_index_ids(masked, ids.shape[-1], off)
    low = torch.where(low - off < lens[:, None], low, -1)
    if p.get("candidate_leak") == "drop":  # non-candidate rows are never returned
        low = torch.where(g["in.candidates"].gather(-1, (low - off).clamp(min=0)), low, -1)
    low = torch.where(low < 0, torch.iinfo(torch.int64).max, low).sort(-1).values
    low = torch.where(low == torch.iinfo(torch.int64).max, -1, low)
    verdict = classify_index_rows(
        ids, low, masked, offset=off, order="set", id_limit=g["aux.id_limit"], fill_is_worst=True
    )
    assert verdict.miss == 0, case_id
    return verdict.tie


def test_lowest_index_ties_are_tie_order_only_and_accepted_when_the_impl_opts_in(tmp_path):
    code, doc = _run(tmp_path, f"{WRONG}:LowestIndexTies", SELECTING)
    assert code == 1
    expected_any = 0
    for case_id, case in _by_id(doc).items():
        ids = case["outputs"]["ids"]
        want = _expected_tie_rows(case_id)
        expected_any += want > 0
        assert (ids["rows_tie"], ids["rows_miss"]) == (want, 0), case_id
        assert case["status"] == ("fail" if want else "pass"), case_id
        if want:
            assert (
                re.search(r"tie order only, (0 near tie, )?0 miss", case["message"])
                and "first tie-order row:\n  row (" in case["message"]
            )
            assert (
                "the selected values are the reference's" in case["message"] and "accept_ties: true" in case["message"]
            )
    assert expected_any >= 8
    # The same implementation with accept_ties: true in its conformance.yaml entry passes.
    (tmp_path / "p").mkdir()
    project = make_project(tmp_path / "p", SELECTING)
    conf = yaml.safe_load((project / "conformance.yaml").read_text())
    conf["impls"] = {"cuda-like-ties": {"python": f"{WRONG}:LowestIndexTies", "accept_ties": True}}
    (project / "conformance.yaml").write_text(yaml.safe_dump(conf))
    code, doc = _run(tmp_path, "cuda-like-ties", SELECTING, project / "conformance.yaml")
    statuses = {c["id"]: c["status"] for c in doc["cases"]}
    assert all(s == "pass" for s in statuses.values()), statuses
    tied = [c for c in doc["cases"] if c["tie_rows"]]
    assert tied and all("differ only in tie order (accepted by policy)" in c["message"] for c in tied)


def test_leak_rows_differ_only_at_minus_inf_ties():
    """Under the upstream leak policy top-k must fill lanes from -inf entries; torch's order took
    unreachable rows (-> -1) where a lowest-index top-k takes reachable non-candidate rows (valid
    ids). With `fill_is_worst` (a -1 lane is a pick at -inf) and the per-query id limit, those
    rows are tie order; without them the valid counts differ and the rows would be misses."""
    for component in SELECTING:
        case_id = f"{component}/leak-upstream-r1-prefill-s21-blocks2-top1"
        g, p = golden(case_id), params_of(case_id)
        masked, ids, off = g["aux.masked_scores"].float(), g["out.ids"].long(), int(p["offset"])
        lens = torch.arange(1, masked.shape[1] + 1)
        low = lowest_index_ids(masked, ids.shape[-1], off)
        low = torch.where(low - off < lens[:, None], low, -1)
        naive = classify_index_rows(ids, low, masked, offset=off, order="set")
        assert naive.miss > 0
        verdict = classify_index_rows(
            ids, low, masked, offset=off, order="set", id_limit=g["aux.id_limit"], fill_is_worst=True
        )
        assert verdict.miss == 0 and verdict.tie == naive.miss + naive.tie, case_id
        # a valid id at or past the query's limit (an unreachable row) stays a miss
        beyond = low.clone()
        row = int(verdict.tie_rows[0])
        beyond[0, row, -1] = int(g["aux.id_limit"][0, row])
        assert (
            classify_index_rows(
                ids, beyond, masked, offset=off, order="set", id_limit=g["aux.id_limit"], fill_is_worst=True
            ).violations["out_of_range"]
            >= 1
        )


def test_a_mask_follows_its_blocks_so_tie_order_in_the_kept_blocks_is_one_accepted_difference(tmp_path):
    """The mask is the rows of the kept blocks: where the blocks differ only in tie order, the mask
    is judged given them and passes; the case fails at blocks alone, and passes with accept_ties."""
    code, doc = _run(tmp_path, f"{WRONG}:LowestIndexTies", ["candidates.select"])
    tied = [c for c in doc["cases"] if c["outputs"]["blocks"].get("rows_tie")]
    assert code == 1 and len(tied) >= 3
    for case in tied:
        blocks, mask = case["outputs"]["blocks"], case["outputs"]["mask"]
        assert case["status"] == "fail" and blocks["rows_miss"] == 0 and not blocks["ok"]
        assert mask["ok"] and mask["given"] == ["blocks"] and mask["rederived_rows"] > 0, case["id"]
        assert case["first_divergent_stage"] == "blocks"
    (tmp_path / "p").mkdir()
    project = make_project(tmp_path / "p", ["candidates.select"])
    conf = yaml.safe_load((project / "conformance.yaml").read_text())
    conf["impls"] = {"cuda-like-ties": {"python": f"{WRONG}:LowestIndexTies", "accept_ties": True}}
    (project / "conformance.yaml").write_text(yaml.safe_dump(conf))
    code, doc = _run(tmp_path, "cuda-like-ties", ["candidates.select"], project / "conformance.yaml")
    assert code == 0 and {c["status"] for c in doc["cases"]} == {"pass"}
    # a mask that is not whole blocks still fails: its blocks (first rows) are exact, it is not their rows
    code, doc = _run(tmp_path, f"{WRONG}:PartialBlockMask", ["candidates.select"])
    assert code == 1 and all(c["status"] == "fail" for c in doc["cases"])
    for case in doc["cases"]:
        assert case["outputs"]["blocks"]["ok"] and not case["outputs"]["mask"]["ok"], case["id"]
        assert case["outputs"]["mask"]["given"] == ["blocks"] and "output 'mask'" in case["message"]


def test_the_other_leak_policy_is_a_named_miss_that_accept_ties_does_not_rescue(tmp_path):
    """Leak versus drop is a policy, not an order: a port that drops where the case leaks (or leaks
    where it drops) fails those rows as misses naming the policy, even with accept_ties: true."""
    project = make_project(tmp_path, SELECTING)
    conf = yaml.safe_load((project / "conformance.yaml").read_text())
    conf["impls"] = {"other-policy": {"python": f"{WRONG}:OtherLeakPolicy", "accept_ties": True}}
    (project / "conformance.yaml").write_text(yaml.safe_dump(conf))
    code, doc = _run(tmp_path, "other-policy", SELECTING, project / "conformance.yaml")
    assert code == 1
    cases = _by_id(doc)
    for component in SELECTING:
        for policy, said in (("upstream", "drop where the case leaks"), ("drop", "leak where the case drops")):
            case = cases[f"{component}/leak-{policy}-r1-prefill-s21-blocks2-top1"]
            ids = case["outputs"]["ids"]
            assert case["status"] == "fail" and ids["rows_tie"] == 0 and ids["rows_miss"] == 7, (policy, ids)
            assert f"7 row(s) {said}: the candidate_leak policy differs, not tie order" in case["message"]
            assert ("(dropped)" if policy == "upstream" else "(leaked)") in case["message"]
    passed = [c for c in doc["cases"] if c["status"] == "pass"]
    assert len(passed) >= 10  # where nothing is masked out, the policy changes nothing


def test_unpinned_newest_block_fails_candidates_select(tmp_path):
    code, doc = _run(tmp_path, f"{WRONG}:UnpinnedCandidates", ["candidates.select"])
    assert code == 1
    cases = _by_id(doc)
    lab = cases["candidates.select/lab27-pinned-top1"]
    assert lab["status"] == "fail" and "output 'mask': not bit-identical" in lab["message"]
    assert "expected ids: [1, -1, -1]" in lab["message"]
    assert "only in expected (id, score): [(1, inf)]" in lab["message"]
    prod = cases["candidates.select/production-2048-of-2050-blocks-b8"]
    assert prod["status"] == "fail" and "row (0, 1)" in prod["message"] and "(2049, inf)" in prod["message"]
    assert cases["candidates.select/lab27-unpinned-top1"]["status"] == "pass"  # nothing to pin there


def test_decode_addresses_with_b_instead_of_b_over_r(tmp_path):
    code, doc = _run(tmp_path, f"{WRONG}:DecodeAddressWithB", ["address.decode", "address.prefill"])
    assert code == 1
    cases = _by_id(doc)
    lab = cases["address.decode/lab27-b8-r2"]
    assert lab["status"] == "fail"
    assert "[0, 0, 0] | 57 | 29" in lab["message"] and "[0, 0, 2] | 60 | 8" in lab["message"]
    failing = {i for i, c in cases.items() if c["status"] != "pass"}
    assert failing == {i for i in cases if i.startswith("address.decode/") and "r1-" not in i.split("/")[1]}


@pytest.mark.parametrize("component", OURS)
def test_each_component_has_cases_at_its_floor(component):
    assert len(golden_ids(component)) >= get(component).floor


# indexer.scores bugs that the term allowance (bf16 ulps of the largest head term) and the precision
# check (no farther from the exact scores than the reference's own roundings) must not absorb, with a
# case each must fail and the text the message shows. Dots left unrounded are more precision, not a
# bug: they pass (tests/test_gpu_arithmetic.py).
SCORE_BUGS = {
    "Bf16HeadSum": "indexer.scores/production-heads-b1-s2-h32-d128-t64",
    "ScoresWithoutRelu": "indexer.scores/relu-zeros-b2-s4-h1-d64-t32",
    "ScoresDropLastHead": "indexer.scores/lab27-two-heads",
}


@pytest.mark.parametrize("impl", sorted(SCORE_BUGS))
def test_wrong_index_scores_fail_despite_the_term_allowance(tmp_path, impl):
    code, doc = _run(tmp_path, f"{WRONG}:{impl}", ["indexer.scores/*"])
    cases = _by_id(doc)
    assert code == 1 and doc["components"]["indexer.scores"]["verdict"] == "fail"
    failing = cases[SCORE_BUGS[impl]]
    assert failing["status"] == "fail" and "output 'scores': not close" in failing["message"]
    assert "bf16 ulp of term_scale" in failing["message"]
