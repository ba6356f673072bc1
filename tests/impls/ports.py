"""Ports written apart from the diagnosis catalogue, as real ones are, to test what the diagnosis
names (docs/diagnosis.md): each carries the bugs its docstring says and nothing else, in its own
arithmetic (upstream's torch ops through `gate_upstream.UpstreamTorch`, torch's native fp32 and bf16
kernels whose last bits vary by CPU), so a diagnosis that demanded bit-identity would miss them.
"""

from __future__ import annotations

import torch

import upstream_ops as up
from gate_upstream import UpstreamTorch
from patching import patched
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import attention as ref_attention
from v41_conformance.reference import compressor as ref_compressor
from v41_conformance.reference import candidates as ref_candidates
from v41_conformance.reference import indexer as ref_indexer
from v41_conformance.reference import kv_finish as ref_kv_finish
from v41_conformance.reference import sparse_attn as ref_sparse

NINF = float("-inf")
ORIGINAL = {
    name: getattr(up, name)
    for name in (
        "sparse_attn",
        "rms_norm",
        "apply_rotary_emb",
        "e2m1_code",
        "act_quant",
        "yarn_inv_freq",
        "index_scores",
    )
}


class Patched(UpstreamTorch):
    """UpstreamTorch with `up.<name>` replaced as `patches` says, in every component."""

    patches: dict = {}

    def run(self, component, inputs, params):
        with _all(self.patches):
            return super().run(component, inputs, params)


class _all:
    def __init__(self, patches: dict):
        self.stack = [patched(up, name, fn) for name, fn in patches.items()]

    def __enter__(self):
        for p in self.stack:
            p.__enter__()

    def __exit__(self, *exc):
        for p in reversed(self.stack):
            p.__exit__(*exc)


# --- the bugs, each as a port writes it ---------------------------------------------------------


def hf_sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    """A transformers-style eager attention over the gathered rows: bf16 matmul logits times the
    scale (bf16), the sinks concatenated as one more logit column, softmax in bf16, P @ V in bf16."""
    present = topk_idxs >= 0
    batch = torch.arange(kv.shape[0]).view(-1, 1, 1)
    rows = kv[batch, topk_idxs.clamp_min(0).long()] * present.unsqueeze(-1)  # [b, m, K, d] bf16
    logits = torch.matmul(q, rows.transpose(-1, -2)) * softmax_scale  # [b, m, h, K] bf16
    logits = logits.masked_fill(~present.unsqueeze(2), NINF)
    sinks = attn_sink.to(q.dtype).view(1, 1, -1, 1).expand(*logits.shape[:-1], 1)
    combined = torch.cat([logits, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    return torch.matmul(probs, rows)


def norm_fp32_then_bf16(x, weight, eps):
    """RMSNorm in fp32, its result always through bf16 (a kernel whose output buffer is bf16)."""
    xf = x.float()
    y = weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))
    return y.to(torch.bfloat16).to(x.dtype)


def norm_all_bf16(x, weight, eps):
    """RMSNorm written on bf16 tensors: every op rounds to bf16. Its rsqrt rounds an fp32 rsqrt to bf16
    (torch's own bf16 rsqrt does so on a GPU; its AVX-512 CPU path approximates the last bit, which
    rounds some rows' scale the other way: docs/diagnosis.md, "Limits")."""
    xb = x.to(torch.bfloat16)
    var = xb.pow(2).mean(-1, keepdim=True)
    inv = torch.rsqrt((var + eps).float()).to(torch.bfloat16)
    return (weight.to(torch.bfloat16) * (xb * inv)).to(x.dtype)


def norm_bf16_before_weight(x, weight, eps):
    """RMSNorm that rounds x * rsqrt(...) to bf16 before the weight (torch's native fp32 mean/rsqrt)."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)).to(x.dtype)


def e2m1_code_sign_times_table(v):
    """e2m1 codes whose sign is sign(v): -0.0 has sign 0, so an input of exactly -0 becomes +0;
    a negative value that rounds to zero keeps its -0."""
    codes = ORIGINAL["e2m1_code"](v)
    return torch.where(v == 0, codes & 0x7, codes)


def act_quant_no_floor(x, block: int = up.FP8_BLOCK):
    """act_quant with no amax floor: scale 2^ceil(log2(0)) = 0 on an all-zero block, 0 / 0 = NaN."""
    xb = x.float().unflatten(-1, (-1, block))
    amax = xb.abs().amax(-1)
    scale = torch.where(amax > 0, up.pow2_ceil(amax.clamp_min(1e-30) * (1.0 / up.E4M3_MAX)), torch.zeros_like(amax))
    q = (xb / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)  # NaN stays NaN
    y = (q.float() * scale.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    return up.Quantised(y, q.view(torch.uint8).flatten(-2), up.e8m0_byte(scale))


def yarn_without_ramp(dim, base, original_seq_len, factor, beta_fast, beta_slow, device="cpu"):
    """YaRN that divides every frequency by the factor."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    return freqs / factor if original_seq_len > 0 else freqs


def rope_bf16_table(x, freqs_cis, inverse: bool = False):
    """RoPE with cos and sin kept in bf16 (a table built in the model's dtype)."""
    table = torch.view_as_complex(torch.view_as_real(freqs_cis).to(torch.bfloat16).float().contiguous())
    return ORIGINAL["apply_rotary_emb"](x, table, inverse)


def scores_no_relu_no_weights(q, k, w):
    """Index scores summing the raw head dot products: no ReLU and no head weights."""
    return torch.einsum("bshd,btd->bsht", q, k).sum(dim=2)


# --- the ports ----------------------------------------------------------------------------------


class HfLogitsBf16(Patched):
    """Attention logits in bf16 (a transformers eager port)."""

    patches = {"sparse_attn": hf_sparse_attn}


