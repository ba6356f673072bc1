"""Spaces of the attention path: sparse_attn, compressor, compressor.ring, compressor.metadata, attention."""

from __future__ import annotations

import random
from typing import Any

from ..space import Spec, log_int, register_space, Space


def _sparse_attn(rng: random.Random) -> Spec:
    """Any batch (1-3), query rows, heads, head_dim a multiple of 32 (the kernel's tile of d), lanes
    up to several 64-wide tiles (the last one partial), absent lanes from none to most, whole rows
    and whole first tiles absent, extreme sinks, large logits."""
    b = rng.randint(1, 3)
    m = log_int(rng, 1, 24)
    h = rng.choice([1, 2, 4, 8, 16])
    d = rng.choice([32, 64, 128, 256, 512])
    k = log_int(rng, 1, 400)
    n = k + log_int(rng, 0, 300)
    build = {"shape": [b, m, h, d], "n": n, "k": k, "absent": rng.choice([0.0, 0.05, 0.25, 0.6, 0.95])}
    if rng.random() < 0.3:
        build["q_scale"] = rng.choice([0.1, 3.0, 8.0])
    if rng.random() < 0.3:
        build["sinks"] = [rng.choice([-30.0, -4.0, 0.0, 4.0, 12.0, 40.0]) for _ in range(rng.choice([1, h]))]
    if rng.random() < 0.3:
        build["all_absent"] = [[rng.randrange(b), rng.randrange(m)]]
    if k > 64 and rng.random() < 0.3:
        build["absent_first_tile"] = [[rng.randrange(b), rng.randrange(m)]]
    if rng.random() < 0.3:
        build["order"] = "ascending"
    return {}, build


def _sparse_attn_cost(params: dict, build: dict) -> float:
    b, m, h, d = build["shape"]
    return 0.002 + b * m * h * build["k"] * d * 4e-9


def _sparse_attn_contains(params: dict, build: dict) -> bool:
    b, m, h, d = build["shape"]
    return min(b, m, h) >= 1 and d >= 32 and d % 32 == 0 and 1 <= build["k"] <= build["n"]


register_space(
    Space(
        "sparse_attn",
        _sparse_attn,
        _sparse_attn_cost,
        simple={"absent": 0.0, "q_scale": 1.0, "order": "random"},
        contains=_sparse_attn_contains,
        note="b 1-3, m 1-24, h 1-16, d 32-512, k 1-400 lanes (several tiles), n >= k, absences, sinks",
    )
)


# --- compressor, compressor.ring, compressor.metadata ------------------------------------------

from ..schedules import max_step, parse_schedule_name, schedule_name  # noqa: E402
from ..space import composition, random_schedule  # noqa: E402


def _schedule_for_stream(rng: random.Random, most: int = 64) -> str:
    """A compressor schedule over 1..`most` accepted positions: a random composition of chunks
    (chunked prefill, short and ragged chunks), upstream's prefill + single tokens, or a prefill
    then speculative decode steps of up to q_max (2-8) positions with drafts rolled back."""
    total = log_int(rng, 1, most)
    kind = rng.random()
    if kind < 0.3:
        return random_schedule(rng, total)
    if kind < 0.45:
        return random_schedule(rng, total, q_max=1)
    return random_schedule(rng, total, q_max=rng.choice([2, 3, 4, 6, 6, 8]))


def _batch(rng: random.Random) -> int:
    return rng.choice([1, 2, 3, 3])  # 3 often: a known kernel bug class mishandles a batch of 3


