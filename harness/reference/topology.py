"""Validation of cross-layer sharing maps (seed appendix A.6; docs/v41-reference.md §1.3, §5.5).

A sharing topology is a set of per-layer source maps: ``src[l]`` is the layer whose data
layer ``l`` reads (``src[l] == l``: the layer computes and publishes its own), ``-1`` where
the layer takes no part (a window-only layer has no compressed KV, a Reuse layer no
candidates). The maps, coarse to fine:

- main-KV: whose compressed KV cache a layer attends (upstream ``shared_attn.compress_kv``);
- index-K: whose index keys its indexer scores against (``shared_attn.index_k``);
- index:   whose top-k selection it attends (``shared_attn.topk_idxs``);
- candidate (optional): whose level-one candidate blocks its indexer applies
  (``shared_attn.candidates``).

A map is accepted when, for every participating layer ``l`` with source ``s``:

1. ``s <= l``                            the source runs no later than its reader;
2. ``src[s] == s``                       a source is its own source;
3. no layer ``t`` with ``s < t < l`` has ``src[t] == t``
                                         segments are contiguous: upstream keeps one slot
                                         per kind and a later publisher overwrites it, so a
                                         reader can only see the latest source before it;
4. the coarser map covers ``l`` too      (a layer with an index source has index-K and
                                         main-KV sources);
5. ``coarse[s] == coarse[l]``            refinement: the finer source lies in the reader's
                                         coarser segment (index refines index-K refines
                                         main-KV). Under 3 this is the same as "every finer
                                         segment lies inside one coarser segment".

The candidate map is checked with rules 1-3, plus: its sources and consumers are
indexers (``index[l] == l``), and it refines the index-K map (a consumer masks scores over
the same compressed rows the source scored). It does not refine the index map: each
consumer is an index source of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopologyVerdict:
    accepted: bool
    message: str  # "ok: ..." or every violation, "; "-separated


def _check_map(name: str, src: list[int], n: int) -> list[str]:
    """Rules 1-3 (and entry range) for one map."""
    out = []
    if len(src) != n:
        return [f"{name} map has {len(src)} entries but main-KV map has {n}; give one entry per layer"]
    for l, s in enumerate(src):
        if not isinstance(s, int) or s < -1 or s >= n:
            out.append(f"layer {l}: {name} source {s!r} is not -1 or a layer in [0, {n})")
    if out:
        return out
    for l, s in enumerate(src):
        if s < 0:
            continue
        if s > l:
            out.append(f"layer {l}: {name} source {s} runs after layer {l}; a source must precede or equal its reader")
            continue
        if src[s] != s:
            out.append(
                f"layer {l}: {name} source {s} is not its own {name} source ({name} source of layer {s} is {src[s]})"
            )
            continue
        between = [t for t in range(s + 1, l) if src[t] == t]
        if between:
            out.append(
                f"layer {l}: {name} source {s} is shadowed by layer {between[-1]}, "
                f"which publishes its own {name} in between; the shared slot holds "
                "only the latest publication"
            )
    return out


def _check_refines(fine_name: str, fine: list[int], coarse_name: str, coarse: list[int]) -> list[str]:
    """Rules 4-5: coarse[fine[l]] == coarse[l] for every layer the fine map covers."""
    out = []
    for l, s in enumerate(fine):
        if s < 0:
            continue
        if coarse[l] < 0:
            out.append(f"layer {l}: has {fine_name} source {s} but no {coarse_name} source")
        elif coarse[s] != coarse[l]:
            out.append(
                f"layer {l}: {fine_name} source {s} lies in {coarse_name} segment "
                f"{coarse[s]} but layer {l}'s {coarse_name} source is {coarse[l]}"
            )
    return out


def validate_topology(
    main_kv: list[int], index_k: list[int], index: list[int], candidate: list[int] | None = None
) -> TopologyVerdict:
    """Accept or reject a sharing topology; the message names every violating layer.

    >>> validate_topology([0, 0, 0, 0], [0, 0, 2, 2], [0, 1, 2, 3]).accepted
    True
    """
    n = len(main_kv)
    problems = _check_map("main-KV", list(main_kv), n)
    problems += _check_map("index-K", list(index_k), n)
    problems += _check_map("index", list(index), n)
    if candidate is not None:
        problems += _check_map("candidate", list(candidate), n)
    if problems:  # refinement needs well-formed maps
        return TopologyVerdict(False, "; ".join(problems))
    problems += _check_refines("index-K", index_k, "main-KV", main_kv)
    problems += _check_refines("index", index, "index-K", index_k)
    if candidate is not None:
        for l, c in enumerate(candidate):
            if c < 0:
                continue
            if index[l] != l:
                problems.append(
                    f"layer {l}: takes part in candidates (source {c}) but has no "
                    f"indexer of its own (index source {index[l]})"
                )
            if index[c] != c:
                problems.append(f"layer {l}: candidate source {c} has no indexer of its own (index source {index[c]})")
        problems += _check_refines("candidate", candidate, "index-K", index_k)
    if problems:
        return TopologyVerdict(False, "; ".join(problems))
    n_seg = len({s for s in main_kv if s >= 0})
    return TopologyVerdict(
        True,
        f"ok: {n} layers, {n_seg} main-KV segment(s), "
        f"{len({s for s in index_k if s >= 0})} index-K, "
        f"{len({s for s in index if s >= 0})} index",
    )
