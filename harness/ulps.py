"""Units in the last place: the spacing of a float format at a value.

Shared by the comparator (element-wise bounds), the boundary verdict (tolerance of a value
before quantisation) and the near-tie verdict (tolerance of a score).
"""

from __future__ import annotations

import torch

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}
MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126, torch.float64: -1022}


def ulp_of(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` at |value|, as float64; the subnormal spacing near zero.

    Example: ulp_of(torch.tensor([1.0, 3.0]), torch.bfloat16) -> tensor([0.0078, 0.0156])
    """
    e = value.double().abs()
    _, exp = torch.frexp(e)  # e = m * 2**exp with m in [0.5, 1)
    floor_log2 = torch.where(e == 0, float(MIN_EXPONENT[dtype]), exp.double() - 1).clamp(min=MIN_EXPONENT[dtype])
    return torch.pow(2.0, floor_log2 - MANTISSA_BITS[dtype])


def rope_magnitude(value: torch.Tensor, tail: int) -> torch.Tensor:
    """float64 |value|, except in the last `tail` channels (RoPE pairs (2i, 2i+1)), where each element
    stands for its pair's norm: a rotation spreads one input's rounding over both outputs of its
    pair, so an element's error scales with the pair, not with itself."""
    magnitude = value.double().abs()
    if not tail:
        return magnitude
    head = value.shape[-1] - tail
    pairs = value[..., head:].double().unflatten(-1, (-1, 2))
    norm = pairs.square().sum(-1, keepdim=True).sqrt().expand_as(pairs).flatten(-2)
    return torch.cat([magnitude[..., :head], norm], dim=-1)
