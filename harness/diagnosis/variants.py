"""The catalogue of known porting bugs: each one small, named deviation in one reference function.

A variant changes one thing (a rounding point, a layout, a block size, a scale rule, a policy, an
order) and nothing else; the diagnosis re-runs the reference on a failing case's inputs under it
(harness/diagnosis/diagnose.py). `components` lists the components whose outputs it can change.
docs/diagnosis.md lists every variant with what it changes and the port it was seen in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ContextManager

import torch

from .patching import constant, replaced

REF = "v41_conformance.reference"
NUMERICS, ROPE, INDEXER = f"{REF}.numerics", f"{REF}.rope", f"{REF}.indexer"

# Component patterns: where each reference function's arithmetic reaches.
NORM_USERS = ("norm.rms", "compressor", "kv.finish", "attention")
ROPE_USERS = ("rope.apply", "kv.finish", "compressor", "indexer", "attention")
TABLE_USERS = ("rope.yarn_table", "rope.apply", "kv.finish", "compressor", "indexer", "attention")
E2M1_USERS = ("quant.e2m1", "quant.fp4_*", "kv.finish", "compressor", "indexer", "attention")
FP4_E4M3_USERS = ("quant.fp4_e4m3", "kv.finish", "compressor", "attention")
FP8_USERS = ("quant.fp8_ue8m0", "linear.fp8", "attention", "indexer")
POW2_USERS = ("quant.fp4_e8m0", "quant.fp8_ue8m0", "linear.fp8", "kv.finish", "compressor", "indexer", "attention")
FP4_E8M0_USERS = ("quant.fp4_e8m0", "kv.finish", "indexer", "attention")
SCORE_USERS = ("indexer.scores", "indexer", "attention")
SELECT_USERS = ("indexer.select", "indexer", "candidates.select", "attention", "topk.*")


# A tie order is named only where the tied rows it decides could have come out so by chance at most
# once in 16 (docs/diagnosis.md, "Evidence").
TIE_EVIDENCE_BITS = 4.0


@dataclass(frozen=True)
class Variant:
    name: str  # short, stable: "rmsnorm-bf16-before-weight"
    summary: str  # what a port with this bug does, as the report says it ("RMSNorm rounds ...")
    changes: str  # the reference function (or params field) it changes, and how
    components: tuple[str, ...]  # fnmatch patterns of the components it can change
    apply: Callable[[], ContextManager] = contextlib.nullcontext  # the deviation, for a `with`
    params: Callable[[dict], dict | None] | None = None  # or instead: the case's params it flips (None: n/a)
    twins: tuple[str, ...] = ()  # variants that are the same arithmetic on some shapes (named together there)
    # Bits of evidence a pass under this variant needs (0: a pass is evidence enough). A tie order
    # matches one tied row by chance: it is named only where the tied rows it decides hold at least
    # this many bits of choice (log2 of the ways to pick the tied ids), i.e. a chance of 2^-evidence.
    evidence: float = 0.0


@contextlib.contextmanager
def together(variants) -> Iterator[Callable[[dict], dict]]:
    """Every variant of `variants` in force at once; yields what they make of a case's params."""
    with contextlib.ExitStack() as stack:
        flips = []
        for v in variants:
            if v.params is not None:
                flips.append(v.params)
            else:
                stack.enter_context(v.apply())

        def params(p: dict) -> dict:
            for flip in flips:
                p = flip(p)
            return p

        yield params


def _wrap(target: str, around: Callable[[Any], Callable]) -> Callable[[], ContextManager]:
    return lambda: replaced(target, around)


def _both(*makers: Callable[[], ContextManager]) -> Callable[[], ContextManager]:
    @contextlib.contextmanager
    def apply() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for make in makers:
                stack.enter_context(make())
            yield

    return apply


# --- RMSNorm ---------------------------------------------------------------------------------


def _norm_bf16_before_weight(original):
    def rms_norm(x, weight, eps=1e-20):
        unit = original(x, torch.ones_like(weight, dtype=torch.float32), eps)  # x * rsqrt, rounded to x.dtype
        # `weight * unit.to(bf16)` as written: bf16 whatever x's dtype (an fp32 input too), the product in
        # the promoted dtype (bf16 with a bf16 weight: a second rounding), then x's dtype
        return (weight * unit.to(torch.bfloat16)).to(x.dtype)

    return rms_norm


def _norm_eps_times(factor: float):
    def make(original):
        def rms_norm(x, weight, eps=1e-20):
            return original(x, weight, eps * factor)

        return rms_norm

    return make