def _compressor(rng: random.Random) -> Spec:
    """Ratio 2 (mostly) or 1, batch 1-3, dim 16-5120 and head_dim 16-512 (multiples of 16,
    log-uniform), one schedule of up to 64 positions (compositions, prefill + decode, speculative
    drafts with rollbacks), rings at the minimum r + longest step - 1 or larger (the production
    7 slots where it suffices), peaked or flat gate scores, another norm eps now and then."""
    ratio = 2 if rng.random() < 0.75 else 1
    name = _schedule_for_stream(rng)
    build: dict[str, Any] = {
        "dim": 16 * log_int(rng, 1, 320),
        "head_dim": 16 * log_int(rng, 1, 32),
        "batch": _batch(rng),
        "schedules": [name],
    }
    if ratio == 2:
        need = ratio + max_step(parse_schedule_name(name)) - 1
        if rng.random() < 0.3:
            build["ring_slots"] = 7 if need <= 7 and rng.random() < 0.5 else need + log_int(rng, 1, 8)
        if rng.random() < 0.3:
            build["score_scale"] = rng.choice([0.01, 0.3, 3.0, 30.0, 300.0])
    params: dict[str, Any] = {"ratio": ratio}
    if rng.random() < 0.1:
        params["eps"] = rng.choice([1e-6, 1e-5])
    return params, build


def _compressor_cost(params: dict, build: dict) -> float:
    steps = parse_schedule_name(build["schedules"][0])
    written = sum(end - start for start, end in steps)
    dim, hd, b = int(build["dim"]), int(build["head_dim"]), int(build.get("batch", 1))
    ratio = int(params.get("ratio", 2))
    return 0.0008 + 2.5e-4 * len(steps) + 4e-8 * dim * hd + ratio * 1e-10 * b * written * dim * hd


def _width(value) -> bool:
    return int(value) >= 16 and int(value) % 16 == 0


def _compressor_contains(params: dict, build: dict) -> bool:
    parse_schedule_name(build["schedules"][0])  # a ValueError: outside
    return (
        len(build["schedules"]) == 1
        and 1 <= int(build["batch"]) <= 3
        and _width(build["dim"])
        and _width(build["head_dim"])
    )


register_space(
    Space(
        "compressor",
        _compressor,
        _compressor_cost,
        simple={"ratio": 1, "batch": 1, "score_scale": 1.0, "eps": 1e-20},
        contains=_compressor_contains,
        note="ratio 1/2, b 1-3, dim 16-5120, hd 16-512, <= 64 positions: compositions, prefill + decode, "
        "speculative q_max 2-8 with rollbacks; ring >= r + longest step - 1; peaked scores",
    )
)


def _compressor_ring(rng: random.Random) -> Spec:
    """Ratio 2: q_max 1-64 and rings around the capacity r + q_max - 1 (one or two short, exact,
    larger, empty); ratio 1: the empty ring (accepted) or one with slots (refused)."""
    ratio = 2 if rng.random() < 0.8 else 1
    q_max = log_int(rng, 1, 64)
    if ratio == 2:
        need = ratio + q_max - 1
        slots = max(0, need + rng.choice([-need, -2, -1, -1, 0, 0, 0, 1, 2, log_int(rng, 1, 64)]))
    else:
        slots = 0 if rng.random() < 0.6 else log_int(rng, 1, 16)
    build = {"slots": slots}
    if rng.random() < 0.3:
        build["head_dim"] = rng.choice([32, 128, 512])
    return {"ratio": ratio, "q_max": q_max}, build


register_space(
    Space(
        "compressor.ring",
        _compressor_ring,
        lambda params, build: 2e-4,
        simple={"ratio": 1},
        contains=lambda params, build: int(params["q_max"]) >= 1 and int(build.get("head_dim", 16)) >= 1,
        note="ratio 1/2, q_max 1-64, slots around r + q_max - 1 (short by 1-2, exact, larger, 0)",
    )
)


def _compressor_metadata(rng: random.Random) -> Spec:
    """Ratio 2 or 1, batch 1-3, head_dim 16-512, one schedule of up to 64 positions (as the
    compressor's), every step prefill, every step decode, or a switch to decode at any step."""
    ratio = 2 if rng.random() < 0.7 else 1
    name = _schedule_for_stream(rng)
    params = {"ratio": ratio}
    kind = rng.random()
    if kind < 0.6:
        params["decode_from"] = 1 if kind < 0.3 else rng.randint(0, len(parse_schedule_name(name)))
    return params, {"batch": _batch(rng), "head_dim": 16 * log_int(rng, 1, 32), "schedules": [name]}


