"""Sharing-topology validation (seed A.6) and per-layer roles (§1.3, §12)."""

from __future__ import annotations

import dataclasses

import pytest

from v41_conformance.reference.config import PRODUCTION, TINY_A, AttnConfig, layer_roles, topology_maps
from v41_conformance.reference.topology import validate_topology


# ----------------------------------------------------------------------------- topology

VALID = [
    # seed A.6 teaching example
    ([0, 0, 0, 0], [0, 0, 2, 2], [0, 1, 2, 3], None),
    # everything its own source
    ([0, 1, 2], [0, 1, 2], [0, 1, 2], None),
    # one segment everywhere
    ([0, 0, 0], [0, 0, 0], [0, 0, 0], None),
    # window-only layers (-1) in front and between
    ([-1, 1, 1, -1, 1], [-1, 1, 1, -1, 1], [-1, 1, 2, -1, 2], None),
    # config A, with candidates
    ([-1, 1, 1, 3, 4, 4, 4, 4], [-1, 1, 1, 3, 4, 4, 4, 4], [-1, 1, 1, 3, 4, 4, 6, 6], [-1, -1, -1, -1, 4, -1, 4, -1]),
]


@pytest.mark.parametrize("main_kv,index_k,index,cand", VALID)
def test_valid_maps_accepted(main_kv, index_k, index, cand):
    verdict = validate_topology(main_kv, index_k, index, cand)
    assert verdict.accepted, verdict.message
    assert verdict.message.startswith("ok:")


INVALID = [
    # index-K source 1 lies in main-KV segment 0 but layer 3's main-KV source is 2
    (
        ([0, 0, 2, 2], [0, 1, 1, 1], [0, 1, 2, 3], None),
        "layer 3: index-K source 1 lies in main-KV segment 0 but layer 3's main-KV source is 2",
    ),
    # index refinement broken: layer 2's index source 1 is in index-K segment 0, layer 2 in 2
    (
        ([0, 0, 0, 0], [0, 0, 2, 2], [0, 1, 1, 3], None),
        "layer 2: index source 1 lies in index-K segment 0 but layer 2's index-K source is 2",
    ),
    # source after its reader
    (([0, 2, 2], [0, 2, 2], [0, 2, 2], None), "layer 1: main-KV source 2 runs after layer 1"),
    # source not its own source
    (([0, 0, 1], [0, 0, 0], [0, 0, 0], None), "layer 2: main-KV source 1 is not its own main-KV source"),
    # non-contiguous segment: layer 2 reads 0 although layer 1 published in between
    (([0, 1, 0], [0, 1, 0], [0, 1, 0], None), "layer 2: main-KV source 0 is shadowed by layer 1"),
    # length mismatch
    (([0, 0, 0], [0, 0], [0, 0, 0], None), "index-K map has 2 entries"),
    # out of range
    (([0, 0, 5], [0, 0, 0], [0, 0, 0], None), "layer 2: main-KV source 5 is not -1"),
    # index source without main-KV coverage
    (([0, -1, 0], [0, -1, 0], [0, 1, 1], None), "layer 1: has index source 1 but no index-K source"),
    # candidate consumer without its own indexer
    (([0, 0, 0], [0, 0, 0], [0, 0, 2], [0, 0, -1]), "layer 1: takes part in candidates (source 0) but has no indexer"),
    # candidate source in another index-K segment
    (
        ([0, 0, 0], [0, 1, 1], [0, 1, 2], [0, -1, 0]),
        "layer 2: candidate source 0 lies in index-K segment 0 but layer 2's index-K source is 1",
    ),
]


@pytest.mark.parametrize("maps,expected", INVALID)
def test_invalid_maps_rejected_with_named_layer(maps, expected):
    verdict = validate_topology(*maps)
    assert not verdict.accepted
    assert expected in verdict.message, verdict.message


def test_every_violation_is_reported():
    verdict = validate_topology([0, 2, 2, 0], [0, 2, 2, 0], [0, 2, 2, 0])
    assert verdict.message.count("main-KV source 2 runs after layer 1") == 1
    assert "layer 3: main-KV source 0 is shadowed by layer 2" in verdict.message


# ----------------------------------------------------------------------------- roles


def test_tiny_a_roles_match_section_12():
    roles = layer_roles(TINY_A)
    assert [r.mode for r in roles] == ["Window", "Full", "Reuse", "Full", "Full", "Reuse", "Reindex", "Reuse"]
    assert [r.ratio for r in roles] == [0, 2, 2, 2, 1, 1, 1, 1]
    assert [r.kv_source for r in roles] == [None, 1, 1, 3, 4, 4, 4, 4]
    assert [r.index_source for r in roles] == [None, 1, 1, 3, 4, 4, 6, 6]
    assert [r.index_k_source for r in roles] == [None, 1, 1, 3, 4, 4, 4, 4]
    assert [r.is_candidate_source for r in roles] == [False] * 4 + [True] + [False] * 3
    assert [r.candidate_source for r in roles] == [None] * 6 + [4, None]
    assert [r.owns_k for r in roles] == [False, True, False, True, True, False, False, False]
    assert topology_maps(roles)[3] == [-1, -1, -1, -1, 4, -1, 4, -1]


def test_production_roles_match_section_1_3():
    roles = layer_roles(PRODUCTION)
    assert len(roles) == 43 and PRODUCTION.n_layers == 40
    modes = {r.layer: r.mode for r in roles}
    assert [l for l in range(43) if modes[l] == "Window"] == [0, 1, 40, 41, 42]
    assert [l for l in range(43) if modes[l] == "Full"] == [2, 8, 14, 20]
    assert [l for l in range(43) if modes[l] == "Reindex"] == [24, 28, 32, 36]
    for l in range(3, 8):
        assert (roles[l].kv_source, roles[l].index_source) == (2, 2)
    for l in (9, 13, 15, 19):
        assert roles[l].kv_source == roles[l].index_source == (8 if l < 14 else 14)
    for l in range(21, 40):
        assert roles[l].kv_source == 20 and roles[l].index_k_source == 20
    assert [roles[l].index_source for l in (25, 27, 29, 33, 37, 39)] == [24, 24, 28, 32, 36, 36]
    assert [r.layer for r in roles if r.candidate_source == 20] == [24, 28, 32, 36]
    assert [r.ratio for r in roles[2:20]] == [2] * 18 and [r.ratio for r in roles[20:40]] == [1] * 20


def test_roles_reject_unusable_configs():
    with pytest.raises(ValueError, match="layer 2 has ratio 1 but its kv source 1 has ratio 2"):
        layer_roles(dataclasses.replace(TINY_A, compress_ratios=(0, 2, 1, 2, 1, 1, 1, 1)))
    with pytest.raises(ValueError, match="no kv source at or before it"):
        layer_roles(dataclasses.replace(TINY_A, compress_ratios=(2, 2, 2, 2, 1, 1, 1, 1)))
    with pytest.raises(ValueError, match="kv source without an indexer"):
        layer_roles(dataclasses.replace(TINY_A, index_source_layers=(3, 4, 6)))
    with pytest.raises(ValueError, match="n_heads 3 must be a multiple of o_groups 2"):
        AttnConfig(n_heads=3)