def _norm_bf16_throughout(original):
    """RMSNorm on bf16 tensors: every op's result rounded to bf16 (squares, their mean, + eps with eps a
    bf16 constant, rsqrt, x * rsqrt, * weight), as torch computes `x.pow(2).mean(-1) + eps` and
    `torch.rsqrt` on a bf16 x."""
    from ..reference.numerics import to_bf16

    def rms_norm(x, weight, eps=1e-20):
        original(x, weight, eps)  # its shape checks
        b = lambda t: to_bf16(t).double()  # noqa: E731
        xb = b(x.double())
        var = b(b(xb * xb).mean(-1, keepdim=True))
        inv = b(1.0 / torch.sqrt(b(var + b(torch.tensor(eps, dtype=torch.float64)))))
        return to_bf16(b(xb * inv) * b(weight.double())).to(x.dtype)

    return rms_norm


def _norm_output_bf16(original):
    def rms_norm(x, weight, eps=1e-20):
        return original(x, weight, eps).to(torch.bfloat16).to(x.dtype)  # bf16 precision whatever x's dtype

    return rms_norm


# --- RoPE --------------------------------------------------------------------------------------


def _rope_bf16_table(original):
    def apply_rotary(x, table, rope_dim, inverse=False):
        return original(x, table.to(torch.bfloat16).float(), rope_dim, inverse)

    return apply_rotary


