"""Correct attention cores that round differently from the reference kernel (docs/attention.md).

The reference (kernel.py's arithmetic) runs a running-max softmax over tiles of 64 lanes and rounds
P to bf16 against the running max before P·V. Ports do otherwise, correctly:

- `TiledFp32P`: the same tiles, P kept in fp32 (no bf16 cast);
- `Tiles128`: tiles of 128 lanes, bf16 P;
- `OnePassBf16P`: one pass over every lane against the final max, bf16 P;
- `SinkColumn64`: float64, the sink an extra logit column of one plain softmax (its probability dropped);
- `SinkFactor64`: float64, a plain softmax over the lanes, then the sink as the factor
  1 / (1 + exp(sink - lse)): an exact rewriting of the same denominator;
- (`wrong_attention.PlainSoftmax`: one fp32 softmax, no tiles.)

Each is the reference with `sparse_attn` swapped (the component and inside `attention`), in fp32
torch arithmetic (BLAS order), and returns the reference's intermediates, so `attention` judges its
o given its own inputs and everything after given its own o and z (docs/verdicts.md, "The chain").
"""

from __future__ import annotations

import torch

import v41_conformance.reference.attention as ref_attention
from v41_conformance.adapters.reference import ReferenceAdapter
from patching import patched

M_INIT = -1e30  # the kernel's finite running-max start: an all-absent row gives 0, never NaN


def _rows(kv: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    present = ids >= 0
    rows = kv[torch.arange(kv.shape[0]).view(-1, 1, 1), ids.long().clamp(min=0)].float()
    return rows * present.unsqueeze(-1), present


def tiled(q, kv, attn_sink, ids, softmax_scale, tile: int = 64, bf16_p: bool = True):
    """Running-max softmax over tiles of `tile` lanes, P optionally rounded to bf16, sink in the
    denominator only; fp32 torch throughout."""
    b, m, h, d = q.shape
    qf = q.float()
    run_max = torch.full((b, m, h), M_INIT)
    denom, acc = torch.zeros(b, m, h), torch.zeros(b, m, h, d)
    for t0 in range(0, ids.shape[-1], tile):
        rows, present = _rows(kv, ids[..., t0 : t0 + tile])
        s = torch.einsum("bmhd,bmtd->bmht", qf, rows) * softmax_scale
        s = s.masked_fill(~present.unsqueeze(2), float("-inf"))
        new_max = torch.maximum(run_max, s.amax(-1))
        alpha = torch.exp(run_max - new_max)
        p = torch.exp(s - new_max.unsqueeze(-1))
        denom = denom * alpha + p.sum(-1)
        pv = p.to(torch.bfloat16).float() if bf16_p else p
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bmht,bmtd->bmhd", pv, rows)
        run_max = new_max
    denom = denom + torch.exp(attn_sink.float().view(1, 1, h) - run_max)
    return (acc / denom.unsqueeze(-1)).to(torch.bfloat16)


def one_pass(q, kv, attn_sink, ids, softmax_scale):
    """Every lane at once against the final max (M_INIT when none is present), bf16 P."""
    b, m, h, d = q.shape
    rows, present = _rows(kv, ids)
    s = torch.einsum("bmhd,bmtd->bmht", q.float(), rows) * softmax_scale
    s = s.masked_fill(~present.unsqueeze(2), float("-inf"))
    top = torch.maximum(torch.full((b, m, h), M_INIT), s.amax(-1) if s.shape[-1] else torch.full((b, m, h), M_INIT))
    p = torch.exp(s - top.unsqueeze(-1))
    denom = p.sum(-1) + torch.exp(attn_sink.float().view(1, 1, h) - top)
    acc = torch.einsum("bmht,bmtd->bmhd", p.to(torch.bfloat16).float(), rows)
    return (acc / denom.unsqueeze(-1)).to(torch.bfloat16)


def _scores64(q, kv, ids, softmax_scale):
    """float64 scores [b, m, h, K] (-inf on absent lanes) and the gathered rows [b, m, K, d]."""
    rows, present = _rows(kv, ids)
    s = torch.einsum("bmhd,bmtd->bmht", q.double(), rows.double()) * softmax_scale
    return s.masked_fill(~present.unsqueeze(2), float("-inf")), rows.double()


def sink_column64(q, kv, attn_sink, ids, softmax_scale):
    """One float64 softmax over the lanes and the sink as one more logit column; the sink's probability
    has no value row. An all-absent row gives the sink probability 1 and o exactly 0."""
    s, rows = _scores64(q, kv, ids, softmax_scale)
    b, m, h, _ = s.shape
    sink = attn_sink.double().view(1, 1, h, 1).expand(b, m, h, 1)
    p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bmht,bmtd->bmhd", p, rows).to(torch.bfloat16)


def sink_factor64(q, kv, attn_sink, ids, softmax_scale):
    """A plain float64 softmax over the lanes, then o times 1 / (1 + exp(sink - lse)), lse the lanes'
    log-sum-exp: the same denominator written as a factor. An all-absent row (lse -inf) gives 0."""
    s, rows = _scores64(q, kv, ids, softmax_scale)
    h = s.shape[2]
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row of -inf only: no lane, no weight
    factor = torch.sigmoid(lse - attn_sink.double().view(1, 1, h))  # 1 / (1 + exp(sink - lse))
    return (torch.einsum("bmht,bmtd->bmhd", p, rows) * factor.unsqueeze(-1)).to(torch.bfloat16)


class Core(ReferenceAdapter):
    """The reference with its attention core replaced by `core` (q, kv, sink, ids, scale) -> o."""

    @staticmethod
    def core(q, kv, attn_sink, ids, softmax_scale):
        raise NotImplementedError

    def run(self, component, inputs, params):
        if component == "sparse_attn":
            return {
                "o": self.core(
                    inputs["q"], inputs["kv"], inputs["attn_sink"], inputs["topk_idxs"], float(params["softmax_scale"])
                )
            }
        if component == "attention":
            with patched(ref_attention, "sparse_attn", self.core):
                return super().run(component, inputs, params)
        return super().run(component, inputs, params)


class TiledFp32P(Core):
    core = staticmethod(lambda q, kv, sink, ids, scale: tiled(q, kv, sink, ids, scale, 64, bf16_p=False))


class Tiles128(Core):
    core = staticmethod(lambda q, kv, sink, ids, scale: tiled(q, kv, sink, ids, scale, 128, bf16_p=True))


class OnePassBf16P(Core):
    core = staticmethod(one_pass)


class SinkColumn64(Core):
    core = staticmethod(sink_column64)


class SinkFactor64(Core):
    core = staticmethod(sink_factor64)
