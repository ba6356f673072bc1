"""Behaviours no golden held before issue 35, and the goldens that now hold them.

For each behaviour: (i) the new case really reaches it (instrumented reference runs, or a
recomputation from the golden's own params and inputs), and no older golden of the component
does; (ii) a mutant of the reference at the line that handles it (tests/impls/unreached_mutants.py)
fails the new golden through the project's own judging (`runner.run_case`), and passes every older
golden of the component.

- an index step that sees exactly one compressed row (T == 1): `attention` and `indexer`;
- `candidates.restore` with a compact id on the mask's last row (c == W - 1, every row kept).
"""

from __future__ import annotations

import pytest
import torch

import v41_conformance.reference.attention as ref_attention
from conftest import ROOT
from patching import patched
from unreached_mutants import LastRowClamped, SinglePickSqueezed, SingleRowSkipped
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.config import load_config
from v41_conformance.golden import Golden, load_verified, read_manifest
from v41_conformance.reference import indexer as ix
from v41_conformance.reference.config import AttnConfig, layer_roles
from v41_conformance.runner import run_case

CONFIG = load_config(ROOT / "conformance.yaml")
MANIFEST = read_manifest(CONFIG.goldens)

ATTENTION_T1 = "attention/single-compressed-row-chunks-1-1-1-upstream"
INDEXER_T1 = ["indexer/t1-r1-prefill-s1", "indexer/t1-r2-decode-start1", "indexer/t1-r2-prefill-s3-b2"]
RESTORE_LAST_ROW = [
    "candidates.restore/last-row-lab-full-mask",
    "candidates.restore/last-row-mask-form-s4-w12-b4-offset5",
]
FUZZ_T1 = ["attention/fuzz-s36-1942-p2-d1x12-fixed"]  # promoted later, from the fuzz: a prefill of 2 at ratio 2
NEW = {ATTENTION_T1, *INDEXER_T1, *RESTORE_LAST_ROW, *FUZZ_T1}


def judge(impl, case_id: str):
    """The case's result for `impl`, judged as `conformance run` judges it."""
    return run_case(case_id, CONFIG, impl, type(impl).__name__, MANIFEST)


def older(component: str) -> list[str]:
    """The component's goldens from before issue 35's cases."""
    return sorted(c for c in MANIFEST if c.split("/")[0] == component and c not in NEW)


def golden(case_id: str) -> Golden:
    return load_verified(CONFIG.goldens, case_id, MANIFEST, CONFIG.generate_command)


# --- (i) reach: an index step with T == 1 ---------------------------------------------------------


class IndexRowRecorder(ReferenceAdapter):
    """The reference, recording what each index step saw: `forwards` holds (ratio, T) per
    `indexer_forward` call (T = the scored compressed rows), `selections` (T, lanes) per
    `select_topk` call (lanes = min(index_topk, T))."""

    def __init__(self):
        self.forwards: list[tuple[int, int]] = []
        self.selections: list[tuple[int, int]] = []

    def run(self, component, inputs, params):
        forward, select = ix.indexer_forward, ix.select_topk

        def recorded_forward(x, qr, keys, start, ratio, *rest, **kw):
            result = forward(x, qr, keys, start, ratio, *rest, **kw)
            self.forwards.append((ratio, result.scores.shape[-1]))
            return result

        def recorded_select(scores, *rest, **kw):
            selection = select(scores, *rest, **kw)
            self.selections.append((scores.shape[-1], selection.ids.shape[-1]))
            return selection

        with patched(ix, "indexer_forward", recorded_forward), patched(ix, "select_topk", recorded_select):
            with patched(ref_attention, "indexer_forward", recorded_forward):  # attention imported it by name
                return super().run(component, inputs, params)


