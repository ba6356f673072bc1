"""Spaces of the indexer, top-k, candidate blocks, window and addressing components.

Each draw writes (params, build) as a case file would, using only the `random.Random` it is
handed, and stays inside what the builder and the reference accept (no rejection needed):

- every compressed-row buffer is at least as wide as the rows its queries can see,
  T >= (start + S) // ratio, and never empty (T >= 1: the index judge fails on a zero-width
  selection, e.g. the indexer at start 0, ratio 2, one query);
- fp4-QDQ'd widths (index head_dim, scored D) are multiples of 32, fp8 q_lora too;
  rope_dim is even and <= head_dim; address block sizes are multiples of the ratio;
- start positions run from 0 past 2**16 (to 200000), with extra weight on the neighbourhoods
  of 2**8, 2**15, 2**16, 2**17 and of ring wrap-arounds (a known class of kernel bug breaks
  past a large start position);
- ids stay inside int32 after any offset, base or block-table translation.

Costs are estimates of the reference's build + judge time in seconds: linear models over each
component's dominant sizes, fitted to single-threaded timings of `v41_conformance.generate.build_golden`
plus `runner.judge_golden` over a few hundred draws, then doubled (a loaded machine is slower).
"""

from __future__ import annotations

import random
from typing import Any

from ..space import Spec, Space, log_int, register_space

INT32_MAX = 2**31 - 1
START_MAX = 200_000
EDGES = (2**8, 2**15, 2**16, 2**17)  # start positions where a narrow position type or a table ends


# --- shared helpers -------------------------------------------------------------------------------


