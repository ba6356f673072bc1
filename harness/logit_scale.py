"""Sparse attention's scale check (the `sparse_attn` component, and `attention`'s `o` given your `q`): an
error of `o` along the direction a logit scale moves it, measured against what the probabilities' own
roundings can put there (docs/verdicts.md, "The logit scale").

A correct attention core may round P to bf16 or not, against one max or a running one, in float64 or
fp32: each lane's probability then differs from the reference's by up to one bf16 rounding, in no
preferred direction. A wrong softmax scale (held in bf16, folded in twice, log2(e) applied once too
often) moves every logit by the same factor 1 + c, and `o` along one direction:

    d = do / dlog(scale) = sum_j w_j s_j (v_j - o),   w_j = p_j / denominator, s_j the scaled logit

(the sink's logit is not scaled). The judge projects the error on d: c = <a - e, d> / <d, d>, and
compares c with the spread the roundings give it: a lane's rounding moves its whole row at once, by
delta_j w_j v_j, so the projection by delta_j w_j <v_j, d>; sigma_c^2 <d, d>^2 = sum over lanes of
(sigma_j w_j <v_j, d>)^2 + sum over elements of (sigma_final d_i)^2, sigma_j two independent bf16
roundings of the lane's P (its own step), sigma_final the two final roundings of o. An
output whose |c| exceeds Z_LIMIT sigma_c has its logits scaled: the message says by how much.
Calibration (fresh sparse_attn cases): z of a core with fp32 P has a standard deviation of 0.59 (the
model counts two roundings where it has one), a one-pass bf16-P core 0.34; a scale held in bf16
(1 - 1.1e-4) reaches 4.2 on those, 6.8 on `sparse_attn/logit-scale-d512-h16-m16-k128`. An element-wise
spread (lanes' roundings independent across a row's elements) underestimates: a row of 7 lanes under
a sink of 40 once put a correct core at 6.3 spreads of it (the fuzz, seed 35, index 1522).
Inside `attention` it applies where `o` is judged given the implementation's own `q` (returned as an
intermediate), on a step of MIN_ROWS (query, head) rows or more. Re-derived from its `qr` instead, the
implementation's own GEMM error on q reads as a logit scale: a 14-bit truncating fp8 accumulator
shrinks q by c = -8e-5 on the production prefill, a bias and not a spread, 0.75 of a bf16 scale's
(docs/verdicts.md, "The logit scale").
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .ulps import ulp_of


# Inside `attention` the check counts a step's judged (query, head) rows: below this many it does not apply
# (a statistic over a handful of rows decides nothing; a step of the small tier has 168 at most, which
# cannot resolve a bf16 scale anyway).
MIN_ROWS = 256
DIRECTION = ".logit_scale"  # context suffix: d, the direction a logit scale moves each element
SPREAD = ".logit_spread"  # and sigma_i, the spread the probabilities' roundings give each element
Z_LIMIT = 6.0
ROUNDINGS = 1.0 / math.sqrt(6.0)  # two independent roundings, each uniform within half a step: in steps


def scale_context(
    name: str, q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, ids: torch.Tensor, scale: float
) -> dict[str, torch.Tensor]:
    """`<name>.logit_scale` (d) and `<name>.logit_spread`, float64 [b, m, h, d], for sparse attention of q
    [b, m, h, d] over kv [b, n, d] rows `ids` [b, m, K] (-1 absent) with a sink logit per head.

    One lane's rounding moves every element of its row at once, so what it adds to the projection is
    sigma_j w_j <v_j, d_row>: the spread is kept per row, spread evenly over the row's elements (their
    squares sum to the row's variance of the projection). sigma_j: two roundings of the lane's P, each
    uniform within half its bf16 step (its own step: ulp(p_j) / p_j, p_j against the lanes' max)."""
    b, m, h, _ = q.shape
    present = ids >= 0
    rows = kv[torch.arange(b).view(-1, 1, 1), ids.long().clamp(min=0)].double() * present.unsqueeze(-1)
    s = torch.einsum("bmhd,bmtd->bmht", q.double(), rows) * float(scale)
    s = s.masked_fill(~present.unsqueeze(2), float("-inf"))
    logit = sink.double().view(1, 1, h).expand(b, m, h)
    lanes_max = s.amax(-1) if s.shape[-1] else logit
    top = torch.maximum(lanes_max, logit)
    p = torch.exp(s - top.unsqueeze(-1))
    w = p / (p.sum(-1) + torch.exp(logit - top)).unsqueeze(-1)  # [b, m, h, K]; 0 on absent lanes
    o = torch.einsum("bmht,bmtd->bmhd", w, rows)
    ws = torch.where(present.unsqueeze(2), s, torch.zeros_like(s)) * w
    direction = torch.einsum("bmht,bmtd->bmhd", ws, rows) - o * ws.sum(-1, keepdim=True)
    own = torch.exp(s - torch.where(torch.isfinite(lanes_max), lanes_max, torch.zeros_like(lanes_max)).unsqueeze(-1))
    step = ulp_of(own.float(), torch.bfloat16).double() / torch.where(own > 0, own, torch.ones_like(own))
    step = torch.where(own == 1.0, torch.zeros_like(step), step)  # the max lane's P is exactly 1: no rounding
    along = torch.einsum("bmtd,bmhd->bmht", rows, direction)  # <v_j, d_row>
    row_var = (ROUNDINGS * step * w * along).square().sum(-1)  # [b, m, h]
    spread = (row_var / direction.shape[-1]).sqrt().unsqueeze(-1).expand_as(direction)
    return {name + DIRECTION: direction, name + SPREAD: spread}


def logit_scale_error(
    name: str,
    e: torch.Tensor,
    a: torch.Tensor,
    ulp: torch.Tensor,
    finite: torch.Tensor | None,
    context: Mapping[str, torch.Tensor],
) -> tuple[float, float] | None:
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
        d, sd, err = torch.where(finite, d, zero), torch.where(finite, sd, zero), torch.where(finite, err, zero)
    dd = float(d.square().sum())
    if dd == 0.0:
        return None
    final = ulp.double() / math.sqrt(6.0)  # the two final roundings of o, element by element
    sigma = math.sqrt(float(sd.square().sum()) + float((final.square() * d.square()).sum())) / dd
    c = float((err * d).sum()) / dd
    return c, (c / sigma if sigma > 0 else (0.0 if c == 0 else math.inf))