def attention_index_rows(case_id: str) -> list[tuple[int, int, int]]:
    """(step, layer, T) of every index-source call of an attention golden, recomputed from its
    params: T = end // ratio (reference.attention._select); T == 0 skips the indexer."""
    params = golden(case_id).meta["params"]
    cfg = AttnConfig.from_dict(params["config"])
    return [
        (step, role.layer, end // role.ratio)
        for step, (_, end) in enumerate(params["schedule"])
        for role in layer_roles(cfg)
        if role.ratio and role.is_index_source
    ]


def indexer_rows(case_id: str) -> int:
    """T = (start + S) // ratio of an indexer golden, from its params and its x [b, S, dim]."""
    g = golden(case_id)
    start, ratio = int(g.meta["params"]["start"]), int(g.meta["params"]["ratio"])
    return (start + g.inputs["x"].shape[1]) // ratio


def test_the_attention_case_scores_exactly_one_compressed_row_at_both_ratios():
    recorder = IndexRowRecorder()
    assert judge(recorder, ATTENTION_T1).status == "pass"  # the reference passes its own golden
    assert sorted(set(recorder.forwards)) == [(1, 1), (1, 2), (1, 3), (2, 1)]  # ratio 2 never sees more
    assert (1, 1) in recorder.selections  # one row, one lane: k = min(index_topk 4, T 1)
    one_row = {(step, layer) for step, layer, T in attention_index_rows(ATTENTION_T1) if T == 1}
    assert one_row == {(0, 4), (0, 6), (1, 1), (1, 3), (2, 1), (2, 3)}


def test_no_older_attention_golden_has_an_index_step_with_one_compressed_row():
    for case_id in older("attention"):
        assert all(T != 1 for _, _, T in attention_index_rows(case_id)), case_id


@pytest.mark.parametrize("case_id", INDEXER_T1)
def test_each_indexer_case_scores_and_selects_exactly_one_compressed_row(case_id):
    recorder = IndexRowRecorder()
    assert judge(recorder, case_id).status == "pass"
    ratio = int(golden(case_id).meta["params"]["ratio"])
    assert recorder.forwards == [(ratio, 1)] and set(recorder.selections) == {(1, 1)}  # forward, then select_with_leak
    assert indexer_rows(case_id) == 1


def test_no_older_indexer_golden_sees_one_compressed_row():
    assert all(indexer_rows(c) > 1 for c in older("indexer")), {c: indexer_rows(c) for c in older("indexer")}


# --- (i) reach: a compact id on the mask's last row ----------------------------------------------


def last_row_lanes(case_id: str) -> int:
    """How many valid compact ids of a mask-form restore golden are W - 1, the mask's last row
    (which needs every row of that query kept); 0 for the block form."""
    inputs = golden(case_id).inputs
    kept, compact = inputs["kept"], inputs["compact"].long()
    if kept.dtype != torch.bool:
        return 0
    last = kept.shape[-1] - 1
    on_last = compact == last
    assert bool(kept[..., -1:].expand_as(compact)[on_last].all()), case_id  # the last row is kept there
    return int(on_last.sum())


@pytest.mark.parametrize("case_id", RESTORE_LAST_ROW)
def test_each_restore_case_has_a_compact_id_on_the_masks_last_row(case_id):
    g = golden(case_id)
    assert last_row_lanes(case_id) > 0
    W, offset = g.inputs["kept"].shape[-1], int(g.meta["params"].get("request_offset", 0))
    restored = g.outputs["ids"][g.inputs["compact"] == W - 1]
    assert restored.tolist() == [W - 1 + offset] * restored.numel()  # it restores to that last row
    assert judge(ReferenceAdapter(), case_id).status == "pass"


def test_no_older_restore_golden_has_a_compact_id_on_the_masks_last_row():
    assert all(last_row_lanes(c) == 0 for c in older("candidates.restore"))


# --- (ii) mutants fail the new goldens and pass the older ones ------------------------------------


def failing(result) -> list[str]:
    return [name for name, verdict in result.outputs.items() if not verdict["ok"]]


def test_single_row_skipped_fails_the_attention_golden_at_its_first_one_row_step():
    result = judge(SingleRowSkipped(), ATTENTION_T1)
    assert result.status in ("fail", "error") and result.first_divergent_stage == "s00.l4.compressed_ids"
    assert "output 's00.l4.compressed_ids': shape [1, 1, 0] != expected [1, 1, 1]" in result.message
    assert {
        "s00.l4.compressed_ids",
        "s00.l6.compressed_ids",
        "s01.l1.compressed_ids",
        "s01.l3.compressed_ids",
        "s02.l1.compressed_ids",
        "s02.l3.compressed_ids",
    } <= set(failing(result))  # both ratios


def test_single_pick_squeezed_fails_the_attention_golden_at_step_0():
    result = judge(SinglePickSqueezed(), ATTENTION_T1)
    assert result.status == "error"  # the window and compressed ids no longer concatenate
    assert "implementation failed at step 0: layer 4 (Full, ratio 1), [0, 1) raised RuntimeError" in result.message


@pytest.mark.parametrize("case_id", INDEXER_T1)
def test_single_pick_squeezed_fails_each_indexer_golden(case_id):
    result = judge(SinglePickSqueezed(), case_id)
    b, S = golden(case_id).inputs["x"].shape[:2]
    assert result.status in ("fail", "error") and failing(result) == ["ids"]
    assert f"output 'ids': shape [{b}, {S}] != expected [{b}, {S}, 1]" in result.message


def test_single_row_skipped_is_not_distinguished_by_any_indexer_golden():
    """The `indexer` component's ids come from `select_with_leak` over the forward's scores, not from
    `indexer_forward`'s T == 0 branch: that line is dead there, new goldens or not."""
    assert {judge(SingleRowSkipped(), c).status for c in [*INDEXER_T1, *older("indexer")]} == {"pass"}


@pytest.mark.parametrize("case_id", RESTORE_LAST_ROW)
def test_last_row_clamped_fails_each_restore_golden_on_the_last_row_lanes(case_id):
    result = judge(LastRowClamped(), case_id)
    assert result.status == "fail" and failing(result) == ["ids"]
    assert f"mismatched elements: {last_row_lanes(case_id)} / " in result.message  # exactly those lanes
    assert "not bit-identical" in result.message


# (not swept over the older attention goldens, 15 s of make test: that none of them has a one-row index
# step is shown structurally above, test_no_older_attention_golden_has_an_index_step_with_one_compressed_row)
@pytest.mark.parametrize(
    "mutant, component",
    [(SinglePickSqueezed, "indexer"), (SinglePickSqueezed, "indexer.select"), (LastRowClamped, "candidates.restore")],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_every_mutant_passes_every_older_golden_of_the_component(mutant, component):
    statuses = {case_id: judge(mutant(), case_id).status for case_id in older(component)}
    assert statuses and set(statuses.values()) == {"pass"}, statuses
