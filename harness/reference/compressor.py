"""The V4.1 Compressor (M:429-485, `docs/v41-reference.md` §3) as pure functions over chunks, with
the harness's explicit state ring and the runtime's output-row metadata (seed 000 §A.1-A.2).

What it computes (pre-RoPE latent rows, bf16):
- ratio 1 (M:461-462): every position is its own group, `rms_norm(linear_bf16(x, wkv))`.
- ratio 2 (M:466-482): fp32 projections `kv = x.float() @ wkv.T`, `score = x.float() @ wgate.T`;
  per completed group of 2 positions and per channel, a softmax over the 2 scores (fp32), the
  weighted sum of the 2 latents (fp32), one cast to bf16, then RMSNorm -> bf16.
- Other ratios are refused, as the released Compressor does.
Row j stands for group j = positions j*r .. j*r + r - 1; its position is j*r (its first token,
§2.4), which `kv_finish.py` uses for RoPE.

The step interface generalises upstream (§3.5, §10.3; upstream has one prefill chunk at
position 0, then one token per call; this is the harness's definition, not upstream's):

    compressor_step(x_chunk, start, ring, weights, ratio) -> StepResult(rows, row_positions, ring)

Ring layout (ratio 2): fp32 [b, S, 2, hd]; slot s holds one position's (score, latent) with
index 0 = score and index 1 = latent; position p lives in slot p mod S. A step first writes every
new position start .. start+n-1 into the ring (in position order), then pools every group that
completes inside the chunk ((p + 1) % r == 0) by reading its r slots back. This is the decode
reference of seed 000 §A.2; it reduces to upstream's Compressor for a prefill at 0 and for
single-token decode. Writing before reading is safe only if S >= r + n - 1 (`ring_capacity`):
up to r - 1 older inputs of the open group must survive n new writes. `compressor_step` refuses
a smaller ring unless `check_capacity=False`, which exists to demonstrate the overwrite.
A new ring has score slots -inf and latent slots 0 (upstream's buffer init), never read because
a slot is always written before a group reads it. Steps return a new ring, never mutate theirs.

Ratio 1 keeps no state. Its ring is always an empty fp32 [b, 0, 2, hd] tensor (None is accepted
as input), so a runner can pass state in and out uniformly.

Rejected drafts: the next step starts at the accepted position (start < the previous end) and
simply overwrites those slots; rows whose group reaches a rejected position are discarded by the
caller (`compressor_run` does this). Slots that still hold rejected inputs are never live.

Harness choice, schedule invariance: every projection (and norm) is exactly rounded (the float64
sum of exact bf16 x bf16 products, rounded once; `numerics._accumulate`), so a position's fp32/bf16
result does not depend on how many rows its GEMM had. Upstream's fp32 GEMM rounding can differ
from this by GEMM-shape ulps (§10.3); the harness wants chunked and one-shot goldens to be
bit-identical instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from v41_conformance.reference.numerics import exact_rms_norm, linear_bf16_acc, linear_f32, rms_norm
from v41_conformance.schedules import max_step, validate_schedule

SUPPORTED_RATIOS = (1, 2)
SCORE, LATENT = 0, 1  # index of the (score, latent) axis of a ring slot


@dataclass(frozen=True)
class CompressorWeights:
    """One kv source's Compressor parameters (`Compressor.__init__`, M:429-485, §3.1).

    wkv:    [hd, dim]; bf16 at ratio 1, fp32 at ratio 2 (a bf16 checkpoint tensor is promoted
            exactly, as upstream builds the Linear in fp32).
    norm_w: [hd] RMSNorm weight (bf16 storage; promoted to fp32 inside the norm).
    wgate:  [hd, dim] fp32 gate projection, ratio 2 only.
    eps:    RMSNorm eps (production norm_eps 1e-20).
    """

    wkv: torch.Tensor
    norm_w: torch.Tensor
    wgate: torch.Tensor | None = None
    eps: float = 1e-20

    @property
    def head_dim(self) -> int:
        return int(self.wkv.shape[0])

    @property
    def dim(self) -> int:
        return int(self.wkv.shape[1])


class StepResult(NamedTuple):
    """rows bf16 [b, G, hd] (pre-RoPE latents of the G groups completed by the step, position
    order); row_positions int64 [G] (j*r, each group's first position); ring fp32 [b, S, 2, hd]
    (a new tensor; [b, 0, 2, hd] at ratio 1)."""

    rows: torch.Tensor
    row_positions: torch.Tensor
    ring: torch.Tensor


class RunResult(NamedTuple):
    """A whole schedule: accepted rows bf16 [b, G, hd] and positions int64 [G] (rows of rejected
    drafts removed), the final ring, and every step's own result (for per-step checks)."""

    rows: torch.Tensor
    row_positions: torch.Tensor
    ring: torch.Tensor
    steps: list[StepResult]


class CompressorMetadata(NamedTuple):
    """Output rows one request reserves for one step (seed 000 §A.1.1).

    row_positions int64 [R]: RoPE position of each reserved row (j*r; 0 for a placeholder);
    store_slots int64 [R]: compressed row index j written to the cache, -1 for a placeholder;
    valid bool [R]: True where the row is a real completed group.
    """

    row_positions: torch.Tensor
    store_slots: torch.Tensor
    valid: torch.Tensor


# ---------------------------------------------------------------------------------------------
# Ratio, ring capacity and live slots
# ---------------------------------------------------------------------------------------------


def check_ratio(ratio: int) -> None:
    """Refuse what the released Compressor refuses: only ratios 1 and 2 exist in V4.1."""
    if ratio not in SUPPORTED_RATIOS:
        raise ValueError(
            f"compress ratio {ratio} is not supported: the V4.1 Compressor implements ratios 1 and 2 "
            "only (ratio 0 layers have no Compressor; 4 and 128 were V4)"
        )


def ring_capacity(ratio: int, q_max: int) -> int:
    """Smallest safe ring for steps of up to q_max positions: r + q_max - 1 (0 at ratio 1).

    Example: ring_capacity(2, 6) == 7 (the production default for nextn = 5, seed 000 §A.2).
    """
    check_ratio(ratio)
    if q_max < 1:
        raise ValueError(f"q_max must be >= 1, got {q_max}")
    return 0 if ratio == 1 else ratio + q_max - 1


def check_ring_capacity(slots: int, ratio: int, q_max: int) -> None:
    """Raise ValueError when a ring of `slots` cannot take steps of q_max positions.

    A step writes all its positions before it pools, so the r - 1 inputs of a group opened before
    the step must survive q_max new writes: the newest write, at start + q_max - 1, lands in the
    slot of position start + q_max - 1 - S, which must be older than the open group's first
    position start - (r - 1). Hence S >= r + q_max - 1.
    """
    need = ring_capacity(ratio, q_max)
    if slots < need:
        raise ValueError(
            f"compressor ring of {slots} slots is too small for ratio {ratio} and steps of up to "
            f"{q_max} positions: needs S >= r + q_max - 1 = {need}. With S = {slots}, writing "
            f"position p overwrites position p - {slots} before a group that still needs it is "
            f"pooled. Allocate new_ring(b, {need}, hd) or use shorter steps."
        )


def new_ring(b: int, slots: int, head_dim: int) -> torch.Tensor:
    """Fresh ring fp32 [b, S, 2, hd]: score slots -inf, latent slots 0 (upstream's buffer init)."""
    if b < 1 or slots < 0 or head_dim < 1:
        raise ValueError(f"new_ring needs b >= 1, slots >= 0, head_dim >= 1; got {b}, {slots}, {head_dim}")
    ring = torch.zeros(b, slots, 2, head_dim, dtype=torch.float32)
    ring[:, :, SCORE] = -torch.inf
    return ring


def completed_groups(start: int, end: int, ratio: int) -> range:
    """Groups j whose last position j*r + r - 1 lies in [start, end): range(start//r, end//r)."""
    check_ratio(ratio)
    if not 0 <= start <= end:
        raise ValueError(f"need 0 <= start <= end, got start {start}, end {end}")
    return range(start // ratio, end // ratio)


def pending_positions(position_end: int, ratio: int) -> range:
    """Positions of the open (incomplete) group after `position_end` positions were processed."""
    check_ratio(ratio)
    if position_end < 0:
        raise ValueError(f"position_end must be >= 0, got {position_end}")
    return range(position_end - position_end % ratio, position_end)


def live_slots(position_end: int, ratio: int, slots: int) -> torch.Tensor:
    """int64 [P]: ring slots holding inputs a future group still needs (the open group's pending
    positions, in position order). Empty at ratio 1 and on group boundaries.

    Example: live_slots(7, 2, 7) -> tensor([6]); live_slots(9, 2, 7) -> tensor([1]).
    """
    pending = pending_positions(position_end, ratio)
    if len(pending) and slots < 1:
        raise ValueError(f"{len(pending)} pending positions need a ring with slots >= 1, got {slots}")
    return torch.tensor([p % slots for p in pending], dtype=torch.int64)


def kept_positions(start: int, end: int, ratio: int) -> list[int]:
    """The positions whose ring slots a step [start, end) must keep (docs/schedules.md, "Which slots
    to keep"). The next step continues at `end` or rolls back to any start in [start, end) (a
    rollback undoes part of the previous step only), and reads the open group's positions at its
    start; together those are every position of [start - start % ratio, end) except the last of
    each group. The capacity rule S >= r + n - 1 is what makes them fit (at most n + r - 1).

    Example: kept_positions(5, 9, 2) -> [4, 6, 8]; kept_positions(4, 8, 2) -> [4, 6].
    """
    check_ratio(ratio)
    return [p for p in range(start - start % ratio, end) if p % ratio != ratio - 1]


def pending_state(ring: torch.Tensor, position_end: int, ratio: int) -> torch.Tensor:
    """fp32 [b, P, 2, hd]: the live slots' contents in position order (comparable across S)."""
    _check_ring(ring)
    return ring[:, live_slots(position_end, ratio, ring.shape[1])]


# ---------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------


def compressor_projections(x_chunk: torch.Tensor, weights: CompressorWeights) -> torch.Tensor:
    """Ratio-2 fp32 projections of each position in ring layout: [b, n, 2, hd] = (score, latent).

    One GEMM per projection over the chunk; each position's result is exactly rounded and so does
    not depend on the chunk (module docstring, schedule invariance).
    """
    wkv, wgate = _ratio2_weights(weights)
    _check_x(x_chunk, weights)
    xf = x_chunk.float()  # [b, n, dim]
    return torch.stack([linear_f32(xf, wgate), linear_f32(xf, wkv)], dim=2)  # [b, n, 2, hd]


def pool_group(group: torch.Tensor) -> torch.Tensor:
    """fp32 [b, r, 2, hd] (one group's slots) -> fp32 [b, hd]: per channel, softmax over the r
    scores and the weighted sum of the r latents, as upstream's decode pooling (M:476-482)."""
    if group.dtype != torch.float32 or group.ndim != 4 or group.shape[2] != 2:
        raise ValueError(f"pool_group takes fp32 [b, r, 2, hd], got {group.dtype} {tuple(group.shape)}")
    score = group[:, :, SCORE].contiguous()  # [b, r, hd]
    latent = group[:, :, LATENT].contiguous()  # [b, r, hd]
    # softmax and weighted sum in float64, rounded once to fp32: portable across CPUs
    weights = torch.softmax(score.double(), dim=1)  # [b, r, hd]
    return (latent.double() * weights).sum(dim=1).float()


def compressor_step(
    x_chunk: torch.Tensor,
    start: int,
    ring: torch.Tensor | None,
    weights: CompressorWeights,
    ratio: int,
    *,
    check_capacity: bool = True,
) -> StepResult:
    """Process positions start .. start+n-1 (x_chunk bf16 [b, n, dim]); see the module docstring.

    Ratio 2 needs a ring fp32 [b, S, 2, hd] (`new_ring`) with S >= r + n - 1 unless
    check_capacity=False. Returns the rows of the groups completed in the chunk and a new ring.
    Example: a prefill of 7 positions then one token:
        r0 = new_ring(1, 8, hd); s0 = compressor_step(x[:, :7], 0, r0, w, 2)    # rows 0, 1, 2
        s1 = compressor_step(x[:, 7:8], 7, s0.ring, w, 2)                        # row 3
    """
    check_ratio(ratio)
    _check_x(x_chunk, weights)
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    b, n, _ = x_chunk.shape
    hd = weights.head_dim
    end = start + n
    positions = torch.tensor([j * ratio for j in completed_groups(start, end, ratio)], dtype=torch.int64)
    if ratio == 1:
        if ring is not None:
            _check_ring(ring, b, hd)
            if ring.shape[1] != 0:
                raise ValueError(
                    f"ratio 1 keeps no state: pass ring=None or a [b, 0, 2, hd] tensor, got {tuple(ring.shape)}"
                )
        if weights.wkv.dtype != torch.bfloat16:
            raise ValueError(f"ratio 1 wkv is a bf16 Linear (§3.1), got {weights.wkv.dtype}")
        return StepResult(finish_row(linear_bf16_acc(x_chunk, weights.wkv), weights), positions, new_ring(b, 0, hd))

    if ring is None:
        raise ValueError("ratio 2 needs a ring: pass new_ring(b, ring_capacity(2, q_max), hd)")
    _check_ring(ring, b, hd)
    slots = ring.shape[1]
    if slots < 1:
        raise ValueError(f"ratio 2 needs a ring with at least one slot, got {tuple(ring.shape)}")
    if check_capacity:
        check_ring_capacity(slots, ratio, max(n, 1))
    ring = _written(ring, compressor_projections(x_chunk, weights), start)  # write every new position first ...
    rows = [finish_row(pool_group(group).unsqueeze(1), weights) for group in _completed(ring, start, end, ratio)]
    return StepResult(_cat_rows(rows, b, hd), positions, ring)  # ... then pool every group completed here


def _written(ring: torch.Tensor, proj: torch.Tensor, start: int) -> torch.Tensor:
    """A new ring: `ring` with the projections [b, n, 2, hd] of positions start .. start+n-1 written
    into their slots (position p in slot p mod S), in position order."""
    ring, slots = ring.clone(), ring.shape[1]
    for t in range(proj.shape[1]):
        ring[:, (start + t) % slots] = proj[:, t]
    return ring


def _completed(ring: torch.Tensor, start: int, end: int, ratio: int) -> list[torch.Tensor]:
    """The slots [b, r, 2, hd] of each group a step [start, end) completes, read back from the ring."""
    slots = ring.shape[1]
    return [ring[:, [(j * ratio + m) % slots for m in range(ratio)]] for j in completed_groups(start, end, ratio)]


def finish_row(pooled: torch.Tensor, weights: CompressorWeights) -> torch.Tensor:
    """fp32 [..., hd] (a group's pooled latent; at ratio 1 the wkv accumulator) -> the bf16 row: one cast
    to bf16, then RMSNorm -> bf16 (M:482-484). The cast before the norm is the rounding an implementation
    with more precision drops (`exact_step_rows`)."""
    return rms_norm(pooled.to(torch.bfloat16), weights.norm_w, weights.eps)


def exact_step_rows(
    x_chunk: torch.Tensor,
    start: int,
    ring: torch.Tensor,
    weights: CompressorWeights,
    ratio: int,
    accumulation: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [b, G, hd] twice, for the rows `compressor_step` returns from the same arguments: each row's
    value with no rounding after the fp32 projections the ring holds (the pooling, the norm and, at ratio 1,
    the wkv accumulator exact), and how far the reference's own roundings may take its row from that: the
    bf16 cast before the norm (half a bf16 ulp of each pooled element through the norm, and its shift of
    the norm's scale). At ratio 1 each element of the wkv GEMM may also move by `accumulation` x the sum
    over K of |x_k w_k|, an implementation's own fp32 accumulation (the callers pass harness/accumulation.py's
    BF16_GEMM_ALLOWANCE), carried through the norm the same way. An implementation that rounds less than
    the reference lies nearer the first (docs/verdicts.md, "GPU arithmetic")."""
    check_ratio(ratio)
    _check_x(x_chunk, weights)
    end = start + x_chunk.shape[1]
    slack = None
    if ratio == 1:
        pooled = torch.nn.functional.linear(x_chunk.double(), weights.wkv.double())  # [b, n, hd], exact
        if accumulation:
            slack = accumulation * torch.nn.functional.linear(x_chunk.double().abs(), weights.wkv.double().abs())
    else:
        ring = _written(ring, compressor_projections(x_chunk, weights), start)
        groups = [_pool_exact(group) for group in _completed(ring, start, end, ratio)]
        hd = weights.head_dim
        pooled = torch.stack(groups, 1) if groups else torch.empty(x_chunk.shape[0], 0, hd, dtype=torch.float64)
    return exact_rms_norm(pooled, weights.norm_w, weights.eps, slack)


def _pool_exact(group: torch.Tensor) -> torch.Tensor:
    """`pool_group` in float64 without its final rounding: fp32 [b, r, 2, hd] -> float64 [b, hd]."""
    scores = torch.softmax(group[:, :, SCORE].double(), dim=1)
    return (group[:, :, LATENT].double() * scores).sum(dim=1)


def compressor_oneshot(
    x: torch.Tensor, weights: CompressorWeights, ratio: int, ring_size: int | None = None
) -> StepResult:
    """One step over all T positions from 0 with a fresh ring of `ring_size` slots (default
    ring_capacity(ratio, T)). Returns every completed row and the pending state in the ring."""
    _check_x(x, weights)
    slots = ring_capacity(ratio, max(x.shape[1], 1)) if ring_size is None else ring_size
    ring = None if ratio == 1 else new_ring(x.shape[0], slots, weights.head_dim)
    return compressor_step(x, 0, ring, weights, ratio)


def compressor_run(
    x: torch.Tensor,
    schedule: Sequence[tuple[int, int]],
    weights: CompressorWeights,
    ratio: int,
    ring_size: int | None = None,
    drafts: Mapping[int, torch.Tensor] | None = None,
) -> RunResult:
    """Drive `compressor_step` over a schedule (see harness/schedules.py).

    x bf16 [b, T, dim] holds the accepted inputs; step i reads x[:, start:end] unless
    drafts[i] (bf16 [b, end-start, dim]) gives the inputs that step really saw (a speculative
    draft whose tail is later rejected). When a step starts before the previous end, rows whose
    group reaches a rolled-back position (j >= start // r) are dropped. ring_size defaults to
    ring_capacity(ratio, longest step).
    """
    check_ratio(ratio)
    steps_list = validate_schedule(schedule)
    drafts = dict(drafts or {})
    unknown = sorted(set(drafts) - set(range(len(steps_list))))
    if unknown:
        raise ValueError(f"drafts given for steps {unknown}, but the schedule has {len(steps_list)} steps")
    slots = ring_capacity(ratio, max_step(steps_list)) if ring_size is None else ring_size
    ring = None if ratio == 1 else new_ring(x.shape[0], slots, weights.head_dim)
    kept_rows: list[torch.Tensor] = []  # [b, 1, hd] each
    kept_pos: list[int] = []
    results: list[StepResult] = []
    for i, (start, end) in enumerate(steps_list):
        chunk = drafts.get(i, x[:, start:end])
        if chunk.shape[1] != end - start:
            source = f"drafts[{i}]" if i in drafts else f"x (length {x.shape[1]})"
            raise ValueError(f"step {i} ({start}, {end}) needs {end - start} inputs, {source} gives {chunk.shape[1]}")
        keep = [k for k, p in enumerate(kept_pos) if p // ratio < start // ratio]
        kept_rows = [kept_rows[k] for k in keep]
        kept_pos = [kept_pos[k] for k in keep]
        res = compressor_step(chunk, start, ring, weights, ratio)
        results.append(res)
        ring = res.ring
        kept_rows.extend(res.rows.split(1, dim=1))
        kept_pos.extend(int(p) for p in res.row_positions)
    assert ring is not None  # every step returns a ring, and a schedule has a step at least (validate_schedule)
    rows = _cat_rows(kept_rows, x.shape[0], weights.head_dim)
    return RunResult(rows, torch.tensor(kept_pos, dtype=torch.int64), ring, results)


# ---------------------------------------------------------------------------------------------
# Output-row metadata (seed 000 §A.1.1)
# ---------------------------------------------------------------------------------------------


def compressor_metadata(kind: str, start: int, n: int, ratio: int) -> CompressorMetadata:
    """Rows one request reserves for a step of n positions at `start`.

    prefill: max(1, n_c) rows, n_c = groups completed in [start, start+n) (row j at position
        j*r, store slot j); when n_c == 0 a single placeholder (position 0, slot -1, invalid,
        zero output row) keeps the output shape non-empty.
    decode: one row per query position p; valid with slot j = (p+1)//r - 1 and position j*r when
        p closes group j ((p+1) % r == 0), else a zero row with position 0 and slot -1.
    Example: prefill chunks [0,1), [1,4), [4,7) at ratio 2 give valid/reserved 0/1, 2/2, 1/1.
    """
    check_ratio(ratio)
    if n < 1 or start < 0:
        raise ValueError(f"a step needs n >= 1 positions at start >= 0, got start {start}, n {n}")
    if kind == "prefill":
        groups = list(completed_groups(start, start + n, ratio))
        if not groups:
            return _metadata([0], [-1], [False])
        return _metadata([j * ratio for j in groups], groups, [True] * len(groups))
    if kind == "decode":
        closes = [(p + 1) % ratio == 0 for p in range(start, start + n)]
        slots = [(p + 1) // ratio - 1 if c else -1 for p, c in zip(range(start, start + n), closes)]
        return _metadata([s * ratio if s >= 0 else 0 for s in slots], slots, closes)
    raise ValueError(f"metadata kind must be 'prefill' or 'decode', got {kind!r}")


# ---------------------------------------------------------------------------------------------
# Private helpers
# ---------------------------------------------------------------------------------------------


def _metadata(positions: list[int], slots: list[int], valid: list[bool]) -> CompressorMetadata:
    return CompressorMetadata(
        torch.tensor(positions, dtype=torch.int64),
        torch.tensor(slots, dtype=torch.int64),
        torch.tensor(valid, dtype=torch.bool),
    )


def _cat_rows(rows: list[torch.Tensor], b: int, hd: int) -> torch.Tensor:
    if not rows:
        return torch.empty(b, 0, hd, dtype=torch.bfloat16)
    return torch.cat(rows, dim=1)


def _ratio2_weights(weights: CompressorWeights) -> tuple[torch.Tensor, torch.Tensor]:
    if weights.wgate is None:
        raise ValueError("ratio 2 needs the gate projection: CompressorWeights(wgate=[hd, dim])")
    out = []
    for name, w in (("wkv", weights.wkv), ("wgate", weights.wgate)):
        if w.dtype == torch.bfloat16:
            w = w.float()  # exact: upstream promotes the bf16 checkpoint into an fp32 Linear
        if w.dtype != torch.float32:
            raise ValueError(f"ratio 2 {name} must be fp32 (or bf16, promoted exactly), got {w.dtype}")
        out.append(w)
    if out[1].shape != out[0].shape:
        raise ValueError(f"wgate {tuple(out[1].shape)} must match wkv {tuple(out[0].shape)}")
    return out[0], out[1]


def _check_x(x: torch.Tensor, weights: CompressorWeights) -> None:
    if x.dtype != torch.bfloat16 or x.ndim != 3 or x.shape[2] != weights.dim:
        raise ValueError(f"compressor input must be bf16 [b, n, dim={weights.dim}], got {x.dtype} {tuple(x.shape)}")
    if tuple(weights.norm_w.shape) != (weights.head_dim,):
        raise ValueError(f"norm_w must be [{weights.head_dim}], got {tuple(weights.norm_w.shape)}")


def _check_ring(ring: torch.Tensor, b: int | None = None, hd: int | None = None) -> None:
    ok = ring.dtype == torch.float32 and ring.ndim == 4 and ring.shape[2] == 2
    if not ok or ring.shape[0] != (b or ring.shape[0]) or ring.shape[3] != (hd or ring.shape[3]):
        raise ValueError(f"ring must be fp32 [b={b}, S, 2, hd={hd}], got {ring.dtype} {tuple(ring.shape)}")