class NormOutputBf16(Patched):
    """RMSNorm output through bf16 whatever the input's dtype."""

    patches = {"rms_norm": norm_fp32_then_bf16}


class NormAllBf16(Patched):
    """RMSNorm computed on bf16 tensors."""

    patches = {"rms_norm": norm_all_bf16}


class SignTimesTableE2M1(Patched):
    """fp4 codes with sign(v): -0 lost only where the input is exactly -0 (MLX, a serving fork)."""

    patches = {"e2m1_code": e2m1_code_sign_times_table}


class Fp8NoFloor(Patched):
    """act_quant without any amax floor: NaN codes on all-zero blocks."""

    patches = {"act_quant": act_quant_no_floor}

    def run(self, component, inputs, params):
        if component == "quant.fp8_ue8m0":
            return act_quant_no_floor(inputs["x"])._asdict()
        return super().run(component, inputs, params)


class YarnWithoutRamp(Patched):
    """YaRN dividing every frequency by the factor."""

    patches = {"yarn_inv_freq": yarn_without_ramp}


class NormAndRopeTable(Patched):
    """Two bugs in two stages: RMSNorm rounding before the weight, and a bf16 RoPE table."""

    patches = {"rms_norm": norm_bf16_before_weight, "apply_rotary_emb": rope_bf16_table}


class RopeTableBf16(Patched):
    """One bug: a bf16 RoPE table (a transformers port's table in the model's dtype)."""

    patches = {"apply_rotary_emb": rope_bf16_table}


class NormBeforeWeight(Patched):
    """One bug: RMSNorm rounding before the weight, on torch's native fp32 kernels."""

    patches = {"rms_norm": norm_bf16_before_weight}


class ScoresRaw(Patched):
    """Two bugs in one stage: index scores with neither the ReLU nor the head weights."""

    patches = {"index_scores": scores_no_relu_no_weights}


class OneNonFinite(UpstreamTorch):
    """A correct port whose output holds one NaN (sparse_attn's o) or one +inf (norm.rms's y)."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        name, value = {"sparse_attn": ("o", float("nan")), "norm.rms": ("y", float("inf"))}.get(component, (None, 0))
        if name is not None:
            out[name] = out[name].clone()
            out[name].view(-1)[out[name].numel() // 2] = value
        return out


class TokenByToken(UpstreamTorch):
    """DeepSeek's arithmetic run one token at a time on a chunk (how upstream's own code meets a
    chunked case: prefill once, then single-token decode): each query's top-k over its own visible
    width. Correct; only torch's tie order over another width can differ."""

    def run(self, component, inputs, params):
        whole = super().run(component, inputs, params)
        S = inputs["x"].shape[1]
        if component != "indexer" or S == 1:
            return whole
        start, ratio, k = int(params["start"]), int(params["ratio"]), whole["ids"].shape[-1]
        rows = []
        for i in range(S):  # each token alone at start + i, its top-k over the rows it sees
            seen = (start + i + 1) // ratio
            one = {
                **inputs,
                "x": inputs["x"][:, i : i + 1],
                "qr": inputs["qr"][:, i : i + 1],
                "freqs": inputs["freqs"][i : i + 1],
                "candidates": inputs["candidates"][:, i : i + 1, :seen],
            }
            ids = super().run(component, one, {**params, "start": start + i})["ids"]
            rows.append(torch.cat([ids, ids.new_full((*ids.shape[:-1], k - ids.shape[-1]), -1)], dim=-1))
        return {**whole, "ids": torch.cat(rows, dim=1)}


class CompressorNormBeforeWeight(ReferenceAdapter):
    """The reference's compressor over any chunk schedule (rollbacks included) whose RMSNorm rounds
    before the weight, on torch's native fp32 kernels."""

    def run(self, component, inputs, params):
        with patched(ref_compressor, "rms_norm", norm_bf16_before_weight):
            return super().run(component, inputs, params)


def lowest_index_topk(values, k, dim=-1, largest=True, sorted=True):
    """A top-k keeping the lowest indices among equal values (a stable sort, MLX's argpartition)."""
    order = torch.sort(values.float(), dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)
    return values.gather(dim, order), order


class PolicyAndTies(ReferenceAdapter):
    """An MLX-like attention port: the other index-key policy than the case's (§10.1), and top-k ties
    broken by the lowest index."""

    def run(self, component, inputs, params):
        if component == "attention":
            params = {**params, "index_k_policy": {"upstream": "fixed", "fixed": "upstream"}[params["index_k_policy"]]}
        with (
            patched(ref_indexer, "torch_cpu_topk", lowest_index_topk),
            patched(ref_candidates, "torch_cpu_topk", lowest_index_topk),
        ):
            return super().run(component, inputs, params)


def sink_left_out(q, kv, attn_sink, topk_idxs, softmax_scale):
    """Sparse attention whose softmax denominator leaves the sink out (a port that treats it as absent)."""
    return ref_sparse.sparse_attn(q, kv, torch.full_like(attn_sink, NINF), topk_idxs, softmax_scale)


class RefNormAndSink(ReferenceAdapter):
    """Two bugs in two stages of attention, over any schedule: RMSNorm rounding before the weight (torch's
    native fp32 kernels) and no sink in the softmax denominator."""

    def run(self, component, inputs, params):
        with (
            patched(ref_attention, "rms_norm", norm_bf16_before_weight),
            patched(ref_compressor, "rms_norm", norm_bf16_before_weight),
            patched(ref_kv_finish, "rms_norm", norm_bf16_before_weight),
            patched(ref_attention, "sparse_attn", sink_left_out),
        ):
            return super().run(component, inputs, params)