def _compressor_metadata_cost(params: dict, build: dict) -> float:
    steps = parse_schedule_name(build["schedules"][0])
    return 2e-4 + 4e-5 * len(steps)


register_space(
    Space(
        "compressor.metadata",
        _compressor_metadata,
        _compressor_metadata_cost,
        simple={"ratio": 1, "batch": 1, "head_dim": 16},
        contains=lambda params, build: (
            len(build["schedules"]) == 1
            and 1 <= int(build.get("batch", 2)) <= 3
            and _width(build.get("head_dim", 16))
            and bool(parse_schedule_name(build["schedules"][0]))
        ),
        note="ratio 1/2, b 1-3, hd 16-512, <= 64 positions with rollbacks; all prefill, all decode or switch at any step",
    )
)


# --- attention ------------------------------------------------------------------------------------

_ATTN_MAX_SEQ = 64  # tiny-a's max_seq_len


def _attention_schedule(rng: random.Random) -> str:
    """A contiguous schedule (attention takes no rollbacks) within tiny-a's 64 positions: a prefill
    of 1-60 positions, sometimes chunked (1-4 chunks), then 0-14 decode steps of 1 token
    (upstream's shape) or up to q_max 2-8 tokens. A first step of one position leaves the ratio-2
    layers nothing to select ([b, S, 0] ids): an edge a kernel must handle too."""
    chunks = 1 if rng.random() < 0.6 else rng.randint(2, 4)
    prefill = log_int(rng, chunks, 60)
    lengths = composition(rng, prefill, chunks)
    q_max = rng.choice([1, 1, 1, 2, 3, 4, 6, 8])
    position = prefill
    for _ in range(log_int(rng, 0, 14)):
        if position >= _ATTN_MAX_SEQ:
            break
        step = min(rng.randint(1, q_max), _ATTN_MAX_SEQ - position)
        lengths.append(step)
        position += step
    steps, start = [], 0
    for length in lengths:
        steps.append((start, start + length))
        start += length
    return schedule_name(steps)


def _attention(rng: random.Random) -> Spec:
    """Config tiny-a (every role), both §10.1 index_k policies, bf16 or fp8 weights, batch 1-2
    (tiny-a's max_batch_size), input rows scaled now and then, one contiguous schedule."""
    params = {"config": "tiny-a", "index_k_policy": rng.choice(["upstream", "fixed"])}
    if rng.random() < 0.3:
        params["weights"] = "fp8"
    build: dict[str, Any] = {"batch": 1 if rng.random() < 0.65 else 2, "schedules": [_attention_schedule(rng)]}
    if rng.random() < 0.2:
        build["x_scale"] = rng.choice([0.1, 0.5, 2.0, 8.0])
    return params, build


def _attention_cost(params: dict, build: dict) -> float:
    steps = parse_schedule_name(build["schedules"][0])
    per_step = 0.012 * (1 + 0.28 * (int(build.get("batch", 2)) - 1))
    if params.get("weights") == "fp8":
        per_step *= 1.6
    return 0.015 + per_step * len(steps) + 2e-4 * steps[-1][1]


def _attention_contains(params: dict, build: dict) -> bool:
    """tiny-a, batch 1-2, one contiguous schedule within 64 positions."""
    steps = parse_schedule_name(build["schedules"][0])
    return (
        params.get("config", "tiny-a") == "tiny-a"
        and len(build["schedules"]) == 1
        and 1 <= int(build.get("batch", 2)) <= 2
        and steps[-1][1] <= _ATTN_MAX_SEQ
        and all(steps[i][0] == steps[i - 1][1] for i in range(1, len(steps)))
    )


register_space(
    Space(
        "attention",
        _attention,
        _attention_cost,
        simple={"index_k_policy": "upstream", "weights": "bf16", "batch": 1, "x_scale": 1.0},
        contains=_attention_contains,
        note="tiny-a, upstream/fixed policy, bf16/fp8 weights, b 1-2, contiguous schedules <= 64 positions: "
        "prefill 1-60 (1-4 chunks) + 0-14 decode steps of 1..q_max (<= 8)",
    )
)
