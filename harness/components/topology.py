"""`topology.validate`: accept or reject a cross-layer sharing topology.

A topology gives, per layer, the layer whose main compressed KV, index keys, top-k selection and
level-one candidates it reads (`-1`: takes no part). It is accepted only when each finer map
refines the coarser one (index refines index-K refines main-KV; candidates refine index-K) and
every source precedes its consumers without another publisher in between (upstream keeps one
shared slot per kind, M:1166-1180). The rules and messages are `v41_conformance.reference.topology`
(seed appendix A.6; docs/v41-reference.md §1.3, §5.5).

The maps are the case's params (`main_kv`, `index_k`, `index`, optional `candidate`), so they
show in every golden's metadata; the implementation receives them as int64 tensors (`candidate`
all -1 when the case has none) and returns `accepted`, compared exactly. The reference's
message, which names the layer and both sources, is stored in the golden's metadata as
`build.expected_message`, for reading only: it is neither sent to the implementation nor compared.
"""

from __future__ import annotations

import dataclasses

import torch

from ..cases import CaseSpec
from ..errors import CaseSpecError
from ..reference.config import PRODUCTION, TINY_A, layer_roles, topology_maps
from ..reference.topology import validate_topology
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T

NAME = "topology.validate"
MAPS = ("main_kv", "index_k", "index", "candidate")
DERIVED = {"tiny-a": TINY_A, "production": PRODUCTION}


def _maps(params: dict) -> dict[str, list[int] | None]:
    out: dict[str, list[int] | None] = {}
    for key in MAPS:
        value = params.get(key)
        if value is None and key != "candidate":
            raise CaseSpecError(f"{NAME}: params need '{key}' (a list of source layers, -1 = none)")
        out[key] = None if value is None else [int(v) for v in value]
    return out


def _expand(spec: CaseSpec) -> list[CaseSpec]:
    """Fill the maps from `params.derived_from` (a named config) and record the verdict's message."""
    params = dict(spec.params)
    derived = params.get("derived_from")
    if derived is not None:
        if derived not in DERIVED:
            raise CaseSpecError(f"{spec.source}: derived_from {derived!r}; known: {sorted(DERIVED)}")
        main_kv, index_k, index, candidate = topology_maps(layer_roles(DERIVED[derived]))
        params.update(main_kv=main_kv, index_k=index_k, index=index, candidate=candidate)
    maps = _maps(params)
    kv_map, k_map, index_map = maps["main_kv"], maps["index_k"], maps["index"]
    assert kv_map is not None and k_map is not None and index_map is not None  # _maps: only candidate may be None
    verdict = validate_topology(kv_map, k_map, index_map, maps["candidate"])
    build = {**spec.build, "expected_message": verdict.message}  # metadata only: never sent to the impl
    return [dataclasses.replace(spec, params=params, build=build)]


def _inputs(params, build, gen):
    maps = _maps(params)
    n = len(maps["main_kv"])
    candidate = maps["candidate"] if maps["candidate"] is not None else [-1] * n
    out = {key: torch.tensor(maps[key], dtype=torch.int64) for key in ("main_kv", "index_k", "index")}
    out["candidate"] = torch.tensor(candidate, dtype=torch.int64)
    return out


def _reference(inputs, params):
    lists = {key: [int(v) for v in inputs[key].tolist()] for key in MAPS}
    verdict = validate_topology(lists["main_kv"], lists["index_k"], lists["index"], lists["candidate"])
    return {"accepted": torch.tensor(verdict.accepted)}


register(
    Component(
        name=NAME,
        summary="sharing maps (main-KV, index-K, index, candidate sources per layer) must refine each other",
        upstream="M:1166-1180 (shared_attn slots); seed appendix A.6; docs/v41-reference.md §1.3, §5.5",
        inputs=tuple(T(m, "int64", "L", f"each layer's {m} source layer, -1 = takes no part") for m in MAPS),
        outputs=(OutputSpec("accepted", "exact", "the topology is valid", "bool", ""),),
        params=(
            *(
                P(
                    m,
                    "int_list",
                    f"the {m} source map",
                    required=m != "candidate",
                    derive=None if m != "candidate" else lambda p: [-1] * len(p.get("main_kv") or []),
                    default_doc="" if m != "candidate" else "all -1, as long as main_kv",
                )
                for m in MAPS
            ),
            P("derived_from", "str", "the named config the maps were derived from", required=False, default=""),
        ),
        dims={"L": "layers (a map may differ in length, which must be rejected)"},
        build=_inputs,
        reference=_reference,
        floor=8,
        notes="inputs: int64 [L] source-layer maps, -1 = the layer takes no part (candidate all -1 when the "
        "case gives none; index-K, index and candidate may differ in length from main-KV, which must "
        "be rejected). build.expected_message (metadata) is the reference's reason, for reading only.",
        extra={"expand": _expand},
    )
)
