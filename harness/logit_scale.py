"""Sparse attention's scale check: an error of `o` along the direction a logit scale moves it, measured
against what the probabilities' own roundings can put there (docs/verdicts.md, "The logit scale").

A correct attention core may round P to bf16 or not, against one max or a running one, in float64 or
fp32: each lane's probability then differs from the reference's by up to one bf16 rounding, in no
preferred direction. A wrong softmax scale (held in bf16, folded in twice, log2(e) applied once too
often) moves every logit by the same factor 1 + c, and `o` along one direction:

    d = do / dlog(scale) = sum_j w_j s_j (v_j - o),   w_j = p_j / denominator, s_j the scaled logit

(the sink's logit is not scaled). The judge projects the error on d: c = <a - e, d> / <d, d>, and
compares c with the spread the roundings give it, sigma_c = sqrt(sum_i sigma_i^2 d_i^2) / <d, d>,
sigma_i the spread of element i: each lane's term w_j v_j two independent bf16 roundings of its P
apart (P_ROUNDING), in quadrature, and the two final bf16 roundings of o. An
output whose |c| exceeds Z_LIMIT sigma_c has its logits scaled: the message says by how much. The
elements are many and the roundings independent, so c of a correct core is a sum of many small
independent terms: over 25 fresh cases the attention cores (fp32 P, plain softmax, 128-lane tiles,
one pass, float64 with the sink as a column or a factor) stay within 1.3 sigma; a scale of 1 + 2^-8
reaches 2-150 sigma, a scale held in bf16 (1 + 1.1e-4) up to 3.2 on those small cases, more as the
output grows.
"""

from __future__ import annotations

import math

import torch


DIRECTION = ".logit_scale"  # context suffix: d, the direction a logit scale moves each element
SPREAD = ".logit_spread"  # and sigma_i, the spread the probabilities' roundings give each element
Z_LIMIT = 6.0
# Two independent bf16 roundings of a probability, relative: a bf16 step is 2^-7 / m of a value of
# mantissa m in [1, 2), and probabilities' mantissas spread evenly in log: E[1/m^2] = 3 / (8 ln 2).
P_ROUNDING = 2.0 ** -7 * math.sqrt(3.0 / (8.0 * math.log(2.0)) / 6.0)


def scale_context(name: str, q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, ids: torch.Tensor,
                  scale: float) -> dict[str, torch.Tensor]:
    """`<name>.logit_scale` and `<name>.logit_spread`, float64 [b, m, h, d], for sparse attention of q
    [b, m, h, d] over kv [b, n, d] rows `ids` [b, m, K] (-1 absent) with a sink logit per head."""
    b, m, h, _ = q.shape
    present = ids >= 0
    rows = kv[torch.arange(b).view(-1, 1, 1), ids.long().clamp(min=0)].double() * present.unsqueeze(-1)
    s = torch.einsum("bmhd,bmtd->bmht", q.double(), rows) * float(scale)
    s = s.masked_fill(~present.unsqueeze(2), float("-inf"))
    logit = sink.double().view(1, 1, h).expand(b, m, h)
    top = torch.maximum(s.amax(-1), logit) if s.shape[-1] else logit
    p = torch.exp(s - top.unsqueeze(-1))
    w = p / (p.sum(-1) + torch.exp(logit - top)).unsqueeze(-1)  # [b, m, h, K]; 0 on absent lanes
    o = torch.einsum("bmht,bmtd->bmhd", w, rows)
    ws = torch.where(present.unsqueeze(2), s, torch.zeros_like(s)) * w
    direction = torch.einsum("bmht,bmtd->bmhd", ws, rows) - o * ws.sum(-1, keepdim=True)
    spread = P_ROUNDING * torch.einsum("bmht,bmtd->bmhd", w.square(), rows.square()).sqrt()
    return {name + DIRECTION: direction, name + SPREAD: spread}


def logit_scale_error(name: str, e: torch.Tensor, a: torch.Tensor, ulp: torch.Tensor, finite: torch.Tensor | None,
                      context: dict[str, torch.Tensor]) -> tuple[float, float] | None:
    """(c, z): the error's scale of the logits, and its size in spreads; None where the context holds no
    direction or the output has none (every row absent or one lane). `e`, `a` float64; `ulp` the
    expected value's ulps (its final rounding)."""
    direction, spread = context.get(name + DIRECTION), context.get(name + SPREAD)
    if direction is None or spread is None:
        return None
    d, sd = direction.double().reshape(e.shape), spread.double().reshape(e.shape)
    err = a - e
    if finite is not None:
        zero = torch.zeros((), dtype=torch.float64)
        d, err = torch.where(finite, d, zero), torch.where(finite, err, zero)
    dd = float(d.square().sum())
    if dd == 0.0:
        return None
    final = ulp.double() / math.sqrt(6.0)  # the two final roundings of o
    sigma = math.sqrt(float(((sd.square() + final.square()) * d.square()).sum())) / dd
    c = float((err * d).sum()) / dd
    return c, (c / sigma if sigma > 0 else (0.0 if c == 0 else math.inf))


def pair_spread(spread: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """`spread` [..., d] after a rotation of its last `rope_dim` channels in pairs (RoPE): each rotated
    channel may take either channel's spread, so both get the pair's quadrature."""
    out = spread.clone()
    tail = out[..., -rope_dim:].unflatten(-1, (rope_dim // 2, 2))
    out[..., -rope_dim:] = tail.square().sum(-1, keepdim=True).sqrt().expand_as(tail).flatten(-2)
    return out
