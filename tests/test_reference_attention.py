"""Attention for any ratio with the shared runtime (§5, §10.1, §10.3, §12 schedule A)."""

from __future__ import annotations

import math

import pytest
import torch

from v41_conformance.reference.attention import (
    _chunk_window_ids,
    attention_step,
    init_weights,
    rope_table,
    run_model,
    window_part,
)
from v41_conformance.reference.compressor import pending_state
from v41_conformance.reference.config import TINY_A, layer_roles
from v41_conformance.reference.runtime import SharedRuntime, init_layer_state

CFG = TINY_A
SCHEDULE_A = [(0, 21)] + [(p, p + 1) for p in range(21, 32)]


@pytest.fixture(scope="module")
def weights():
    return init_weights(CFG, seed=0)


@pytest.fixture(scope="module")
def x_seq():
    return torch.randn(2, 32, CFG.dim, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)


@pytest.fixture(scope="module")
def run_a(weights, x_seq):
    return {p: run_model(CFG, weights, x_seq, SCHEDULE_A, p) for p in ("upstream", "fixed")}


def _floored_ulps(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    a, e = actual.double(), expected.double()
    mag = torch.maximum(e.abs(), e.pow(2).mean(-1, keepdim=True).sqrt()).clamp(min=2.0**-126)
    return (a - e).abs() / torch.pow(2.0, torch.floor(torch.log2(mag)) - 7)


# ----------------------------------------------------------------------------- schedule A


def test_schedule_a_runs_with_section_12_widths_and_offsets(run_a):
    roles = layer_roles(CFG)
    steps = run_a["upstream"].steps
    assert len(steps) == 12 and all(len(row) == 8 for row in steps)
    for i, row in enumerate(steps):
        offset = 21 if i == 0 else 8
        S = 21 if i == 0 else 1
        for layer, res in enumerate(row):
            assert res.out.shape == (2, S, CFG.dim) and res.out.dtype == torch.bfloat16
            assert torch.isfinite(res.out.float()).all()
            assert res.window_ids.shape == (2, S, 8)
            if roles[layer].ratio == 0:
                assert res.ids.shape[-1] == 8 and res.compressed_ids.shape[-1] == 0
                continue
            assert res.ids.shape == (2, S, 12)  # 8 + min(4, T), T >= 10 everywhere
            c = res.compressed_ids
            assert ((c == -1) | (c >= offset)).all()
            end = 21 if i == 0 else 21 + i
            lens = torch.arange(end - S + 1, end + 1) // roles[layer].ratio  # per query
            valid = c >= 0
            assert (~valid | (c - offset < lens.view(1, S, 1))).all()
            assert (valid.sum(-1) == lens.clamp(max=4).view(1, S)).all()
            v = torch.where(valid, c, torch.iinfo(torch.int32).max)
            assert (v[..., 1:] > v[..., :-1]).logical_or(~valid[..., 1:]).all()  # ascending


def test_decode_window_ids_follow_the_ring(run_a):
    res = run_a["upstream"].steps[1][0]  # start_pos 21, layer 0
    assert res.window_ids[0, 0].tolist() == [6, 7, 0, 1, 2, 3, 4, 5]
    # slot 5 (= 21 % 8) of the ring holds token 21's finished window kv
    assert torch.equal(res.state.window[:, 5], res.dumps["window_kv"][:, 0])
    assert torch.equal(res.dumps["kv"], res.state.window)


def test_ratio_0_layer_reads_window_only(run_a, weights, x_seq):
    for i, row in enumerate(run_a["upstream"].steps):
        res = row[0]
        assert res.sources == {} and res.candidates is None
        assert res.dumps["kv"].shape[1] == (21 if i == 0 else 8)  # window part only
    # layer 0 leaves the shared runtime untouched
    rt = SharedRuntime()
    st = init_layer_state(CFG, 0, 2)
    res = attention_step(0, CFG, weights[0], st, rt, x_seq[:, :21], 0)
    assert res.runtime is rt
    assert torch.equal(res.ids, res.window_ids)


def test_shared_slots_are_attributed_to_the_upstream_sources(run_a):
    roles = layer_roles(CFG)
    for row in run_a["fixed"].steps:
        for layer, res in enumerate(row):
            r = roles[layer]
            if r.ratio == 0:
                continue
            assert res.sources["compress_kv"] == r.kv_source
            if r.is_index_source:
                assert res.sources["index_k"] == r.index_k_source
            else:
                assert res.sources["topk_idxs"] == r.index_source
            if r.candidate_source is not None:
                assert res.sources["candidates"] == r.candidate_source
    prefill = run_a["fixed"].steps[0]
    assert prefill[4].candidates.shape == (2, 21, 21)
    assert torch.equal(prefill[4].candidates, prefill[6].candidates)
    # the consumer's selection stays inside the kept candidate rows
    ids6 = prefill[6].compressed_ids
    rows6 = torch.where(ids6 >= 0, ids6 - 21, 0).long()
    assert (prefill[4].candidates.gather(-1, rows6) | (ids6 < 0)).all()


def test_caches_hold_completed_groups_only(run_a):
    states = run_a["upstream"].steps[0]
    ckv1 = states[1].state.compress_kv  # ratio 2, prefill 21 -> 10 rows
    assert ckv1.shape == (2, 32, 128)
    assert (ckv1[:, :10].abs().sum(-1) > 0).all() and (ckv1[:, 10:] == 0).all()
    ik4 = states[4].state.index_k  # ratio 1 -> 21 rows
    assert (ik4[:, :21].abs().sum(-1) > 0).all() and (ik4[:, 21:] == 0).all()
    assert states[2].state.compress_kv is None and states[6].state.index_k is None
    final = run_a["upstream"].states
    assert (final[1].compress_kv[:, :16].abs().sum(-1) > 0).all()


# ----------------------------------------------------------------------------- §10.1 policy


def test_policy_upstream_vs_fixed_differs_only_at_stale_index_k_reads(run_a):
    up, fx = run_a["upstream"].steps, run_a["fixed"].steps
    for i, (s, _) in enumerate(SCHEDULE_A):
        stale = i > 0 and s % 2 == 0  # start_pos 22, 24, ..., 30
        for layer in range(8):
            a, b = up[i][layer], fx[i][layer]
            if layer in (1, 3):
                assert a.sources["index_k"] == (4 if stale else layer)
                assert b.sources["index_k"] == layer
            else:
                assert a.sources == b.sources
            affected = stale and layer in (1, 2, 3)  # layer 2 reuses layer 1's ids
            assert torch.equal(a.ids, b.ids) != affected, (s, layer)
            assert torch.equal(a.out, b.out) != affected, (s, layer)
    # caches never depend on the policy
    for a, b in zip(run_a["upstream"].states, run_a["fixed"].states):
        for name in ("window", "compress_kv", "index_k"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or torch.equal(x, y)


# ----------------------------------------------------------------------------- chunking


def test_chunk_window_ids_hand_values():
    assert _chunk_window_ids(10, 3, 4).tolist() == [[3, 0, 1, 4], [0, 1, 4, 5], [1, 4, 5, 6]]
    assert _chunk_window_ids(2, 2, 4).tolist() == [[-1, 0, 1, 4], [0, 1, 4, 5]]
    ring = torch.arange(4).view(1, 4, 1).expand(1, 4, 32).to(torch.bfloat16)
    kv = torch.full((1, 3, 32), 9.0, dtype=torch.bfloat16)
    part, ids, new = window_part(ring, kv, 10)  # positions 10, 11, 12
    assert part.shape == (1, 7, 32) and ids.shape == (1, 3, 4)
    assert new[0, :, 0].tolist() == [9.0, 1.0, 9.0, 9.0]  # slots 10%4, 11%4, 12%4


def _logical(res, offset, width=4):
    """Compressed ids without the step's offset, padded with -1 to index_topk lanes."""
    c = res.compressed_ids
    c = torch.nn.functional.pad(c, (0, width - c.shape[-1]), value=-1)
    return torch.where(c >= 0, c - offset, -1)


def _offset(start: int, end: int, win: int = 8) -> int:
    """Window part length: S at prefill, win at 1-token decode, win + S for a chunk."""
    return end - start if start == 0 else (win if end - start == 1 else win + end - start)


def _collect(run, schedule):
    """Per layer: outputs [b, T, dim], logical compressed ids, masked index scores (padded)."""
    out, ids, scores = [], [], []
    for layer in range(8):
        out.append(torch.cat([st[layer].out for st in run.steps], 1))
        ids.append(torch.cat([_logical(st[layer], _offset(s, e)) for st, (s, e) in zip(run.steps, schedule)], 1))
        ms = [st[layer].dumps.get("masked_scores") for st in run.steps]
        if ms[0] is not None:
            ms = [torch.nn.functional.pad(m.float(), (0, 32 - m.shape[-1]), value=-math.inf) for m in ms]
            scores.append(torch.cat(ms, 1))
        else:
            scores.append(None)
    return out, ids, scores


def _assert_equivalent(run_a, sched_a, run_b, sched_b):
    """Outputs agree within 2 floored ulps except where a selection differs by a tie only."""
    roles = layer_roles(CFG)
    out_a, ids_a, sc_a = _collect(run_a, sched_a)
    out_b, ids_b, sc_b = _collect(run_b, sched_b)
    tied = {}
    for layer in range(8):
        r = roles[layer]
        if not r.is_index_source:
            continue
        diff = (ids_a[layer].sort(-1).values != ids_b[layer].sort(-1).values).any(-1)  # [b, T]
        for bi, t in diff.nonzero().tolist():
            assert torch.equal(sc_a[layer][bi, t], sc_b[layer][bi, t]), (
                f"layer {layer} position {t}: index scores differ"
            )
            for ids, sc in ((ids_a, sc_a), (ids_b, sc_b)):
                chosen = ids[layer][bi, t]
                kth = sc[layer][bi, t, chosen[chosen >= 0]].min()
                other = (ids_a if ids is ids_b else ids_b)[layer][bi, t]
                extra = other[(other >= 0) & ~torch.isin(other, chosen)]
                assert torch.equal(sc[layer][bi, t, extra], kth.expand(extra.numel())), (
                    f"layer {layer} position {t}: selections differ beyond a tie"
                )
        tied[layer] = diff
    for layer in range(8):
        r = roles[layer]
        mask = (
            tied.get(r.index_source, torch.zeros(2, 32, dtype=torch.bool))
            if r.ratio
            else torch.zeros(2, 32, dtype=torch.bool)
        )
        keep = ~mask
        assert torch.equal(ids_a[layer][keep], ids_b[layer][keep])
        u = _floored_ulps(out_a[layer][keep], out_b[layer][keep].float())
        assert u.max() <= 2.0, f"layer {layer}: {u.max()} ulps"
    return tied


CHUNKED = [
    [(0, 5), (5, 13), (13, 21), (21, 32)],  # chunked prefill
    [(0, 20), (20, 32)],  # one multi-token decode chunk
    [(0, 21), (21, 24), (24, 26), (26, 32)],  # multi-token decode steps
    [(0, 1), (1, 3), (3, 4), (4, 9), (9, 32)],  # ragged, S = 1 prefill (T = 0 at ratio 2)
]


@pytest.mark.parametrize("schedule", CHUNKED, ids=lambda s: "-".join(str(e - b) for b, e in s))
def test_chunked_equals_one_shot_prefill(weights, x_seq, schedule):
    one = run_model(CFG, weights, x_seq, [(0, 32)], "fixed")
    chunked = run_model(CFG, weights, x_seq, schedule, "fixed")
    _assert_equivalent(one, [(0, 32)], chunked, schedule)
    for a, b, r in zip(one.states, chunked.states, layer_roles(CFG)):
        assert torch.equal(a.window, b.window)
        if r.is_kv_source:
            assert torch.equal(a.compress_kv, b.compress_kv)
            assert torch.equal(pending_state(a.comp_ring, 32, r.ratio), pending_state(b.comp_ring, 32, r.ratio))
        if r.owns_k:
            assert torch.equal(a.index_k, b.index_k)


def test_upstream_policy_equals_one_shot_when_every_step_closes_a_group(weights, x_seq):
    schedule = [(0, 6), (6, 14), (14, 22), (22, 32)]
    one = run_model(CFG, weights, x_seq, [(0, 32)], "upstream")
    _assert_equivalent(one, [(0, 32)], run_model(CFG, weights, x_seq, schedule, "upstream"), schedule)


# ----------------------------------------------------------------------------- assembly


def test_output_matches_plain_float64_assembly(run_a, weights):
    """sparse attention + inverse RoPE + grouped wo_a + wo_b, restated in float64."""
    for step, layer in ((0, 1), (3, 6), (5, 0)):
        res = run_a["upstream"].steps[step][layer]
        w = weights[layer]
        q, kv, ids = res.dumps["q"].double(), res.dumps["kv"].double(), res.ids
        b, S, h, d = q.shape
        present = ids >= 0
        rows = kv[torch.arange(b).view(-1, 1, 1), ids.long().clamp(min=0)] * present[..., None]
        s = torch.einsum("bshd,bskd->bshk", q, rows) * CFG.head_dim**-0.5
        e = torch.exp(s).masked_fill(~present.unsqueeze(2), 0.0)
        den = e.sum(-1) + torch.exp(w.attn_sink.double()).view(1, 1, h)
        o = torch.einsum("bshk,bskd->bshd", e, rows) / den[..., None]
        start = SCHEDULE_A[step][0]
        table = rope_table(CFG, layer_roles(CFG)[layer].ratio)[start : start + S].double()
        rot = torch.complex(table[..., 0], table[..., 1]).conj().view(1, S, 1, -1)
        tail = torch.view_as_complex(o[..., -32:].contiguous().unflatten(-1, (-1, 2)))
        o = torch.cat([o[..., :-32], torch.view_as_real(tail * rot).flatten(-2)], -1)
        z = torch.einsum("bsgd,grd->bsgr", o.reshape(b, S, 2, -1), w.wo_a.double().view(2, 32, -1)).flatten(2)
        ref = z @ w.wo_b.double().T
        rel = (res.out.double() - ref).norm() / ref.norm()
        assert rel < 1e-2, (step, layer, rel)


def test_every_query_sees_itself_so_no_row_is_all_absent(run_a):
    for row in run_a["upstream"].steps:
        for res in row:
            assert ((res.window_ids >= 0).sum(-1) >= 1).all()
            assert (res.dumps["attn"].float().abs().sum(-1) > 0).all()


def test_rejects_non_contiguous_steps(weights, x_seq):
    st = init_layer_state(CFG, 1, 2)
    with pytest.raises(ValueError, match="steps must be contiguous"):
        attention_step(1, CFG, weights[1], st, SharedRuntime(), x_seq[:, 3:5], 3)
    with pytest.raises(ValueError, match="policy must be one of"):
        attention_step(1, CFG, weights[1], st, SharedRuntime(), x_seq[:, :5], 0, "maybe")
    with pytest.raises(ValueError, match="schedule must be contiguous"):
        run_model(CFG, weights, x_seq, [(0, 5), (4, 6)])
