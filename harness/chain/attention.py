"""The attention chain: every output of every (step, layer) call judged given the implementation's
own values at the decisions before it (docs/verdicts.md, "The chain").

One call's stages, in order, with the decision each value is the input of:

    qr             q_norm(wq_a(x))                      act_quant of wq_b's input (fp8), the indexer's
    kv             RoPE(kv_norm(wkv(x)))                the window rows' fp8 QDQ
    latent         the compressor's row, before RoPE   (kv sources; continuous: judged as it stands)
    compress_pre   RoPE(latent)                         the compressed rows' fp4 QDQ
    index_k_pre    RoPE(k_norm(wk(latent)))             the index keys' fp4 QDQ (key owners)
    index_q        RoPE(idx.wq_b(qr))                   the index query's fp4 round trip
    index_scores   visible scores of fp4(index_q)       top-k, candidate blocks
    q              RoPE(wq_b(qr))                       (continuous: the softmax's logits)
    o              sparse attention, inverse RoPE       (continuous: judged by sparse_attn's policy, and
                                                        given your q, its logit-scale check)
    z              wo_a(o)                              act_quant of wo_b's input (fp8)
    out            wo_b(z)

and the outputs between them (window_rows, compress_rows, index_k_rows, ring_pending,
compressed_ids, candidates; per step window_ids and published). Each is judged against the
reference re-run from the values the implementation itself fed it: its returned intermediates
where they passed, its own earlier outputs (the caches, ids and masks it returned), the
reference's value where it returned none (the verdict then says so, and names what to return when
a difference cannot be attributed). The state a call read (window ring, compressed cache, index
keys, the shared slots under the golden's publication record) is rebuilt from the outputs the
harness judged, never taken from what the implementation passed itself.

With the fp8 checkpoint `out` has two correct forms: wo_b's act_quant of the bf16 z (the reference), or
of wo_a's fp32 accumulator never rounded to bf16 (a fused kernel), which crosses the e4m3 code at the
bf16 z's ties the other way whenever the accumulator lies on the other side. Where `out` fails given
your z, it is judged again from z's fp32 accumulator rederived from your o (where that rounds to your
z); that verdict stands where it passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch

from ..accumulation import BF16_GEMM_ALLOWANCE, gemm_terms, through_rms_norm, through_rope
from ..logit_scale import DIRECTION, MIN_ROWS, SPREAD, scale_context
from ..precision import EXACT, EXACT_ERROR
from ..compare import OWN_PRE as OWN
from ..reference import numerics as nx
from ..reference.attention import (
    LayerWeights,
    output_rank,
    output_rank_acc,
    rope_table,
    step_window_ids,
    window_part_length,
)
from ..reference.candidates import kept_block_ids, select_candidate_blocks
from ..reference.compressor import completed_groups, compressor_step, exact_step_rows, new_ring, ring_capacity
from ..reference.config import AttnConfig, LayerRole, layer_roles
from ..reference.fp8_linear import Fp8Weight, project, project_unrounded, weight_cache
from ..reference.indexer import (
    FP4_BLOCK,
    exact_index_scores,
    head_weights,
    index_scores_with_terms,
    indexer_query,
    select_topk,
)
from ..reference.numerics import exact_rms_norm, linear_bf16, rms_norm
from ..reference.rope import apply_rotary
from ..reference.runtime import SLOTS
from ..reference.sparse_attn import sparse_attn
from ..stepnames import layer_name, step_name
from ..ulps import ulp_of
from .candidates import rows_of_blocks
from .digest import differing_rows
from .stages import (
    REDERIVED,
    REUSE,
    SCREEN_TRACE,
    ChainJudgement,
    Given,
    Judge,
    Lazy,
    RowContext,
    StageVerdict,
    TermsContext,
    Untargeted,
    assemble,
    attribute_problem,
    differing,
    judge_rows,
    rows_of,
    unjudged,
)

NINF = float("-inf")
FP8_BLOCK = 32
SCALE_CHUNK = 64  # query rows per logit-scale context: their gathered lanes in float64 stay near 200 MB

# What to return when a stage's difference cannot be attributed: stage -> (intermediate, why). The
# stages here cross act_quant only with the fp8 checkpoint (o through q); with bf16 weights they are
# continuous.
FP8_ONLY = ("out", "q", "o", "index_q")
HINTS = {
    "out": ("z", "wo_b's input: its act_quant turns one ulp of z into a whole fp8 step of out"),
    "z": ("o", "wo_a's input"),
    "q": ("qr", "wq_b's input: its act_quant turns one ulp of qr into an fp8 step of the query"),
    "o": ("q", "sparse attention's query: your GEMM's own error on it moves o, and reads as a logit scale"),
    "index_q": ("qr", "the indexer's wq_b input: its act_quant turns one ulp of qr into an fp8 step"),
    "index_scores": ("index_q", "the index query before its fp4 round trip"),
    "compressed_ids": ("index_scores", "the scores your top-k ranked"),
    "candidates": ("index_scores", "the scores your block selection ranked"),
    "window_rows": ("kv", "the window rows before their fp8 QDQ"),
    "compress_rows": ("compress_pre", "the compressed rows before their fp4 QDQ"),
    "index_k_rows": ("index_k_pre", "the index keys before their fp4 QDQ"),
    "compress_pre": ("latent", "the compressor's row before RoPE"),
    "index_k_pre": ("latent", "the compressor's row before RoPE: one ulp of it moves a key by ulp x |wk|"),
}


def _head_terms(qr: torch.Tensor, weight, heads: int, dim: int, rope_dim: int):
    """A query projection's fp8 GEMM term magnitudes by head, carried through its RoPE (None: a bf16 weight)."""
    terms = gemm_terms(qr, weight)
    return None if terms is None else through_rope(terms.map(lambda t: t.unflatten(-1, (heads, dim))), rope_dim)