def _start(rng: random.Random, high: int = START_MAX, wrap: int | None = None, far: bool = False) -> int:
    """A start position in [0, high]: 0, log-uniform, next to a power-of-two edge, or (with `wrap`)
    next to a multiple of a ring / block length; `far`: half the time in the top half of the range."""
    high = max(0, high)
    if far and high > 1 and rng.random() < 0.5:
        return rng.randint(high // 2, high)
    r = rng.random()
    if r < 0.08 or high == 0:
        return 0
    if r < 0.3:
        edges = [e for e in EDGES if e - 3 <= high]
        if edges:
            return max(0, min(high, rng.choice(edges) + rng.randint(-3, 3)))
    if r < 0.45 and wrap and wrap <= high:
        return max(0, min(high, wrap * log_int(rng, 1, high // wrap) + rng.randint(-1, 1)))
    return log_int(rng, 1, high)


def _offset(rng: random.Random, S: int, high: int = START_MAX) -> int:
    """The window part's length added to selected ids: 0, the chunk's S, a production 128, or anything."""
    return rng.choice([0, S, 128, log_int(rng, 1, high)])


def _rows_flags(rng: random.Random, T: int) -> list[list[bool]]:
    """1-3 explicit candidate rows of T flags (the builder repeats them over the queries)."""
    keep = rng.choice([0.1, 0.5, 0.9])
    return [[rng.random() < keep for _ in range(T)] for _ in range(rng.randint(1, 3))]


def _candidate_source(rng: random.Random, T: int) -> dict:
    """A candidate source's block mask spec: blocks of B rows, the top n of them (a pool smaller or
    larger than the selection's k: both the leak and the no-leak case)."""
    block = rng.choice([1, 2, 4, 8, 8, 16, 64, 128])
    nb = -(-T // block)
    return {"block_size": block, "topk_blocks": log_int(rng, 1, max(1, 2 * nb))}


def _topk_count(rng: random.Random, T: int, production: int = 512) -> int:
    """A top-k size: small, production, right at T (one less, equal, one more), or beyond it."""
    r = rng.random()
    if r < 0.45:
        return log_int(rng, 1, 64)
    if r < 0.6:
        return production
    if r < 0.8:
        return max(1, T + rng.randint(-1, 1))
    return log_int(rng, 1, max(1, 2 * T))


def _linear(coefficients: tuple[float, ...], features: list[float]) -> float:
    """A cost model: seconds = c0 + sum(c_i * feature_i) (coefficients fitted to measured times)."""
    return coefficients[0] + sum(c * f for c, f in zip(coefficients[1:], features))


# --- topk.torch_cpu -------------------------------------------------------------------------------

TOPK_KINDS = ("gauss_bf16", "few_values", "all_ninf", "ninf_scattered", "relu_zeros", "special", "distinct")


def _topk(rng: random.Random) -> Spec:
    """Both libstdc++ branches (partial_sort when k*64 <= n, else nth_element), their threshold
    (n = 64k and 64k - 1), k = n; every builder kind; largest / smallest, sorted / unsorted; now and
    then adversarial rows that reach the depth-limit fallbacks (`_topk_adversarial`)."""
    kind = rng.choice(TOPK_KINDS)
    branch = rng.choice(["partial", "nth", "nth", "threshold", "all"])
    if branch == "threshold":
        k = log_int(rng, 1, 1024)
        n = 64 * k - rng.randint(0, 1)
    else:
        n = log_int(rng, 1, 1 << 17)
        if branch == "partial" and n >= 64:
            k = log_int(rng, 1, n // 64)
        elif branch == "all":
            k = n
        else:
            k = log_int(rng, n // 64 + 1, n)
    rows = log_int(rng, 1, max(1, min(16, (1 << 21) // n)))
    build: dict[str, Any] = {"kind": kind, "shape": [rows, n]}
    if kind == "few_values":
        build["pool"] = sorted(rng.sample([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 5.0], rng.randint(1, 5)))
    elif kind == "ninf_scattered":
        build["finite_fraction"] = rng.choice([0.001, 0.01, 0.05, 0.3, 0.9])
    elif kind == "relu_zeros":
        build["shift"] = rng.choice([0.0, 0.5, 1.0, 2.0, 3.0])
    dtype = rng.choice(["f32", "f32", "bf16", "f16"])
    if dtype != "f32" or rng.random() < 0.5:
        build["dtype"] = dtype
    params = {"k": k, "sorted": rng.random() < 0.5}
    if rng.random() < 0.6:
        params["largest"] = rng.random() < 0.6
    if rng.random() < TOPK_ADVERSARIAL_SHARE:  # drawn last, so the other draws stay as they were
        return _topk_adversarial(rng, params)
    return params, build


TOPK_ADVERSARIAL_SHARE = 0.125
TOPK_ADVERSARIAL_MAX_N = 4096  # the adversary plays in Python (~0.2 s at 4096); bf16 levels fit below 8192


def _topk_adversarial(rng: random.Random, params: dict) -> Spec:
    """McIlroy-adversary rows (`kind: adversarial`) on the nth_element branch, where __introselect and
    the sort of the first k-1 have depth limits to exhaust; tie_step > 1 adds ties (and may defuse it)."""
    n = log_int(rng, 64, TOPK_ADVERSARIAL_MAX_N)
    k = log_int(rng, n // 64 + 1, n)
    build = {
        "kind": "adversarial",
        "shape": [rng.randint(1, 2), n],
        "target": rng.choice(["select", "sort"]),
        "tie_step": rng.choice([1, 1, 2, 2, 3]),
    }
    dtype = rng.choice(["f32", "bf16", "f16"])
    if dtype != "f32":
        build["dtype"] = dtype
    return {**params, "k": k}, build


def _topk_features(params: dict, build: dict) -> list[float]:
    rows, n = build["shape"]
    return [rows * n, rows]


TOPK_COST = (3e-4, 4e-8, 0.0)
TOPK_ADVERSARY_COST = 1e-4  # seconds per element of the one row the adversary plays (doubled)


def _topk_cost(params: dict, build: dict) -> float:
    played = TOPK_ADVERSARY_COST * build["shape"][1] if build.get("kind") == "adversarial" else 0.0
    return _linear(TOPK_COST, _topk_features(params, build)) + played


register_space(
    Space(
        "topk.torch_cpu",
        _topk,
        _topk_cost,
        simple={"kind": "gauss_bf16", "dtype": "f32", "sorted": True, "largest": True},
        note="rows 1-16, n 1-131072 (log), k on both branches, at the 64k threshold and = n; all 7 kinds; "
        "f32/bf16/f16; largest/smallest, sorted/unsorted; 1 in 8: adversarial rows (n 64-4096, nth_element)",
    )
)


# --- indexer.weights ------------------------------------------------------------------------------


def _weights(rng: random.Random) -> Spec:
    """Any batch, tokens, hidden size (production 4096-7168 included), heads and head_dim (power-of-two
    multipliers and not), scaled inputs."""
    b = rng.randint(1, 3)
    S = log_int(rng, 1, 64)
    dim = rng.choice([log_int(rng, 1, 8192), log_int(rng, 1, 1024), 128, 512, 5120, 7168])
    H = rng.choice([1, 2, 4, 8, 16, 32, 64, log_int(rng, 1, 64)])
    D = rng.choice([32, 64, 128, 256, log_int(rng, 1, 512)])
    if b * S * dim > 1 << 21:  # keep x (and the float64 linear) small
        S = max(1, (1 << 21) // (b * dim))
    build = {"shape": [b, S, dim], "heads": H}
    if rng.random() < 0.3:
        build["x_scale"] = rng.choice([0.01, 0.25, 4.0, 100.0])
    if rng.random() < 0.3:
        build["w_scale"] = rng.choice([0.001, 0.1, 1.0, 10.0])
    return {"index_head_dim": D}, build


def _weights_features(params: dict, build: dict) -> list[float]:
    b, S, dim = build["shape"]
    H = build["heads"]
    return [b * S * dim + H * dim, b * S * dim * H, b * S * H]


WEIGHTS_COST = (3e-4, 3e-8, 3e-10, 0.0)


def _weights_cost(params: dict, build: dict) -> float:
    return _linear(WEIGHTS_COST, _weights_features(params, build))


register_space(
    Space(
        "indexer.weights",
        _weights,
        _weights_cost,
        simple={"x_scale": 1.0},
        note="b 1-3, S 1-64, dim 1-8192 (and 5120/7168), H 1-64, index_head_dim 1-512 (any multiplier), scaled x and w",
    )
)


# --- indexer.scores -------------------------------------------------------------------------------


def _scores(rng: random.Random) -> Spec:
    """q [b, S, H, D], k [b, T, D], w [b, S, H]: fp4-QDQ'd (D a multiple of 32) or raw bf16 (any D),
    signed or positive head weights, scaled operands, one head (ReLU zeros) to production 64."""
    b = rng.randint(1, 3)
    S = log_int(rng, 1, 32)
    H = rng.choice([1, 2, 4, 8, 16, 32, 64])
    qdq = rng.random() < 0.75
    D = 32 * log_int(rng, 1, 8) if qdq else rng.choice([log_int(rng, 1, 256), 64, 128])
    T = log_int(rng, 1, 16384)
    while b * S * H * D * T > 2e8 and T > 1:  # the exact float64 einsum
        T //= 2
    build: dict[str, Any] = {"shape": [b, S, H, D, T]}
    if not qdq:
        build["qdq"] = False
    if rng.random() < 0.3:
        build["positive_w"] = True
    for key in ("q_scale", "k_scale", "w_scale"):
        if rng.random() < 0.2:
            build[key] = rng.choice([0.01, 0.5, 3.0, 30.0])
    return {}, build


def _scores_features(params: dict, build: dict) -> list[float]:
    b, S, H, D, T = build["shape"]
    return [b * S * H * T * D, b * S * H * T, b * S * H * D + b * T * D]


SCORES_COST = (3e-4, 3e-10, 3e-9, 8e-8)


def _scores_cost(params: dict, build: dict) -> float:
    return _linear(SCORES_COST, _scores_features(params, build))


register_space(
    Space(
        "indexer.scores",
        _scores,
        _scores_cost,
        simple={"qdq": True, "positive_w": False, "q_scale": 1.0, "k_scale": 1.0},
        note="b 1-3, S 1-32, H 1-64, D 32-256 (fp4 QDQ) or 1-256 raw, T 1-16384; signed/positive w, scaled q/k/w",
    )
)


# --- indexer.select -------------------------------------------------------------------------------

SCORE_KINDS = ("normal", "levels", "constant", "relu", "ninf_runs")
SELECT_ELEMENTS = 1 << 22  # b * S * T drawn at most


def _score_kind(rng: random.Random, build: dict) -> None:
    """A score kind (or a list of kinds, one per row in turn) and its own knobs."""
    kinds = rng.choice([[k] for k in SCORE_KINDS] + [rng.sample(SCORE_KINDS, rng.randint(2, 5))])
    build["kind"] = kinds[0] if len(kinds) == 1 else kinds
    if "normal" in kinds and rng.random() < 0.3:
        build["scale"] = rng.choice([0.01, 4.0, 1000.0])
    if "levels" in kinds:
        build["levels"] = rng.choice([1, 2, 3, 4, 8, 64])
    if "constant" in kinds and rng.random() < 0.5:
        build["value"] = rng.choice([0.0, -1.5, 0.375, 1e4])
    if "relu" in kinds and rng.random() < 0.5:
        build["shift"] = rng.choice([0.0, 1.0, 2.5])
    if "ninf_runs" in kinds and rng.random() < 0.7:
        build["run"] = rng.choice([1, 2, 3, 7, 64])


def _chunk(
    rng: random.Random, ratio: int, elements: int, most_s: int = 64, b: int | None = None, far: bool = False
) -> tuple[int, int, int]:
    """(b, S, start) of a prefill, decode step or chunk whose b * S * ((start + S) // ratio) stays
    within `elements`, never seeing zero rows at its end (`far`: starts biased to the top)."""
    b = b or rng.choice([1, 1, 2, 3])
    shape = rng.choice(["decode", "chunk"] if far else ["prefill", "decode", "chunk"])
    if shape == "prefill":
        S = log_int(rng, 1, most_s)
        start = 0
    else:
        S = 1 if shape == "decode" else log_int(rng, 1, min(32, most_s))
        high = max(0, elements // (b * S) * ratio - S)
        start = _start(rng, min(START_MAX, high), wrap=rng.choice([8, 64, 128]), far=far)
    if (start + S) // ratio < 1:  # ratio 2, one query at 0: nothing visible (upstream skips it)
        S = 2 - start
    return b, S, start


def _select(rng: random.Random) -> Spec:
    """Scores [b, S, T] (T >= the rows the last query sees, plus stale slack rows holding large
    values), every score kind and mixed rows, explicit score rows with -inf, ratios 1 and 2,
    starts 0..200000, index_topk small / 512 / ~T / > T (both top-k branches), candidate masks
    from a source or explicit rows under both leak policies, any offset."""
    ratio = rng.choice([1, 2])
    b, S, start = _chunk(rng, ratio, SELECT_ELEMENTS, most_s=64)
    seen = (start + S) // ratio
    slack = rng.choice([0, 0, log_int(rng, 1, 64)])
    T = seen + slack
    params: dict[str, Any] = {
        "start": start,
        "ratio": ratio,
        "index_topk": _topk_count(rng, seen),
        "offset": _offset(rng, S),
    }
    if rng.random() < 0.4:
        params["candidate_leak"] = rng.choice(["upstream", "drop"])
    build: dict = {}
    if b * S * T <= 96 and rng.random() < 0.2:  # explicit rows: -inf anywhere, ties, a huge score
        pool = [float("-inf"), 0.0, 0.5, 1.0, 2.0, 300.0]
        build["values"] = [[[rng.choice(pool) for _ in range(T)] for _ in range(S)] for _ in range(b)]
    else:
        build["shape"] = [b, S, T]
        _score_kind(rng, build)
    if rng.random() < 0.4:
        build["future"] = rng.choice([1e4, 3e4, 1e30])
    r = rng.random()
    if r < 0.2 and T <= 64:
        build["candidates"] = {"rows": _rows_flags(rng, T)}
    elif r < 0.45:
        build["candidates"] = _candidate_source(rng, T)
    return params, build


def _select_shape(build: dict) -> tuple[int, int, int]:
    if "values" in build:
        v = build["values"]
        return len(v), len(v[0]), len(v[0][0])
    return tuple(build["shape"])


def _select_features(params: dict, build: dict) -> list[float]:
    b, S, T = _select_shape(build)
    source = isinstance(build.get("candidates"), dict) and "block_size" in build["candidates"]
    return [b * S, b * S * T, b * S * T if source else 0]


SELECT_COST = (1e-3, 2e-5, 2.5e-8, 5e-8)


def _select_cost(params: dict, build: dict) -> float:
    return _linear(SELECT_COST, _select_features(params, build))


register_space(
    Space(
        "indexer.select",
        _select,
        _select_cost,
        simple={"kind": "normal", "candidate_leak": "upstream", "offset": 0},
        note="b 1-3, S 1-64, start 0-200000 (edges 2^8..2^17), ratio 1|2, T >= seen (+stale slack), all score "
        "kinds + mixed + explicit -inf rows, index_topk 1..2T, candidates (source/rows) x leak policies",
    )
)


# --- indexer (the whole forward) ------------------------------------------------------------------


def _forward(rng: random.Random) -> Spec:
    """The whole indexer: small configs mostly, the production one (dim 5120, q_lora 1280, 32 x 128,
    rope 64) now and then; bf16 or fp8 wq_b; starts 0..200000 (the longest with narrow keys and one
    sequence, so the key cache stays affordable); cache rows beyond T; YaRN or plain RoPE tables;
    candidate consumers under both leak policies."""
    ratio = rng.choice([1, 2])
    r = rng.random()
    production, long = r < 0.08, 0.08 <= r < 0.25
    b = None
    if production:  # docs/tiers.md: dim 5120, q_lora 1280, 32 heads x 128, RoPE 64
        H, D, rope_dim, dim, q_lora = 32, 128, 64, 5120, 1280
        key_budget = 1 << 20
    elif long:  # a long context (start up to 200000) with narrow keys, so the cache stays affordable
        H, D, b = rng.choice([1, 2, 4, 8]), rng.choice([32, 32, 32, 64]), 1
        rope_dim = rng.choice([2, 16, 32])
        dim, q_lora = rng.choice([64, 128]), rng.choice([32, 64])
        key_budget = 1 << 22
    else:
        H = rng.choice([1, 2, 4, 8, 16])
        D = rng.choice([32, 32, 64, 64, 128])
        rope_dim = rng.choice([2, 16, 32, 64, 2 * rng.randint(1, D // 2)])
        rope_dim = min(rope_dim, D)
        dim = rng.choice([128, log_int(rng, 1, 1024)])
        q_lora = 32 * log_int(rng, 1, 16)
        key_budget = 1 << 21  # b * T * D key elements (fp4 QDQ dominates)
    weights = rng.choice(["bf16", "fp8", "fp8"] if production else ["bf16", "bf16", "fp8"])
    if weights == "bf16" and not production and rng.random() < 0.3:
        q_lora = log_int(rng, 1, 512)  # a bf16 wq_b takes any q_lora
    b, S, start = _chunk(rng, ratio, key_budget // D, most_s=8 if production or long else 32, b=b, far=long)
    T = (start + S) // ratio
    params: dict[str, Any] = {
        "start": start,
        "ratio": ratio,
        "rope_dim": rope_dim,
        "index_topk": _topk_count(rng, T),
        "offset": _offset(rng, S),
    }
    if weights == "fp8":
        params["weights"] = "fp8"
    if rng.random() < 0.3:
        params["candidate_leak"] = rng.choice(["upstream", "drop"])
    build = {"shape": [b, S], "dim": dim, "q_lora_rank": q_lora, "heads": H, "head_dim": D}
    if rng.random() < 0.3:
        build["cache_rows"] = T + log_int(rng, 1, 64)
    if rng.random() < 0.25:
        build["base"] = rng.choice([10000.0, 160000.0])
        build["original_seq_len"] = rng.choice([0, 4096, 65536])
        build["factor"] = rng.choice([4.0, 16.0, 40.0])
    r = rng.random()
    if r < 0.1 and T <= 64:
        build["candidates"] = {"rows": _rows_flags(rng, T)}
    elif r < 0.35:
        build["candidates"] = _candidate_source(rng, T)
    return params, build


def _forward_features(params: dict, build: dict) -> list[float]:
    b, S = build["shape"]
    start, ratio = params["start"], params["ratio"]
    T = (start + S) // ratio
    rows = max(T, build.get("cache_rows", T))
    H, D, q_lora, dim = build["heads"], build["head_dim"], build["q_lora_rank"], build["dim"]
    fp8 = params.get("weights") == "fp8"
    return [
        b * rows * D,  # index keys: random + fp4 QDQ
        (start + S) * params["rope_dim"],  # the RoPE table up to start + S
        H * D * q_lora,  # wq_b
        H * D * q_lora if fp8 else 0,  # its fp8 form and the blocked GEMM
        b * S * (q_lora * H * D + dim * H),  # the query and head weights
        b * S * H * T * D,  # float64 scores
        b * S * T,  # masks, candidates, top-k
    ]


FORWARD_COST = (3e-3, 1e-7, 2e-8, 4e-8, 2e-8, 2e-9, 5e-10, 2e-7)


def _forward_cost(params: dict, build: dict) -> float:
    return _linear(FORWARD_COST, _forward_features(params, build))


register_space(
    Space(
        "indexer",
        _forward,
        _forward_cost,
        simple={"weights": "bf16", "candidate_leak": "upstream", "offset": 0},
        note="b 1-3, S 1-32, start 0-200000, ratio 1|2, H 1-16 x D 32-128, q_lora 1-512, rope 2..D; production "
        "(5120/1280/32x128/64) 8%; bf16|fp8 wq_b, cache rows > T, YaRN tables, candidate consumers x leak policies",
    )
)


# --- candidates.select ----------------------------------------------------------------------------


def _candidates(rng: random.Random) -> Spec:
    """Logits [b, S, W] as a source sees them (rows >= compress_lens at -inf), W >= the rows the last
    query sees; ratio 1 or 2 and starts 0..200000 (query 0 at ratio 2 sees nothing: no pin); block
    sizes 1..128 (partial last block), topk_blocks from 1 to beyond the block count (production
    2048 of 8); tied block maxima; a low newest row kept only by the pin; explicit logits with
    arbitrary compress_lens."""
    if rng.random() < 0.12:  # explicit logits and per-query lens (not monotone)
        b, S, W = rng.randint(1, 2), rng.randint(1, 4), rng.randint(1, 24)
        lens = [rng.randint(0, W) for _ in range(S)]
        pool = [0.0, 1.0, 2.0, 6.0, -3.0]
        values = [
            [[rng.choice(pool) if j < lens[t] else float("-inf") for j in range(W)] for t in range(S)] for _ in range(b)
        ]
        block = rng.choice([1, 2, 3, 4, 8])
        return {"topk_blocks": log_int(rng, 1, -(-W // block) + 1), "block_size": block}, {
            "values": values,
            "compress_lens": lens,
        }
    ratio = rng.choice([1, 1, 2])
    b, S, start = _chunk(rng, ratio, 1 << 21, most_s=32)
    W = max(1, (start + S) // ratio + rng.choice([0, 0, rng.randint(1, 40)]))
    block = rng.choice([1, 2, 3, 4, 8, 8, 16, 64, 128])
    nb = -(-W // block)
    r = rng.random()
    if r < 0.15:
        topk_blocks = 2048
    elif r < 0.35:
        topk_blocks = max(1, nb + rng.randint(-2, 2))
    else:
        topk_blocks = log_int(rng, 1, max(1, 2 * nb))
    build = {"shape": [b, S, W], "start": start}
    if ratio != 1 or rng.random() < 0.3:
        build["ratio"] = ratio
    kind = rng.choice(["normal", "normal", "levels", "constant"])
    if kind != "normal" or rng.random() < 0.3:
        build["kind"] = kind
    if kind == "levels":
        build["levels"] = rng.choice([1, 2, 3, 8])
    if kind == "constant" and rng.random() < 0.5:
        build["value"] = rng.choice([0.0, -2.0, 1e4])
    if rng.random() < 0.25:
        build["newest"] = rng.choice([-4.0, -1e4, 0.0])
    return {"topk_blocks": topk_blocks, "block_size": block}, build


def _candidates_features(params: dict, build: dict) -> list[float]:
    if "values" in build:
        return [0.0]
    b, S, W = build["shape"]
    return [b * S * W]


CANDIDATES_COST = (1e-3, 4e-8)


def _candidates_cost(params: dict, build: dict) -> float:
    return _linear(CANDIDATES_COST, _candidates_features(params, build))


register_space(
    Space(
        "candidates.select",
        _candidates,
        _candidates_cost,
        simple={"kind": "normal", "ratio": 1},
        note="b 1-3, S 1-32, start 0-200000, ratio 1|2, W >= seen (+slack), block 1-128, topk_blocks 1..2nb "
        "and 2048; normal/levels/constant logits, low newest row, explicit logits with arbitrary lens",
    )
)


# --- candidates.restore ---------------------------------------------------------------------------


def _restore(rng: random.Random) -> Spec:
    """Compact offsets of a consumer's picks over a source's kept blocks, back to logical rows: mask
    form, block form ascending and in a shuffled runtime order; any width, block size, pool and k;
    request offsets up to the int32 limit; starts inside the width (queries that see part of it)."""
    b = rng.randint(1, 3)
    S = log_int(rng, 1, 32)
    W = log_int(rng, 1, 1 << 17)  # rows past 2**16
    if b * S * W > 1 << 21:
        S = max(1, (1 << 21) // (b * W))
    block = rng.choice([1, 2, 3, 4, 8, 8, 16, 64, 128])
    nb = -(-W // block)
    form = rng.choice(["mask", "blocks", "shuffled"])
    top = log_int(rng, 1, nb if form == "shuffled" else 2 * nb)  # a shuffle permutes `top` kept slots <= nb
    build = {"shape": [b, S, W], "topk_blocks": top, "k": log_int(rng, 1, min(W, 2048) + 8)}
    if form != "mask":
        build["form"] = "blocks"
        if form == "shuffled":
            build["shuffle"] = True
    if W < S or rng.random() < 0.5:
        build["start"] = rng.randint(0, W - 1) if rng.random() < 0.7 else rng.choice([0, W - 1])
    params = {"block_size": block}
    r = rng.random()
    if r < 0.7:
        params["request_offset"] = rng.choice(
            [0, log_int(rng, 1, 1 << 17), rng.choice(EDGES) + rng.randint(-2, 2), INT32_MAX - W - rng.randint(0, 1000)]
        )
    return params, build


def _restore_features(params: dict, build: dict) -> list[float]:
    b, S, W = build["shape"]
    shuffled = bool(build.get("shuffle"))
    return [b * S * W, b * S if shuffled else 0, b * S * build["k"] * build["topk_blocks"] if shuffled else 0]


RESTORE_COST = (5e-4, 1e-7, 2e-5, 4e-9)


def _restore_cost(params: dict, build: dict) -> float:
    return _linear(RESTORE_COST, _restore_features(params, build))


register_space(
    Space(
        "candidates.restore",
        _restore,
        _restore_cost,
        simple={"form": "mask", "shuffle": False, "request_offset": 0},
        note="b 1-3, S 1-32, W 1-131072, block 1-128, topk_blocks 1..2nb, k 1..W+8; mask / blocks / shuffled "
        "blocks; starts inside W; request_offset 0..2^31-W",
    )
)


# --- window.indices -------------------------------------------------------------------------------


def _window(rng: random.Random) -> Spec:
    """Prefill (seqlen 1-4096), decode and chunk steps at starts 0..200000 (next to 2^8..2^17 and ring
    wrap-arounds), windows 1-4096 (production 128), chunk rings the default, exact (win + S - 1),
    undersized (win .. win + S - 2) or oversized."""
    win = rng.choice([1, 4, 8, 128, 128, log_int(rng, 1, 4096)])
    mode = rng.choice(["prefill", "decode", "decode", "chunk", "chunk"])
    if mode == "prefill":
        seqlen = log_int(rng, 1, 4096)
        while seqlen * min(seqlen, win) > 1 << 21:
            seqlen //= 2
        return {"mode": "prefill", "seqlen": seqlen, "win": win}, {}
    if mode == "decode":
        return {"mode": "decode", "start": _start(rng, wrap=win), "win": win}, {}
    seqlen = log_int(rng, 1, 256)
    while seqlen * win > 1 << 21:
        seqlen //= 2
    params = {
        "mode": "chunk",
        "start": _start(rng, wrap=rng.choice([win, win + seqlen - 1])),
        "seqlen": seqlen,
        "win": win,
    }
    ring = rng.choice(["default", "exact", "under", "over"])
    if ring == "exact":
        params["ring_size"] = win + seqlen - 1
    elif ring == "under":
        params["ring_size"] = rng.randint(win, max(win, win + seqlen - 2))
    elif ring == "over":
        params["ring_size"] = win + seqlen - 1 + log_int(rng, 1, 4096)
    return params, {}


def _window_features(params: dict, build: dict) -> list[float]:
    win, mode = params["win"], params["mode"]
    if mode == "prefill":
        return [params["seqlen"] * min(params["seqlen"], win)]
    return [win if mode == "decode" else params["seqlen"] * win]


WINDOW_COST = (2e-4, 2e-8)


def _window_cost(params: dict, build: dict) -> float:
    return _linear(WINDOW_COST, _window_features(params, build))


register_space(
    Space(
        "window.indices",
        _window,
        _window_cost,
        simple={"mode": "prefill"},
        note="prefill seqlen 1-4096; decode/chunk start 0-200000 (edges 2^8..2^17, ring wraps); win 1-4096 "
        "(128); chunk seqlen 1-256, ring default/exact/undersized/oversized",
    )
)


# --- address.prefill / address.decode --------------------------------------------------------------


def _lanes(rng: random.Random) -> tuple[int, int, int, int]:
    """(b, S, K, rows): batch, queries, lanes and the logical rows ids are drawn below."""
    b = rng.randint(1, 3)
    S = log_int(rng, 1, 32)
    K = rng.choice([log_int(rng, 1, 2048), 512, 64])
    rows = rng.choice([log_int(rng, 1, START_MAX), rng.choice(EDGES) + rng.randint(-2, 2), K // 2 + 1])
    while b * S * K > 1 << 18 and S > 1:
        S //= 2
    return b, S, K, max(1, rows)


def _explicit_ids(rng: random.Random, b: int, S: int, K: int, rows: int, one_valid: bool = False) -> list:
    """Explicit ids in any order with -1 lanes anywhere (the builder's own are ascending, -1 last);
    `one_valid`: at least one lane holds a row (address.decode's builder sizes its tables from the
    largest id, and an all -1 case gets an empty table the reference cannot index)."""
    ids = [[[rng.choice([-1, rng.randrange(rows)]) for _ in range(K)] for _ in range(S)] for _ in range(b)]
    if one_valid and all(v < 0 for plane in ids for row in plane for v in row):
        ids[rng.randrange(b)][rng.randrange(S)][rng.randrange(K)] = rng.randrange(rows)
    return ids


def _address_prefill(rng: random.Random) -> Spec:
    """Ids [b, S, K] below up to 200000 rows (ascending with a -1 tail, or explicit in any order with
    -1 anywhere), bases from 0 past 2^16 and 2^24 up to the int32 limit."""
    b, S, K, rows = _lanes(rng)
    base = rng.choice(
        [
            0,
            log_int(rng, 1, 1 << 17),
            rng.choice(EDGES + (2**24,)) + rng.randint(-2, 2),
            log_int(rng, 1, INT32_MAX - rows),
            INT32_MAX - rows - rng.randint(0, 3),
        ]
    )
    if b * S * K <= 64 and rng.random() < 0.25:
        return {"base": base}, {"ids": _explicit_ids(rng, b, S, K, rows)}
    return {"base": base}, {"shape": [b, S, K], "rows": rows}


def _address_features(params: dict, build: dict) -> list[float]:
    """Rows drawn one by one (a randperm of `rows` each), lanes, and the decode tables' pool."""
    if "ids" in build:
        b, S, K, rows = len(build["ids"]), len(build["ids"][0]), len(build["ids"][0][0]), 0
    else:
        (b, S, K), rows = build["shape"], build["rows"]
    pool = 0
    if "block_size" in params and "block_table" not in build:
        per_block = params["block_size"] // params["ratio"]
        pool = build.get("pool", 4 * -(-max(rows, 1) // per_block))
    return [b * S, b * S * rows, b * S * K, b * pool]


ADDRESS_COST = (2e-4, 1.6e-5, 6e-9, 3e-8, 2e-8)


def _address_cost(params: dict, build: dict) -> float:
    return _linear(ADDRESS_COST, _address_features(params, build))


register_space(
    Space(
        "address.prefill",
        _address_prefill,
        _address_cost,
        note="b 1-3, S 1-32, K 1-2048 (512), rows 1-200000 (edges 2^8..2^17), explicit unordered ids with -1 "
        "lanes; base 0..2^31-1-rows (past 2^16, 2^24)",
    )
)


def _address_decode(rng: random.Random) -> Spec:
    """Ids [b, S, K] through block tables: block sizes 1-512 (powers of two and not, a multiple of the
    ratio), ratio 1 or 2, a pool of physical blocks from just enough to large (slots up to the int32
    limit), one table per request or an explicit shared [nblocks] table, explicit unordered ids."""
    ratio = rng.choice([1, 2])
    block = rng.choice([1, 2, 8, 16, 64, 128, 128, 256, log_int(rng, 1, 512)])
    block += block % ratio  # a block holds block / ratio compressed rows
    per_block = block // ratio
    b, S, K, rows = _lanes(rng)
    need_blocks = -(-rows // per_block)  # enough for any id below rows
    params = {"block_size": block, "ratio": ratio}
    build: dict = {"shape": [b, S, K], "rows": rows}
    if b * S * K <= 64 and rng.random() < 0.25:
        build = {"ids": _explicit_ids(rng, b, S, K, rows, one_valid=True)}
    r = rng.random()
    if r < 0.2 and need_blocks <= 64:  # explicit table: shared [nblocks] or per request [b, nblocks]
        physical = max(need_blocks, rng.choice([need_blocks * 8, INT32_MAX // per_block]))  # slots < 2^31
        table = [rng.sample(range(physical), need_blocks) for _ in range(b)]
        build["block_table"] = table[0] if rng.random() < 0.5 else table
    elif r < 0.6:
        largest = min(1 << 22, INT32_MAX // per_block)  # every slot fits in int32
        build["pool"] = rng.choice(
            [need_blocks, need_blocks + rng.randint(1, 8), max(need_blocks, log_int(rng, need_blocks, largest))]
        )
    return params, build


register_space(
    Space(
        "address.decode",
        _address_decode,
        _address_cost,
        note="b 1-3, S 1-32, K 1-2048, rows 1-200000, block 1-512 (multiple of ratio), ratio 1|2, pool just "
        "enough..2^22 (slots < 2^31), explicit shared/per-request tables, explicit unordered ids",
    )
)