def _tail_order(rope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(gather, scatter) of the tail channels: halves (j, j + rd/2) as interleaved pairs and back."""
    half = rope_dim // 2
    gather = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return gather, torch.argsort(gather)


def _rope_halves(original):
    def apply_rotary(x, table, rope_dim, inverse=False):
        gather, scatter = _tail_order(rope_dim)
        head, tail = x[..., :-rope_dim], x[..., -rope_dim:]
        turned = original(tail[..., gather].contiguous(), table, rope_dim, inverse)
        return torch.cat([head, turned[..., scatter]], dim=-1)

    return apply_rotary


def _rope_first_dims(original):
    def apply_rotary(x, table, rope_dim, inverse=False):
        moved = torch.cat([x[..., rope_dim:], x[..., :rope_dim]], dim=-1)
        turned = original(moved, table, rope_dim, inverse)
        return torch.cat([turned[..., -rope_dim:], turned[..., :-rope_dim]], dim=-1)

    return apply_rotary


def _yarn_betas_swapped(original):
    def yarn_correction_range(dim, base, original_seq_len, beta_fast, beta_slow):
        return original(dim, base, original_seq_len, beta_slow, beta_fast)

    return yarn_correction_range


def _yarn_no_ramp(original):
    def yarn_correction_range(dim, base, original_seq_len, beta_fast, beta_slow):
        original(dim, base, original_seq_len, beta_fast, beta_slow)
        return -1, -1  # ramp = 1 for every pair: every frequency divided by the factor

    return yarn_correction_range


# --- quantisers --------------------------------------------------------------------------------


def _e2m1_zero_input_sign_lost(original):
    def e2m1_round(v):
        return torch.where(v == 0, torch.zeros_like(v), original(v))  # sign(v) * table[i]: sign(-0) is 0

    return e2m1_round


def _e2m1_sign_lost(original):
    def e2m1_round(v):
        q = original(v)
        return torch.where(q == 0, torch.zeros_like(q), q)  # sign(v) * table[i]: -0 comes out +0

    return e2m1_round


def _pow2_floor(original):
    def pow2_ceil(y):
        up = original(y)
        return torch.where(up == y, up, up / 2)  # 2^floor(log2 y): one binade down unless exact

    return pow2_ceil


def _fp8_blocks(block: int):
    """Scales computed over `block` elements, stored per block of 32 as the contract lays them out."""

    def make(original):
        def fp8_qdq_ue8m0(x, b=32):
            if x.shape[-1] % block:
                return original(x, b)
            q = original(x, block)
            times = block // b
            return type(q)(
                q.y, q.codes, q.scale_bytes.repeat_interleave(times, -1), q.scales.repeat_interleave(times, -1)
            )

        return fp8_qdq_ue8m0

    return make


def _fp8_no_floor(original):
    """act_quant with no amax floor: an all-zero block gets the scale 0 (pow2_ceil on the bits of 0),
    so 0 / 0 writes NaN codes and NaN values; other blocks as with the floor."""

    def fp8_qdq_ue8m0(x, b=32):
        q = original(x, b)
        zero = x.float().unflatten(-1, (-1, b)).abs().amax(-1) == 0  # [..., nb]: all-zero blocks
        if not bool(zero.any()):
            return q
        nan = torch.zeros(()) / torch.zeros(())  # the NaN a division 0 / 0 gives (its sign is the machine's)
        codes = q.codes.unflatten(-1, (-1, b)).clone()
        codes[zero] = nan.to(torch.float8_e4m3fn).view(torch.uint8)
        y = q.y.unflatten(-1, (-1, b)).clone()
        y[zero] = (codes[zero].view(torch.float8_e4m3fn).float() * 0.0).to(torch.bfloat16)  # y = q * s, s = 0
        scales = torch.where(zero, torch.zeros_like(q.scales), q.scales)
        scale_bytes = torch.where(zero, torch.zeros_like(q.scale_bytes), q.scale_bytes)
        return type(q)(y.flatten(-2), codes.flatten(-2), scale_bytes, scales)

    return fp8_qdq_ue8m0


def _e2m1_ties_away(original):
    def e2m1_round(v):
        q = original(v)
        mag, step = v.abs().clamp(max=6.0), torch.where(v.abs() < 2.0, 0.5, torch.where(v.abs() < 4.0, 1.0, 2.0))
        tie = (mag / step - torch.floor(mag / step)) == 0.5  # exactly between two codes
        up = torch.copysign(((torch.floor(mag / step) + 1) * step).clamp(max=6.0), v)
        return torch.where(tie, up, q)

    return e2m1_round


def _fp4_e4m3_as_pow2_blocks32(original):
    from ..reference import numerics as nx

    def fp4_qdq_e4m3(x, block=16):
        return original(x, block) if x.shape[-1] % 32 else nx.fp4_qdq_e8m0(x, 32)

    return fp4_qdq_e4m3


def _fp4_e4m3_bf16_scale(original):
    from ..reference import numerics as nx

    def fp4_qdq_e4m3(x, block=16):
        xg = nx._blocks(x, block, "fp4_qdq_e4m3")
        amax = xg.abs().amax(dim=-1).clamp_min(nx.FP4_E4M3_AMAX_FLOOR)
        s = (amax / nx.E2M1_MAX).to(torch.bfloat16).float()  # the scale kept in bf16, not e4m3
        codes, y = nx._fp4_codes_and_y(xg, s)
        return nx.QuantResult(y, codes, original(x, block).scale_bytes, s)

    return fp4_qdq_e4m3


# --- what GPU libraries' quantisers do ---------------------------------------------------------


def _e2m1_ties_toward_zero(original):
    """e2m1 rounding whose midpoints all go to the smaller magnitude: code = how many of the midpoints
    0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 lie strictly below |v|. DeepGEMM's `deep_gemm/utils/math.py`
    (`_quantize_to_fp4_e2m1`, behind `per_token_cast_to_fp4`) buckets |v| with `torch.bucketize` over
    those midpoints (a value equal to one lands in the lower bucket); TensorRT-LLM's
    `cpp/tensorrt_llm/kernels/fusedCatFp4.cu` (`quantizeFp4E2M1`) sums `|v| > midpoint`. Upstream's
    ties-to-even sends 0.25, 1.25, 2.5 and 5 down too, so only 0.75, 1.75 and 3.5 (in units of the
    block scale) differ: the even code is above them. Both libraries also drop the sign of a negative
    value that rounds to zero: that is `e2m1-minus-zero-lost`, left out here (one deviation per
    variant; a port with both is named as the pair)."""

    def e2m1_round(v):
        q = original(v)
        mag = v.abs().clamp(max=6.0)
        step = torch.where(mag < 2.0, 0.5, torch.where(mag < 4.0, 1.0, 2.0))  # the grid spacing of mag's binade
        units = mag / step  # exact: step is a power of two
        tie = (units - torch.floor(units)) == 0.5
        down = torch.copysign(torch.floor(units) * step, q)  # the lower neighbour, with the sign `original` gave
        return torch.where(tie, down, q)

    return e2m1_round


def _e2m1_decode_plus_zero(original):
    """A dequantisation table with +0 at code 8: DeepGEMM's `deep_gemm/utils/math.py`
    (`_dequantize_from_fp4_e2m1`, used by `cast_back_from_fp4`) negates a value only where its sign bit
    is set and its magnitude index is not 0, so the code of -0 reads back as +0. The codes are
    untouched."""

    def e2m1_decode(codes):
        values = original(codes)
        return torch.where(values == 0, torch.zeros_like(values), values)

    return e2m1_decode


def _fp8_scale_floor(floor: float):
    """fp8 scales floored *after* the division by 448: s = 2^ceil(log2(max(amax / 448, floor))), where
    upstream floors amax itself (max(amax, 1e-4), then amax * fp32(1/448)). FlashMLA's test reference
    `tests/quant.py` (`_cast_scale_inv_to_ue8m0`, used by `quantize_k_cache`) clamps the scale at 1e-4
    this way, so every block whose amax is at most 448 * 2^-14 (about 0.027) gets the scale 2^-13 instead
    of its own. The division and torch's log2/ceil give the same power of two as upstream's product and
    bit trick on every bf16 amax (tests/test_diagnosis_libraries.py checks all of them)."""

    def make(original):
        from ..reference import numerics as nx

        def fp8_qdq_ue8m0(x, b=32):
            xg = nx._blocks(x, b, "fp8_qdq_ue8m0")
            amax = xg.abs().amax(dim=-1)  # [..., nb]
            s = nx.pow2_ceil((amax * nx.FP8_MAX_INV).clamp_min(floor))
            q8 = (xg / s.unsqueeze(-1)).clamp(-nx.E4M3_MAX, nx.E4M3_MAX).to(torch.float8_e4m3fn)
            y = (q8.to(torch.float32) * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
            return nx.QuantResult(y, q8.view(torch.uint8).flatten(-2), nx.e8m0_byte(s), s)

        return fp8_qdq_ue8m0

    return make


# --- fp8 Linear --------------------------------------------------------------------------------


def _no_act_quant(original):
    from ..reference import fp8_linear as fp8
    from ..reference import numerics as nx

    def linear_fp8(x, weight):
        done = original(x, weight)
        y = nx.linear_bf16(x, fp8.dequantise_weight(weight).to(torch.bfloat16))  # bf16 activations
        return fp8.Fp8LinearResult(y, done.x_codes, done.x_scale_bytes)

    return linear_fp8


# --- index scores ------------------------------------------------------------------------------


SCORE_STEPS = {"relu": True, "weights": True}  # the steps of an index score a variant may leave out


def _score_flags(original, change: dict) -> dict:
    """The steps in force: the reference's, with what the variants already in force and this one change
    (two variants of the scores together compose)."""
    return {**SCORE_STEPS, **getattr(original, "flags", {}), **change}


def _scores(**change: bool):
    """`_scores_and_terms` with steps left out (`relu`, `weights`: False leaves it out)."""

    def make(original):
        flags = _score_flags(original, change)
        reference = getattr(original, "reference", original)

        def scores_and_terms(q, k, w, with_terms):
            terms = reference(q, k, w, True)[1] if with_terms else None  # the term scales stay the reference's
            s = torch.einsum("bshd,btd->bsht", q.double(), k.double()).float().to(torch.bfloat16).float()
            s = s.relu() if flags["relu"] else s
            ww = w.float()[..., None] if flags["weights"] else torch.ones_like(w.float())[..., None]
            p = (s * ww).to(torch.bfloat16).float()
            return (p.double().sum(dim=2).float().to(torch.bfloat16) + 0.0), terms

        scores_and_terms.flags, scores_and_terms.reference = flags, reference
        return scores_and_terms

    return make


def _exact_scores(**change: bool):
    """`exact_index_scores` with the same steps left out as `_scores` (the exact value the judge measures
    precision against follows the variant, as the scores do)."""

    def make(original):
        flags = _score_flags(original, change)
        reference = getattr(original, "reference", original)

        def exact_index_scores(q, k, w):
            from ..ulps import ulp_of

            reference(q, k, w)  # its checks
            dots = torch.einsum("bshd,btd->bsht", q.double(), k.double())
            s = dots.relu() if flags["relu"] else dots
            ww = w.double()[..., None] if flags["weights"] else torch.ones_like(w.double())[..., None]
            terms = s * ww
            total = terms.sum(dim=2)
            half = lambda v: ulp_of(v, torch.bfloat16) / 2  # noqa: E731
            bound = ((half(s) * ww.abs()).masked_fill(s == 0, 0.0) + half(terms).masked_fill(terms == 0, 0.0)).sum(2)
            return total, bound + half(total)

        exact_index_scores.flags, exact_index_scores.reference = flags, reference
        return exact_index_scores

    return make


def _score_variant(**change: bool) -> Callable[[], ContextManager]:
    return _both(
        _wrap(f"{INDEXER}:_scores_and_terms", _scores(**change)),
        _wrap(f"{INDEXER}:exact_index_scores", _exact_scores(**change)),
    )


def _unscaled_head_weights(original):
    from ..reference import numerics as nx

    def head_weights(x, weights_proj, index_head_dim, index_n_heads):
        original(x, weights_proj, index_head_dim, index_n_heads)  # its shape checks
        return nx.linear_bf16(x, weights_proj) * index_n_heads**-0.5  # softmax_scale left for the scores

    return head_weights


def _lowest_index_topk(original):
    def torch_cpu_topk(values, k, dim=-1, largest=True, sorted=True):
        order = torch.sort(values.float(), dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)
        return values.gather(dim, order), order

    return torch_cpu_topk


# --- candidates, window, compressor, sparse attention ----------------------------------------


def _blocks_padded_with_zero(original):
    def select_candidate_blocks(logits, compress_lens, topk_blocks, block_size):
        W = logits.shape[-1]
        pad = -W % block_size
        if not pad:
            return original(logits, compress_lens, topk_blocks, block_size)
        padded = torch.cat([logits, torch.zeros(*logits.shape[:-1], pad, dtype=logits.dtype)], dim=-1)
        sel = original(padded, compress_lens, topk_blocks, block_size)
        return type(sel)(sel.mask[..., :W], *sel[1:])

    return select_candidate_blocks


def _newest_first(original):
    def window_ids(*args, **kwargs):
        return original(*args, **kwargs).flip(-1).contiguous()  # the ring read backwards: newest lane first

    return window_ids


def _gate_softmax_over_channels(original):
    def pool_group(group):
        score, latent = group[:, :, 0].double(), group[:, :, 1].double()
        weights = torch.softmax(score, dim=-1)  # over the head dim, not over the group's positions
        return (latent * weights).sum(dim=1).float()

    return pool_group


def _logits_bf16(original):
    """The attention logits as `matmul(q, k.T) * scale` on bf16 tensors (each rounded to bf16), then
    one fp32 softmax with the sink, P @ V in fp32, o rounded to bf16."""
    from ..reference.sparse_attn import _gather
    from ..reference.numerics import to_bf16

    def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
        original(q[:, :0], kv, attn_sink, topk_idxs[:, :0], softmax_scale)  # its checks, on no rows
        rows, present = _gather(kv, topk_idxs, torch.float64)  # [b,m,K,d]
        dots = to_bf16(torch.einsum("bmhd,bmkd->bmhk", q.double(), rows)).double()
        s = to_bf16(dots * softmax_scale).float().masked_fill(~present.unsqueeze(2), float("-inf"))
        sink = attn_sink.float().view(1, 1, -1).expand(s.shape[:-1]).unsqueeze(-1)
        p = torch.softmax(torch.cat([s, sink], dim=-1).double(), dim=-1)[..., :-1]
        return torch.einsum("bmhk,bmkd->bmhd", p, rows).to(torch.bfloat16)

    return sparse_attn


def _eager_bf16_with_sinks(original):
    """transformers' eager attention with sinks on bf16 tensors (`eager_attention_forward` of
    models/gpt_oss/modeling_gpt_oss.py, which ports with a sink reuse): `matmul(q, k.T) * scaling` in bf16,
    the sinks (a bf16 parameter) concatenated as one more logit column, that row's max subtracted in
    bf16, `softmax(..., dtype=bf16)` (fp32 inside, probabilities rounded to bf16), the sink column
    dropped, `matmul(probs, v)` in bf16 (fp32 accumulation, one rounding). Beside `attention-logits-bf16`
    it also rounds the sink, each logit less the max, and P: under a large sink the shifted logits lie
    where bf16's step is a quarter, and P moves by up to an eighth of itself."""
    from ..reference.sparse_attn import _gather
    from ..reference.numerics import to_bf16

    def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
        original(q[:, :0], kv, attn_sink, topk_idxs[:, :0], softmax_scale)  # its checks, on no rows
        rows, present = _gather(kv, topk_idxs, torch.float64)  # [b,m,K,d]
        dots = to_bf16(torch.einsum("bmhd,bmkd->bmhk", q.double(), rows)).float()
        s = (dots * softmax_scale).to(torch.bfloat16).masked_fill(~present.unsqueeze(2), float("-inf"))
        sink = attn_sink.to(torch.bfloat16).view(1, 1, -1).expand(s.shape[:-1]).unsqueeze(-1)
        logits = torch.cat([s, sink], dim=-1)
        shifted = (logits.float() - logits.float().amax(dim=-1, keepdim=True)).to(torch.bfloat16)
        p = torch.softmax(shifted.float(), dim=-1).to(torch.bfloat16)[..., :-1]
        return to_bf16(torch.einsum("bmhk,bmkd->bmhd", p.double(), rows))

    return sparse_attn


