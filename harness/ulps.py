"""Units in the last place: the spacing of a float format at a value.

Shared by the comparator (element-wise bounds), the boundary verdict (tolerance of a value
before quantisation) and the near-tie verdict (tolerance of a score).
"""

from __future__ import annotations

import torch

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}
MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126, torch.float64: -1022}


EXPONENT_FIELD = {
    torch.bfloat16: (torch.int16, 7, 0xFF, 127),
    torch.float16: (torch.int16, 10, 0x1F, 15),
    torch.float32: (torch.int32, 23, 0xFF, 127),
}  # (bits, mantissa bits, exponent mask, bias)
_SPACING: dict[torch.dtype, torch.Tensor] = {}


def ulp_of(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` at |value|, as float64; the subnormal spacing near zero.

    A value held in `dtype` itself is read off its exponent field (one table lookup per element,
    the same numbers); any other goes through frexp.

    Example: ulp_of(torch.tensor([1.0, 3.0]), torch.bfloat16) -> tensor([0.0078, 0.0156])
    """
    if value.dtype == dtype and dtype in EXPONENT_FIELD:
        bits, mantissa, mask, bias = EXPONENT_FIELD[dtype]
        table = _SPACING.get(dtype)
        if table is None:  # the spacing of every biased exponent; 0 (subnormals, zero) as 1
            table = torch.tensor([2.0 ** (max(x, 1) - bias - mantissa) for x in range(mask + 1)], dtype=torch.float64)
            _SPACING[dtype] = table
        field = (value.contiguous().view(bits).to(torch.int32) >> mantissa) & mask
        return table[field]
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