@dataclass
class Call:
    """One (step, layer) call and what the chain knows of it so far."""

    step: int
    role: LayerRole
    start: int
    end: int
    given: dict[str, Given] = field(default_factory=dict)
    ranked: object = None  # index sources: rows -> the scores their selection ranked (for Reuse layers too)

    @property
    def layer(self) -> int:
        return self.role.layer

    @property
    def S(self) -> int:
        return self.end - self.start

    def name(self, stage: str) -> str:
        return layer_name(self.step, self.layer, stage)


def _full(given: Given) -> torch.Tensor:
    """A stage the chain always holds in full (the window rows, the ring before, the cache seen): never Lazy."""
    assert given.full is not None
    return given.full


class AttentionChain:
    """Judges one attention case along its chain (module docstring). `x` is the golden's per-layer
    input [L, b, T, dim]; `weights` each layer's reference weights."""

    # A stage the golden holds whose inputs are all the reference's own values (`Given.reference`: the
    # implementation returned none of them, or returned them bit for bit) would be rederived as the
    # golden's rows: they are taken as they stand (only the comparator's context is computed). False
    # rederives them all the same (tests/test_chain_speed.py compares the two).
    shortcut = True

    def __init__(
        self,
        x: torch.Tensor,
        weights: dict[int, LayerWeights],
        golden: dict,
        aux: dict,
        actual: dict,
        params: dict,
        judge: Judge,
    ):
        self.cfg = AttnConfig.from_dict(params["config"])
        self.roles = layer_roles(self.cfg)
        self.x, self.weights, self.golden, self.aux, self.actual, self.judge = x, weights, golden, aux, actual, judge
        self.schedule = [tuple(s) for s in params["schedule"]]
        self.b = int(x.shape[1])
        self.tables = {r: rope_table(self.cfg, r) for r in sorted({role.ratio for role in self.roles})}
        cfg, b = self.cfg, self.b
        self.rings = {r.layer: torch.zeros(b, cfg.window_size, cfg.head_dim, dtype=torch.bfloat16) for r in self.roles}
        self.caches = {
            r.layer: torch.zeros(b, cfg.max_seq_len // r.ratio, cfg.head_dim, dtype=torch.bfloat16)
            for r in self.roles
            if r.is_kv_source
        }
        self.keys = {
            r.layer: torch.zeros(b, cfg.max_seq_len // r.ratio, cfg.index_head_dim, dtype=torch.bfloat16)
            for r in self.roles
            if r.owns_k
        }
        self.slots: dict[str, torch.Tensor] = {}
        # whether the ring, cache, index keys and published slots hold only the reference's own rows
        self.ring_ref = {r.layer: True for r in self.roles}
        self.cache_ref = {layer: True for layer in self.caches}
        self.keys_ref = {layer: True for layer in self.keys}
        self.slot_ref: dict[str, bool] = {}
        self.calls: dict[tuple[int, int], Call] = {}
        self.fp8 = any(isinstance(w.wo_b, Fp8Weight) for w in weights.values())
        self.result = ChainJudgement()
        self.taken_as_golden: list[str] = []  # stages whose differing rows `shortcut` took as the golden's
        self.comp_rings: dict[int, tuple[int, torch.Tensor]] = {}  # layer -> (step, the reference's ring before it)

    # --- the walk ----------------------------------------------------------------------------

    def run(self) -> ChainJudgement:
        screen = SCREEN_TRACE.get()
        if screen is not None and screen.called:  # the RoPE tables computed under a screen's variant
            screen.tainted = True
        reuse = REUSE.get()
        if reuse is not None:  # walked again under a variant (stages.Reuse)
            if reuse.trace.called:  # what every stage reads (the RoPE tables) was computed under it
                raise Untargeted(f"the chain's setup called {sorted(reuse.trace.called)}")
            reuse.walked = True
        with weight_cache():  # each fp8 weight converted once for every call that projects through it
            for i, (start, end) in enumerate(self.schedule):
                calls = [Call(i, role, start, end) for role in self.roles]
                self.calls.update({(i, c.layer): c for c in calls})
                for c in calls:
                    self._qr(c)
                    self._kv(c)
                self._plain(step_name(i, "window_ids"))
                before = {c.layer: self.rings[c.layer].clone() for c in calls}
                ring_ref = dict(self.ring_ref)
                self._window_rows(i, calls)
                published = self.golden[step_name(i, "published")]
                for c in calls:
                    c.given["ring_before"] = Given("ring", before[c.layer], reference=ring_ref[c.layer])
                    self._layer(c, published[c.layer])
                self._plain(step_name(i, "published"))
        return self.result

    def _layer(self, c: Call, published: torch.Tensor) -> None:
        role = c.role
        flags = dict(zip(SLOTS, (bool(v) for v in published)))
        if role.is_kv_source:
            self._latent(c)
            self._cache_rows(c, "compress_pre", "compress_rows", "fp4_e4m3", self.caches)
            if role.ratio == 2:
                self._plain(c.name("ring_pending"))
            if role.owns_k:
                self._cache_rows(c, "index_k_pre", "index_k_rows", "fp4_e8m0", self.keys)
            if flags["compress_kv"]:
                self.slots["compress_kv"] = self.caches[c.layer].clone()
                self.slot_ref["compress_kv"] = self.cache_ref[c.layer]
            if flags["index_k"] and role.owns_k:
                self.slots["index_k"] = self.keys[c.layer].clone()
                self.slot_ref["index_k"] = self.keys_ref[c.layer]
            c.given["cache"] = Given("compress_kv", self.caches[c.layer], reference=self.cache_ref[c.layer])
        if role.ratio and not role.is_kv_source:  # the latest kv source's cache, as its publication left it
            c.given["kv_seen"] = Given("compress_kv", self.slots["compress_kv"], reference=self.slot_ref["compress_kv"])
        if role.is_index_source:
            self._index_path(c)
        elif role.ratio:
            self._reused_ids(c)
        self._q(c)
        self._o(c)
        self._z(c)
        self._out(c)

    # --- judging helpers ---------------------------------------------------------------------

    def _record(
        self, name: str, verdict, given=(), assumed=(), rows=0, hint_for: str | None = None, intermediate: bool = False
    ) -> StageVerdict:
        hint = ""
        known = HINTS.get(hint_for or "")
        # every failing verdict, the refused tie orders included: given the reference's scores, a port's
        # own scores (one ulp off) tie other entries, and only its scores can tell that from a tie-order bug
        if known and not verdict.ok and verdict.metrics and (self.fp8 or hint_for not in FP8_ONLY):
            want, why = known
            if want in assumed:
                hint = (
                    f"return {name.rsplit('.', 1)[0]}.{want} ({why}) so this is judged given your own value: "
                    f"a difference inherited through that decision cannot be told from a bug here"
                )
        stage = StageVerdict(name, verdict, tuple(given), tuple(assumed), rows, hint, intermediate)
        self.result.verdicts.append(stage)
        return stage

    def _plain(self, name: str, extra: dict | None = None) -> StageVerdict:
        """An output judged against the golden as it stands (nothing upstream of it is a decision
        the implementation can legitimately take the other way)."""
        return self._record(name, self.judge(name, self.golden[name], self.actual.get(name), extra or {}))

    def _reference(self, c: Call, names: tuple[str, ...]) -> bool:
        """Whether every named value the call holds is the reference's own (`Given.reference`)."""
        return all((g := c.given.get(n)) is not None and g.reference for n in names)

    def _inputs(self, c: Call, *names: str) -> tuple[list[str], list[str]]:
        """(own, assumed) among a stage's inputs, by name as reported (an own value that failed its
        own verdict says so: what follows is judged given it all the same)."""
        own, assumed = [], []
        for n in names:
            g = c.given.get(n)
            if g is not None and g.own:
                own.append(n if g.passed else f"{n} (which failed)")
            else:
                assumed.append(n)
        return own, assumed

    def _intermediate(
        self,
        c: Call,
        stage: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        compute,
        inputs: tuple[str, ...],
        extra=None,
        reads: tuple[str, ...] = (),
    ) -> Given:
        """A stage the golden holds as row digests: judged if returned, else the reference, lazily
        (the reference's own where `inputs` and the state it `reads` are)."""
        name, rows = c.name(stage), shape[0] * shape[1]
        lazy = Lazy(rows, compute)
        standin = self._reference(c, inputs + reads)
        actual, digest = self.actual.get(name), self.aux.get(f"{name}.digest")
        if actual is None or digest is None:
            c.given[stage] = Given(name, lazy=lazy, reference=standin)
            return c.given[stage]
        own, assumed = self._inputs(c, *inputs)
        if attribute_problem(actual, dtype, shape):
            verdict = self.judge(name, torch.zeros(shape, dtype=dtype), actual, {})
            self._record(name, verdict, own, assumed, intermediate=True)
            c.given[stage] = Given(name, lazy=lazy, reference=standin)
            return c.given[stage]
        differ = differing_rows(actual, digest, 2)
        verdict, expected, n = judge_rows(self.judge, name, actual, actual, differ, lazy.rows, 2, extra)
        sv = self._record(name, verdict, own, assumed, n, hint_for=stage, intermediate=True)
        same = not bool(differ.any())
        c.given[stage] = Given(name, rows_of(actual, 2), own=True, passed=sv.explained, reference=same)
        return c.given[stage]

    def _judged(self, c: Call, stage: str) -> bool:
        """Whether an intermediate will be judged (returned, and held by the golden as digests): only
        then does the comparator need its context (a stand-in computes values alone)."""
        name = c.name(stage)
        return name in self.actual and f"{name}.digest" in self.aux

    def _output(
        self,
        c: Call,
        stage: str,
        compute,
        inputs: tuple[str, ...],
        extra=None,
        golden: torch.Tensor | None = None,
        intermediate: bool = False,
        alternative: tuple | None = None,
    ) -> Given:
        """A value the golden holds (an output, or an intermediate kept in full in aux): rows that
        differ from it rederived from the given inputs. `alternative` (compute, inputs): a second
        correct form of the stage, judged where the first fails; its verdict stands where it passes."""
        name = c.name(stage)
        golden, actual = self.golden[name] if golden is None else golden, self.actual.get(name)
        own, assumed = self._inputs(c, *inputs)
        if attribute_problem(actual, golden.dtype, tuple(golden.shape)):
            self._record(name, self.judge(name, golden, actual, {}), own, assumed, intermediate=intermediate)
            c.given[stage] = Given(name, rows_of(golden, 2), reference=True)
            return c.given[stage]
        assert actual is not None  # attribute_problem: a tensor of the golden's dtype and shape
        differ = differing(actual, golden, 2)
        if (
            self.shortcut and name not in REDERIVED.get() and REUSE.get() is None and self._reference(c, inputs)
        ):  # rederived: the golden's
            compute = rows_of(golden, 2).__getitem__
            if differ.any():
                self.taken_as_golden.append(name)
        verdict, expected, n = judge_rows(self.judge, name, actual, golden, differ, compute, 2, extra)
        if not verdict.ok and alternative is not None:  # a second correct form of the same stage
            compute_b, inputs_b = alternative
            verdict_b, _, n = judge_rows(self.judge, name, actual, golden, differ, compute_b, 2, extra)
            if verdict_b.ok:
                verdict, (own, assumed) = verdict_b, self._inputs(c, *inputs_b)
        sv = self._record(name, verdict, own, assumed, n, hint_for=stage, intermediate=intermediate)
        same = not bool(differ.any())
        c.given[stage] = Given(name, rows_of(actual, 2), own=True, passed=sv.explained, reference=same)
        return c.given[stage]

    # --- per-row context -----------------------------------------------------------------------

    def _w(self, c: Call) -> LayerWeights:
        return self.weights[c.layer]

    def _x_rows(self, c: Call, rows: torch.Tensor) -> torch.Tensor:
        x = self.x[c.layer, :, c.start : c.end]  # [b, S, dim]
        return rows_of(x, 2)[rows]

    def _freqs(self, c: Call, rows: torch.Tensor) -> torch.Tensor:
        return self.tables[c.role.ratio][c.start + rows % c.S]

    def _lens(self, c: Call, rows: torch.Tensor) -> torch.Tensor:
        return (c.start + rows % c.S + 1) // c.role.ratio

    # --- stages ------------------------------------------------------------------------------

    def _normed(self, c: Call, stage: str, weight, norm_w: torch.Tensor, width: int, rope: int) -> None:
        """qr = q_norm(wq_a(x)), kv = RoPE(kv_norm(wkv(x))): with an fp8 weight, each rederived row's
        accumulation allowance carried through the norm and RoPE (harness/accumulation.py). qr from a bf16
        weight is also judged for its precision, as the compressor's rows are (docs/verdicts.md): in a short
        row one rounding of the GEMM's output the other way moves the norm's scale and with it a fifth of
        the row's elements, each no less precise than the reference's."""
        cfg = self.cfg
        name = c.name(stage)
        acc = TermsContext(name, self.b * c.S, (width,))
        judged = self._judged(c, stage)
        variant = name in REDERIVED.get() or REUSE.get() is not None  # a variant is judged without it
        precise = judged and not rope and not isinstance(weight, Fp8Weight) and not variant
        exact = RowContext(name + EXACT, self.b * c.S, (width,), fill=float("nan"))
        error = RowContext(name + EXACT_ERROR, self.b * c.S, (width,), fill=float("nan"))

        def compute(rows):
            x = self._x_rows(c, rows)
            y = project(x, weight)
            out = rms_norm(y, norm_w, cfg.norm_eps)
            terms = gemm_terms(x, weight) if judged else None
            if rope:
                out = apply_rotary(out[None], self._freqs(c, rows), rope)[0]
            if terms is not None:
                acc.put(rows, through_rope(through_rms_norm(y, norm_w, terms, cfg.norm_eps), rope))
            if precise:  # the GEMM's exact output; the reference rounds it to fp32, then to bf16
                pre = torch.nn.functional.linear(x.double(), weight.double())
                value, bound = exact_rms_norm(pre, norm_w, cfg.norm_eps, ulp_of(pre, torch.float32) / 2)
                exact.put(rows, value)
                error.put(rows, bound)
            return out

        def extra(rows=None, values=None):
            return {**acc.extra(), **exact.extra(), **error.extra()}

        self._intermediate(c, stage, (self.b, c.S, width), torch.bfloat16, compute, (), extra=extra)

    def _qr(self, c: Call) -> None:
        w = self._w(c)
        self._normed(c, "qr", w.wq_a, w.q_norm, self.cfg.q_lora_rank, 0)

    def _kv(self, c: Call) -> None:
        w = self._w(c)
        self._normed(c, "kv", w.wkv, w.kv_norm, self.cfg.head_dim, self.cfg.rope_head_dim)

    def _window_rows(self, step: int, calls: list[Call]) -> None:
        """The ring slots each layer wrote (stacked [L, b, n, hd]): the exact fp8 QDQ of the layer's own
        kv where it returned one, else boundary flips against the golden's."""
        name = step_name(step, "window_rows")
        golden, pre_name = self.golden[name], step_name(step, "window_pre")
        expected, pre = golden.clone(), self.aux[pre_name].clone()
        own = torch.zeros(golden.shape[0], dtype=torch.bool)
        for c in calls:
            kv = c.given["kv"]
            if kv.own:
                n = golden.shape[2]
                rows = (torch.arange(self.b)[:, None] * c.S + torch.arange(c.S - n, c.S)).flatten()
                mine = kv.rows(rows).reshape(self.b, n, -1)
                pre[c.layer], expected[c.layer], own[c.layer] = mine, nx.fp8_qdq_ue8m0(mine, FP8_BLOCK).y, True
        extra = {pre_name: pre, pre_name + OWN: own.view(-1, 1, 1, 1).expand_as(pre)}
        actual = self.actual.get(name)
        owners = [f"l{c.layer}.kv" for c in calls if c.given["kv"].own]
        others = ["kv"] if len(owners) < len(calls) else []
        sv = self._record(name, self.judge(name, expected, actual, extra), owners, others, hint_for="window_rows")
        returned = not attribute_problem(actual, golden.dtype, tuple(golden.shape))
        given = cast(torch.Tensor, actual) if returned else expected  # returned: a tensor (attribute_problem)
        win = self.cfg.window_size
        for c in calls:
            slots = [p % win for p in range(max(c.start, c.end - win), c.end)]
            self.rings[c.layer][:, slots] = given[c.layer]
            same = not bool(differing(given[c.layer], golden[c.layer], 2).any())
            self.ring_ref[c.layer] &= same
            c.given["window_rows"] = Given(name, given[c.layer], own=returned, passed=sv.explained, reference=same)

    def _latent(self, c: Call) -> None:
        """The compressor's rows this step closed, before RoPE (what kv_finish takes): judged against
        the golden's (the compressor's own state is continuous: its ring is judged as it stands)."""
        name = c.name("latent")
        golden = self.aux.get(name)
        if golden is None:
            return
        c.given["latent"] = Given(name, rows_of(golden, 2), reference=True)
        if name in self.actual:
            actual = self.actual[name]
            same = (
                attribute_problem(actual, golden.dtype, tuple(golden.shape)) or not differing(actual, golden, 2).any()
            )
            again = name in REDERIVED.get() or REUSE.get() is not None  # under a diagnosis's variant
            # as judge_context: where rows differ (a variant's is judged without it)
            exact = {} if same or again or unjudged(name) else self._exact_latent(c)
            # the golden's rows; under a variant, the compressor replayed under it (as a re-run has it)
            written = self._replayed_latent(c) if again else golden
            self._output(
                c,
                "latent",
                lambda rows: rows_of(written, 2)[rows],
                (),
                extra=lambda rows, values: exact,
                golden=golden,
                intermediate=True,
            )

    def _exact_latent(self, c: Call) -> dict[str, torch.Tensor]:
        """The rows `latent` holds without the reference's roundings after the compressor's fp32 projections,
        and how far those roundings may take the reference's (`compressor.exact_step_rows`): the layer's
        compressor replayed from a fresh ring over the schedule's inputs, as the golden was written."""
        w, ratio = self._w(c).compressor, c.role.ratio
        assert w is not None  # a kv source
        x = self.x[c.layer, :, c.start : c.end]
        exact, error = exact_step_rows(x, c.start, self._ring_before(c), w, ratio, BF16_GEMM_ALLOWANCE)
        name = c.name("latent")
        return {name + EXACT: exact, name + EXACT_ERROR: error}

    def _replayed_latent(self, c: Call) -> torch.Tensor:
        """bf16 [b, G, hd]: the rows the layer's compressor closes at this step, replayed as `_exact_latent`
        replays it (under whatever variant of a reference function is in force)."""
        w = self._w(c).compressor
        assert w is not None  # a kv source
        return compressor_step(self.x[c.layer, :, c.start : c.end], c.start, self._ring_before(c), w, c.role.ratio).rows

    def _ring_before(self, c: Call) -> torch.Tensor:
        """The layer's compressor ring before call `c`, replayed from a fresh ring over the schedule's inputs,
        as the golden was written (each replay carried on from the last one asked for)."""
        w, ratio = self._w(c).compressor, c.role.ratio
        assert w is not None  # a kv source
        step, ring = self.comp_rings.get(c.layer, (0, None))
        if ring is None:
            longest = max(end - start for start, end in self.schedule)
            ring = new_ring(self.b, ring_capacity(ratio, max(longest, 1)) if ratio > 1 else 0, w.head_dim)
        for i in range(step, c.step):
            start, end = self.schedule[i]
            ring = compressor_step(self.x[c.layer, :, start:end], start, ring, w, ratio).ring
        self.comp_rings[c.layer] = (c.step, ring)
        return ring

    def _group_freqs(self, c: Call, rows: torch.Tensor) -> torch.Tensor:
        """The RoPE rows of the groups written this step, by flat row (b, group): each group's first position."""
        groups = torch.tensor(list(completed_groups(c.start, c.end, c.role.ratio)), dtype=torch.int64)
        return self.tables[c.role.ratio][groups[rows % groups.numel()] * c.role.ratio]

    def _pre_reference(self, c: Call, pre_stage: str):
        """rows -> the reference's values before quantisation of the cache rows, from the given latent."""
        w, cfg = self._w(c), self.cfg

        def main(rows):
            return apply_rotary(c.given["latent"].rows(rows)[None], self._group_freqs(c, rows), cfg.rope_head_dim)[0]

        def index(rows):
            key = rms_norm(linear_bf16(c.given["latent"].rows(rows), w.wk), w.k_norm, cfg.norm_eps)
            return apply_rotary(key[None], self._group_freqs(c, rows), cfg.rope_head_dim)[0]

        return main if pre_stage == "compress_pre" else index

    def _cache_rows(self, c: Call, pre_stage: str, rows_stage: str, fmt: str, caches: dict) -> None:
        """A kv source's cache rows written this step (compressed rows, index keys): the fp4 QDQ of its
        own values before quantisation where it returned them (judged given its latent), else
        boundary flips against the golden's."""
        pre_name, name = c.name(pre_stage), c.name(rows_stage)
        golden_pre = self.aux[pre_name]
        own = False
        if pre_name in self.actual:
            given = self._output(
                c, pre_stage, self._pre_reference(c, pre_stage), ("latent",), golden=golden_pre, intermediate=True
            )
            own = given.own
        actual_pre = self.actual.get(pre_name)
        golden = self.golden[name]
        pre, expected = golden_pre, golden
        if own:
            quantise = nx.fp4_qdq_e4m3 if fmt == "fp4_e4m3" else nx.fp4_qdq_e8m0
            assert actual_pre is not None  # own: _output found it a tensor of the golden's dtype and shape
            pre = actual_pre
            expected = quantise(actual_pre).y if actual_pre.shape[1] else golden
        extra = {pre_name: pre, pre_name + OWN: torch.full(pre.shape, own)}
        actual = self.actual.get(name)
        given_names, assumed = ([pre_stage], []) if own else ([], [pre_stage])
        sv = self._record(name, self.judge(name, expected, actual, extra), given_names, assumed, hint_for=rows_stage)
        mine = not attribute_problem(actual, golden.dtype, tuple(golden.shape))
        value = cast(torch.Tensor, actual) if mine else expected  # mine: a tensor (attribute_problem)
        rows = list(completed_groups(c.start, c.end, c.role.ratio))
        same = not bool(differing(value, golden, 2).any())
        if rows:
            caches[c.layer][:, rows] = value
            held = self.cache_ref if caches is self.caches else self.keys_ref
            held[c.layer] &= same
        c.given[rows_stage] = Given(name, value, own=mine, passed=sv.explained, reference=same)

    def _index_path(self, c: Call) -> None:
        """index_q, index_scores, compressed_ids and (candidate source) candidates of an index source."""
        w, cfg, role = self._w(c), self.cfg, c.role
        T = c.end // role.ratio
        H, D = cfg.index_n_heads, cfg.index_head_dim

        query_acc = TermsContext(c.name("index_q"), self.b * c.S, (H, D))
        judged = self._judged(c, "index_q")

        def query(rows):
            qr = c.given["qr"].rows(rows)
            if judged:
                query_acc.put(rows, _head_terms(qr, w.indexer.wq_b, H, D, cfg.rope_head_dim))
            return indexer_query(qr[None], w.indexer.wq_b, H, self._freqs(c, rows), cfg.rope_head_dim)[0]

        self._intermediate(c, "index_q", (self.b, c.S, H, D), torch.bfloat16, query, ("qr",), extra=query_acc.extra)
        if T == 0:  # upstream skips the indexer: nothing is selected, nothing scored
            self._output(c, "compressed_ids", lambda rows: torch.zeros(rows.numel(), 0, dtype=torch.int32), ())
            c.ranked = lambda rows: self.aux.get(c.name("scores"))
            if role.is_candidate_source:
                self._plain(c.name("candidates"))
            return
        keys = self.slots["index_k"]
        c.given["index_k_seen"] = Given("index_k", keys, own=True, reference=self.slot_ref["index_k"])
        terms = torch.zeros(self.b * c.S, T)  # the largest head term of each recomputed score
        exact = RowContext(c.name("index_scores") + EXACT, self.b * c.S, (T,), fill=float("nan"))
        error = RowContext(c.name("index_scores") + EXACT_ERROR, self.b * c.S, (T,), fill=float("nan"))
        scores_judged = self._judged(c, "index_scores")

        def scores(rows):
            q = nx.fp4_qdq_e8m0(c.given["index_q"].rows(rows), FP4_BLOCK).y  # [n, H, D]
            wts = head_weights(self._x_rows(c, rows)[None], w.indexer.weights_proj, D, H)[0]  # [n, H]
            out = torch.empty(rows.numel(), T, dtype=torch.bfloat16)
            visible = torch.arange(T)[None, :] < self._lens(c, rows)[:, None]
            for bi in torch.unique(rows // c.S).tolist():
                mine = (rows // c.S) == bi
                s, scale = index_scores_with_terms(q[mine][None], keys[bi : bi + 1, :T], wts[mine][None])
                out[mine], terms[rows[mine]] = s[0], scale[0]
                if scores_judged:  # the exact scores are the comparator's context, not the stand-in's value
                    value, bound = exact_index_scores(q[mine][None], keys[bi : bi + 1, :T], wts[mine][None])
                    exact.put(rows[mine], value[0].masked_fill(~visible[mine], NINF))
                    error.put(rows[mine], bound[0])
            return out.masked_fill(~visible, NINF)

        terms_name = c.name("index_scores_terms")
        self._intermediate(
            c,
            "index_scores",
            (self.b, c.S, T),
            torch.bfloat16,
            scores,
            ("index_q", "index_k_seen"),
            extra=lambda rows, values: {terms_name: terms.reshape(self.b, c.S, T), **exact.extra(), **error.extra()},
        )
        offset = window_part_length(c.start, c.S, cfg.window_size)
        if role.candidate_source is not None:
            c.given["candidates_seen"] = self.calls[(c.step, role.candidate_source)].given["candidates"]

        def masked(rows):
            s = c.given["index_scores"].rows(rows)  # [n, T] bf16, -inf where invisible
            seen = c.given.get("candidates_seen")
            return s if seen is None else s.masked_fill(~seen.rows(rows), NINF)

        def ids(rows):
            return select_topk(masked(rows)[None], self._lens(c, rows), cfg.index_topk, offset).ids[0]

        def ranked(rows):
            """The scores the selection ranked ([b, S, offset + T], the ids index them), the golden's
            with the rows `rows` recomputed from the given scores."""
            golden = self.aux[c.name("scores")]
            if not rows.numel():
                return golden
            front = torch.full((rows.numel(), offset), NINF, dtype=golden.dtype)
            return assemble(golden, rows, torch.cat([front, masked(rows).to(golden.dtype)], -1), 2)

        c.ranked = ranked
        inputs = ("index_scores",) + (("candidates_seen",) if role.candidate_source is not None else ())
        self._output(c, "compressed_ids", ids, inputs, extra=lambda rows, values: {c.name("scores"): ranked(rows)})
        if role.is_candidate_source:
            self._candidates(c)

    def _candidates(self, c: Call) -> None:
        """The candidate mask, judged as `candidates.select` judges one (harness/chain/candidates.py):
        its rows that differ from the golden rederived from the given index scores; where it still
        differs from that selection, its kept blocks first (`candidate_blocks`, an index output against
        the ranked block scores: tie order, near tie or miss, by the implementation's flags), then the
        mask given those blocks."""
        cfg, name, size = self.cfg, c.name("candidates"), self.cfg.candidate_block_size

        def select(rows):
            return select_candidate_blocks(
                c.given["index_scores"].rows(rows)[None], self._lens(c, rows), cfg.candidate_topk_blocks, size
            )

        golden, actual = self.golden[name], self.actual.get(name)
        if attribute_problem(actual, golden.dtype, tuple(golden.shape)):
            self._output(c, "candidates", lambda rows: select(rows).mask[0], ("index_scores",))
            return
        assert actual is not None  # attribute_problem: a tensor of the golden's dtype and shape
        own, assumed = self._inputs(c, "index_scores")
        verdict, expected, n = judge_rows(
            self.judge, name, actual, golden, differing(actual, golden, 2), lambda rows: select(rows).mask[0], 2
        )
        rows = differing(actual, expected, 2).nonzero().flatten()  # yours is not the selection of your scores
        same = not bool(differing(actual, golden, 2).any())
        if verdict.ok or not rows.numel():
            sv = self._record(name, verdict, own, assumed, n, hint_for="candidates")
            c.given["candidates"] = Given(name, rows_of(actual, 2), own=True, passed=sv.explained, reference=same)
            return
        mine, want = kept_block_ids(actual, size), kept_block_ids(expected, size)  # [b, S, nb]
        ranked = torch.zeros(rows_of(mine, 2).shape, dtype=torch.float32)
        ranked[rows] = select(rows).ranked_scores[0].float()
        extra = {c.name("candidate_ranked"): ranked.reshape(mine.shape)}
        blocks = self._record(
            c.name("candidate_blocks"),
            self.judge(c.name("candidate_blocks"), want, mine, extra),
            own,
            assumed,
            n,
            hint_for="candidates",
        )
        if blocks.explained:  # tie order or near ties only: the mask is the rows of your blocks, exactly
            given = rows_of_blocks(mine, golden.shape[-1], size)
            sv = self._record(name, self.judge(name, given, actual, {}), ("candidate_blocks",), (), int(rows.numel()))
        else:
            sv = self._record(name, verdict, own, assumed, n, hint_for="candidates")
        c.given["candidates"] = Given(name, rows_of(actual, 2), own=True, passed=sv.explained, reference=same)

    def _reused_ids(self, c: Call) -> None:
        """A Reuse layer attends its index source's selection as that source returned it (exactly)."""
        assert c.role.index_source is not None  # a compressed layer that is no index source reuses one's
        source = self.calls[(c.step, c.role.index_source)]
        c.given["source_ids"] = source.given["compressed_ids"]

        def ranked(rows, values):
            scores = source.ranked(rows)
            return {} if scores is None else {c.name("scores"): scores}

        self._output(c, "compressed_ids", c.given["source_ids"].rows, ("source_ids",), extra=ranked)

    def _kv_all(self, c: Call, bi: int) -> torch.Tensor:
        """bf16 [n, hd]: the rows call `c` attends for sequence `bi`: its window part, then the
        compressed rows it sees (docs/attention.md), as the chain knows them."""
        S = c.S
        written = _full(c.given["window_rows"])[bi]  # [n, hd], positions max(start, end - win) .. end - 1
        n = written.shape[0]
        if c.start > 0 and S == 1:
            part = self.rings[c.layer][bi]
        else:
            rows = torch.arange(S - n) + bi * S  # positions the ring no longer holds
            early = nx.fp8_qdq_ue8m0(c.given["kv"].rows(rows), FP8_BLOCK).y if rows.numel() else written[:0]
            chunk = torch.cat([early, written])
            part = chunk if c.start == 0 else torch.cat([_full(c.given["ring_before"])[bi], chunk])
        if not c.role.ratio:
            return part
        T = c.end // c.role.ratio
        seen = self.caches[c.layer] if c.role.is_kv_source else _full(c.given["kv_seen"])
        return torch.cat([part, seen[bi, :T]])

    def _q(self, c: Call) -> None:
        """Sparse attention's query, wq_b of the given qr then RoPE: judged as index_q is (with an fp8
        wq_b, its accumulation allowance)."""
        w, cfg = self._w(c), self.cfg
        h, hd = cfg.n_heads, cfg.head_dim
        accumulation = TermsContext(c.name("q"), self.b * c.S, (h, hd))
        judged = self._judged(c, "q")

        def compute(rows):
            qr = c.given["qr"].rows(rows)
            if judged:
                accumulation.put(rows, _head_terms(qr, w.wq_b, h, hd, cfg.rope_head_dim))
            q = project(qr, w.wq_b).unflatten(-1, (h, hd))
            return apply_rotary(q[None], self._freqs(c, rows), cfg.rope_head_dim)[0]  # [n, h, hd]

        self._intermediate(c, "q", (self.b, c.S, h, hd), torch.bfloat16, compute, ("qr",), extra=accumulation.extra)

    def _o(self, c: Call) -> None:
        """o given the query: where it is your own, with the logit-scale check of sparse attention
        (harness/logit_scale.py) on a step of MIN_ROWS (query, head) rows or more; where it is the
        reference's of your qr, without (your own GEMM's error on q would read as a logit scale)."""
        w, cfg = self._w(c), self.cfg
        h, hd, rd = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim
        lanes = step_window_ids(c.start, c.S, cfg.window_size)
        name = c.name("o")
        # a step of fewer rows never carries the check (nor its context: a diagnosis screen samples rows)
        checked = self._judged(c, "o") and c.given["q"].own and self.b * c.S * h >= MIN_ROWS
        direction = RowContext(name + DIRECTION, self.b * c.S, (h, hd))
        spread = RowContext(name + SPREAD, self.b * c.S, (h, hd))

        def compute(rows):
            q = c.given["q"].rows(rows)  # [n, h, hd]
            freqs = self._freqs(c, rows)
            ids_given = c.given.get("compressed_ids")
            comp = ids_given.rows(rows) if ids_given is not None else torch.zeros(rows.numel(), 0, dtype=torch.int32)
            ids = torch.cat([lanes[rows % c.S], comp.to(torch.int32)], -1)
            out = torch.empty(rows.numel(), h, hd, dtype=torch.bfloat16)
            scaled = checked and rows.numel() * h >= MIN_ROWS  # the comparator's context, not the stand-in's value
            along = torch.zeros(rows.numel(), h, hd, dtype=torch.float64)
            for bi in torch.unique(rows // c.S).tolist():
                mine = (rows // c.S) == bi
                kv = self._kv_all(c, bi)
                out[mine] = sparse_attn(q[mine][None], kv[None], w.attn_sink, ids[mine][None], cfg.softmax_scale)[0]
                for part in mine.nonzero().flatten().split(SCALE_CHUNK) if scaled else ():
                    found = scale_context(
                        name, q[part][None], kv[None], w.attn_sink, ids[part][None], cfg.softmax_scale
                    )
                    along[part] = found[name + DIRECTION][0]
                    spread.put(rows[part], found[name + SPREAD][0])
            if scaled:  # o is rotated back: so is the direction it moves along (a row's spread stays)
                direction.put(rows, apply_rotary(along[None], freqs, rd, inverse=True)[0])
            return apply_rotary(out[None], freqs, rd, inverse=True)[0]

        inputs = ("q", "kv", "window_rows") + (("compressed_ids",) if c.role.ratio else ())
        cache = ("cache" if c.role.is_kv_source else "kv_seen",) if c.role.ratio else ()
        self._intermediate(
            c,
            "o",
            (self.b, c.S, h, hd),
            torch.bfloat16,
            compute,
            inputs,
            (lambda rows, values: {**direction.extra(), **spread.extra()}) if checked else None,
            reads=("ring_before", *cache),
        )

    def _z(self, c: Call) -> None:
        w, cfg = self._w(c), self.cfg

        def compute(rows):
            return output_rank(c.given["o"].rows(rows), w.wo_a, cfg)

        self._intermediate(c, "z", (self.b, c.S, cfg.o_groups * cfg.o_lora_rank), torch.bfloat16, compute, ("o",))

    def _out(self, c: Call) -> None:
        w = self._w(c)
        acc = TermsContext(c.name("out"), self.b * c.S, (self.cfg.dim,))

        def compute(rows):
            return project(c.given["z"].rows(rows), w.wo_b)

        def unrounded(rows):  # wo_b's act_quant fed z's fp32 accumulator (module docstring), where it rounds to z
            z = c.given["z"].rows(rows)
            acc = output_rank_acc(c.given["o"].rows(rows), w.wo_a, self.cfg)
            return project_unrounded(torch.where(acc.to(torch.bfloat16) == z, acc, z.float()), w.wo_b)

        def extra(rows, values):  # the rederived rows' term magnitudes (from the z they are rederived from)
            if rows.numel():
                acc.put(rows, gemm_terms(c.given["z"].rows(rows), w.wo_b))
            return acc.extra()

        alternative = (unrounded, ("z", "o")) if self.fp8 else None
        self._output(c, "out", compute, ("z",), extra=extra, alternative=alternative)