def _sink_scaled(original):
    def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
        return original(q, kv, attn_sink * softmax_scale, topk_idxs, softmax_scale)

    return sparse_attn


def _sink_left_out(original):
    def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
        return original(q, kv, torch.full_like(attn_sink, float("-inf")), topk_idxs, softmax_scale)

    return sparse_attn


def _flip(key: str, values: tuple[str, str], default: str) -> Callable[[dict], dict | None]:
    def params(p: dict) -> dict | None:
        now = p.get(key, default)
        return {**p, key: values[1] if now == values[0] else values[0]}

    return params


VARIANTS: tuple[Variant, ...] = (
    # policies first: the commonest real divergence, and one flip of the case's params
    Variant(
        "candidate-leak-other-policy",
        "the other candidate_leak policy: drop (-1) where the case leaks masked rows, or leak where it drops",
        "params.candidate_leak flipped",
        ("indexer.select", "indexer"),
        params=_flip("candidate_leak", ("upstream", "drop"), "upstream"),
    ),
    Variant(
        "stale-index-keys-other-policy",
        "the other index-key policy: stale keys read where the case refreshes "
        "them, or refreshed where it reads them stale (§10.1)",
        "params.index_k_policy flipped",
        ("attention",),
        params=_flip("index_k_policy", ("upstream", "fixed"), "upstream"),
    ),
    Variant(
        "rmsnorm-bf16-before-weight",
        "RMSNorm rounds x * rsqrt(mean(x^2) + eps) to bf16 before the weight "
        "multiply (two roundings: weight * x.to(bf16))",
        "numerics.rms_norm: one rounding more",
        NORM_USERS,
        _wrap(f"{NUMERICS}:rms_norm", _norm_bf16_before_weight),
    ),
    Variant(
        "rmsnorm-eps",
        "RMSNorm with 10x the model's eps",
        "numerics.rms_norm: eps * 10",
        NORM_USERS,
        _wrap(f"{NUMERICS}:rms_norm", _norm_eps_times(10.0)),
    ),
    Variant(
        "rmsnorm-bf16-throughout",
        "RMSNorm computed on bf16 tensors throughout: squares, their mean, rsqrt "
        "and both products each rounded to bf16 (upstream: fp32 inside, one rounding)",
        "numerics.rms_norm: every op in bf16",
        NORM_USERS,
        _wrap(f"{NUMERICS}:rms_norm", _norm_bf16_throughout),
    ),
    Variant(
        "rmsnorm-output-bf16",
        "RMSNorm output rounded to bf16 whatever the input's dtype (an fp32 input gets bf16 precision back)",
        "numerics.rms_norm: result through bf16",
        ("norm.rms",),
        _wrap(f"{NUMERICS}:rms_norm", _norm_output_bf16),
    ),
    Variant(
        "rope-bf16-table",
        "RoPE with cos/sin rounded to bf16 before the rotation",
        "rope.apply_rotary: the fp32 table rounded to bf16",
        ROPE_USERS,
        _wrap(f"{ROPE}:apply_rotary", _rope_bf16_table),
    ),
    Variant(
        "rope-halves",
        "RoPE pairs channels (j, j + rope_dim/2) (rotate_half) where upstream pairs (2i, 2i + 1)",
        "rope.apply_rotary: the tail's layout",
        ROPE_USERS,
        _wrap(f"{ROPE}:apply_rotary", _rope_halves),
    ),
    Variant(
        "rope-first-dims",
        "RoPE on the first rope_dim channels instead of the last",
        "rope.apply_rotary: which channels rotate",
        ROPE_USERS,
        _wrap(f"{ROPE}:apply_rotary", _rope_first_dims),
    ),
    Variant(
        "yarn-betas-swapped",
        "YaRN ramp with beta_fast and beta_slow swapped",
        "rope.yarn_correction_range: the betas' order",
        TABLE_USERS,
        _wrap(f"{ROPE}:yarn_correction_range", _yarn_betas_swapped),
    ),
    Variant(
        "yarn-no-ramp",
        "YaRN without its ramp: every frequency divided by the factor (upstream keeps the "
        "high frequencies and blends between beta_fast and beta_slow)",
        "rope.yarn_correction_range: ramp 1 everywhere",
        TABLE_USERS,
        _wrap(f"{ROPE}:yarn_correction_range", _yarn_no_ramp),
    ),
    Variant(
        "e2m1-minus-zero-lost",
        "fp4 (e2m1) rounding turns every -0 into +0 (a dequantisation table with +0 at the code of -0)",
        "numerics.e2m1_round: the sign of zero",
        E2M1_USERS,
        _wrap(f"{NUMERICS}:e2m1_round", _e2m1_sign_lost),
    ),
    Variant(
        "e2m1-zero-input-sign-lost",
        "fp4 (e2m1) rounding gives +0 where its input is exactly -0, and keeps "
        "-0 where a negative value rounds to zero (sign(v) * table[i]: sign(-0) is 0)",
        "numerics.e2m1_round: +0 at a zero input",
        E2M1_USERS,
        _wrap(f"{NUMERICS}:e2m1_round", _e2m1_zero_input_sign_lost),
    ),
    Variant(
        "e2m1-ties-away",
        "fp4 (e2m1) rounding with ties away from zero instead of to the even code",
        "numerics.e2m1_round: tie rule",
        E2M1_USERS,
        _wrap(f"{NUMERICS}:e2m1_round", _e2m1_ties_away),
    ),
    Variant(
        "e2m1-ties-toward-zero",
        "fp4 (e2m1) rounding with every midpoint to the smaller magnitude (0.75 -> 0.5, 1.75 -> 1.5, 3.5 -> 3 "
        "in units of the block scale) where upstream rounds to the even code (DeepGEMM per_token_cast_to_fp4, "
        "TensorRT-LLM fusedCatFp4)",
        "numerics.e2m1_round: ties toward zero",
        E2M1_USERS,
        _wrap(f"{NUMERICS}:e2m1_round", _e2m1_ties_toward_zero),
    ),
    Variant(
        "e2m1-dequant-minus-zero-as-plus-zero",
        "fp4 (e2m1) codes right (code 8 kept for a negative value that rounds to zero) but dequantised "
        "through a table with +0 at code 8: the value is +0 where upstream's is -0 (DeepGEMM cast_back_from_fp4)",
        "numerics.e2m1_decode: +0 at code 8",
        E2M1_USERS,
        _wrap(f"{NUMERICS}:e2m1_decode", _e2m1_decode_plus_zero),
    ),
    Variant(
        "fp4-amax-floor-1e-4",
        "fp4 power-of-two scales with amax floored at 1e-4 where upstream floors at 6 * 2^-126: an all-zero "
        "block gets the scale 2^-15 instead of 2^-126, a block below 1e-4 a coarser scale "
        "(DeepGEMM per_token_cast_to_fp4)",
        "numerics.FP4_E8M0_AMAX_FLOOR: 1e-4",
        FP4_E8M0_USERS,
        lambda: constant(f"{NUMERICS}:FP4_E8M0_AMAX_FLOOR", 1e-4),
    ),
    Variant(
        "fp4-amax-floor-1e-12",
        "fp4 power-of-two scales with amax floored at 1e-12 where upstream floors at 6 * 2^-126: an all-zero "
        "block gets the scale 2^-42 instead of 2^-126 (TensorRT-LLM fusedCatFp4)",
        "numerics.FP4_E8M0_AMAX_FLOOR: 1e-12",
        FP4_E8M0_USERS,
        lambda: constant(f"{NUMERICS}:FP4_E8M0_AMAX_FLOOR", 1e-12),
    ),
    Variant(
        "pow2-scale-floor",
        "power-of-two scales rounded down (floor) instead of up (ceil)",
        "numerics.pow2_ceil: floor",
        POW2_USERS,
        _wrap(f"{NUMERICS}:pow2_ceil", _pow2_floor),
    ),
    Variant(
        "fp8-blocks-64",
        "fp8 act_quant / window quantisation in blocks of 64 instead of 32",
        "numerics.fp8_qdq_ue8m0: block 64",
        FP8_USERS,
        _wrap(f"{NUMERICS}:fp8_qdq_ue8m0", _fp8_blocks(64)),
    ),
    Variant(
        "fp8-blocks-128",
        "fp8 act_quant / window quantisation in blocks of 128 instead of 32",
        "numerics.fp8_qdq_ue8m0: block 128",
        FP8_USERS,
        _wrap(f"{NUMERICS}:fp8_qdq_ue8m0", _fp8_blocks(128)),
    ),
    Variant(
        "fp8-no-amax-floor",
        "fp8 quantisation without the amax floor of 1e-4 (tiny blocks get tiny scales)",
        "numerics.FP8_AMAX_FLOOR: 448 * 2^-126",
        FP8_USERS,
        lambda: constant(f"{NUMERICS}:FP8_AMAX_FLOOR", 448.0 * 2.0**-126),
    ),
    Variant(
        "fp8-no-amax-floor-at-all",
        "fp8 quantisation with no amax floor at all: an all-zero block gets the "
        "scale 0, and 0 / 0 writes NaN codes and values",
        "numerics.fp8_qdq_ue8m0: zero blocks NaN",
        FP8_USERS,
        _wrap(f"{NUMERICS}:fp8_qdq_ue8m0", _fp8_no_floor),
    ),
    Variant(
        "fp8-scale-floor-1e-4",
        "fp8 scales floored at 1e-4 after the division by 448 (max(amax / 448, 1e-4)) where upstream floors "
        "amax at 1e-4: every block with amax up to about 0.027 gets the scale 2^-13 (FlashMLA quantize_k_cache)",
        "numerics.fp8_qdq_ue8m0: scale floor 1e-4",
        FP8_USERS,
        _wrap(f"{NUMERICS}:fp8_qdq_ue8m0", _fp8_scale_floor(1e-4)),
    ),
    Variant(
        "fp4-e4m3-as-pow2-blocks-32",
        "compressed-KV fp4 in blocks of 32 with power-of-two scales where upstream uses blocks of 16 with e4m3 scales",
        "numerics.fp4_qdq_e4m3: fp4_qdq_e8m0 block 32",
        FP4_E4M3_USERS,
        _wrap(f"{NUMERICS}:fp4_qdq_e4m3", _fp4_e4m3_as_pow2_blocks32),
    ),
    Variant(
        "fp4-e4m3-scale-bf16",
        "compressed-KV fp4 scales kept in bf16 instead of e4m3",
        "numerics.fp4_qdq_e4m3: scale rounding",
        FP4_E4M3_USERS,
        _wrap(f"{NUMERICS}:fp4_qdq_e4m3", _fp4_e4m3_bf16_scale),
    ),
    Variant(
        "fp8-linear-without-act-quant",
        "fp8 Linears without act_quant: bf16 activations times the dequantised weight",
        "fp8_linear.linear_fp8: no activation quantisation",
        FP8_USERS,
        _wrap(f"{REF}.fp8_linear:linear_fp8", _no_act_quant),
    ),
    Variant(
        "index-scores-scale-on-scores",
        "softmax_scale (index_head_dim^-0.5) left out of the head weights and "
        "applied to the scores instead (upstream: weights_proj(x) * softmax_scale * n_heads^-0.5, bf16)",
        "indexer.head_weights: n_heads^-0.5 only",
        ("indexer.weights",),
        _wrap(f"{INDEXER}:head_weights", _unscaled_head_weights),
    ),
    Variant(
        "index-scores-without-relu",
        "index scores without the ReLU of each head's dot product",
        "indexer._scores_and_terms: no ReLU",
        SCORE_USERS,
        _score_variant(relu=False),
    ),
    Variant(
        "index-scores-without-head-weights",
        "index scores summed over heads without the head weights",
        "indexer._scores_and_terms: w = 1",
        SCORE_USERS,
        _score_variant(weights=False),
    ),
    Variant(
        "topk-lowest-index-ties",
        "top-k breaking ties by the lowest index (a stable sort, CUDA-like or "
        "argpartition) instead of torch's CPU order",
        "topk.torch_cpu_topk: stable order",
        SELECT_USERS,
        _wrap(f"{REF}.topk:torch_cpu_topk", _lowest_index_topk),
        evidence=TIE_EVIDENCE_BITS,
    ),
    Variant(
        "candidate-blocks-zero-padding",
        "candidate blocks padded with 0 instead of -inf past the last row",
        "candidates.select_candidate_blocks: padding value",
        ("candidates.select", "attention"),
        _wrap(f"{REF}.candidates:select_candidate_blocks", _blocks_padded_with_zero),
    ),
    Variant(
        "window-newest-first",
        "window lanes ordered newest first instead of oldest first",
        "window.window_ids_*: order",
        ("window.indices", "attention"),
        _both(
            _wrap(f"{REF}.window:window_ids_prefill", _newest_first),
            _wrap(f"{REF}.window:window_ids_decode", _newest_first),
            _wrap(f"{REF}.window:window_ids_chunk", _newest_first),
        ),
    ),
    Variant(
        "gate-softmax-over-channels",
        "the compressor's gate softmax taken over the channels instead of over the group's positions",
        "compressor.pool_group: softmax axis",
        ("compressor", "attention"),
        _wrap(f"{REF}.compressor:pool_group", _gate_softmax_over_channels),
    ),
    Variant(
        "attention-logits-bf16",
        "attention logits computed on bf16 tensors (matmul(q, k.T) * scale, each "
        "rounded to bf16) where upstream keeps the fp32 dot products",
        "sparse_attn.sparse_attn: bf16 logits",
        ("sparse_attn", "attention"),
        _wrap(f"{REF}.sparse_attn:sparse_attn", _logits_bf16),
    ),
    Variant(
        "attention-eager-bf16-with-sinks",
        "attention as transformers' eager path with sinks on bf16 tensors: bf16 logits, a bf16 sink column, "
        "the max subtracted in bf16, bf16 probabilities, P @ V rounded once",
        "sparse_attn.sparse_attn: the eager bf16 softmax",
        ("sparse_attn", "attention"),
        _wrap(f"{REF}.sparse_attn:sparse_attn", _eager_bf16_with_sinks),
    ),
    Variant(
        "sink-left-out",
        "sparse attention without the sink in the softmax denominator",
        "sparse_attn.sparse_attn: sink -inf",
        ("sparse_attn", "attention"),
        _wrap(f"{REF}.sparse_attn:sparse_attn", _sink_left_out),
    ),
    Variant(
        "sink-scaled",
        "the sink logit multiplied by softmax_scale like the scores (it is a raw logit)",
        "sparse_attn.sparse_attn: sink * softmax_scale",
        ("sparse_attn", "attention"),
        _wrap(f"{REF}.sparse_attn:sparse_attn", _sink_scaled),
    ),
)


def variant(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise KeyError(f"no diagnosis variant {name!r}; known: {', '.join(v.name for v in VARIANTS)}")
