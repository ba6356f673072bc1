"""Two wrong rotations (every component that rotates), each off by about a bf16 ulp of the pair's norm:
what the rotated channels' floor (2^-20 of max|y|, conformance.yaml) must not absorb. Upstream
rotates in fp32 (complex64) with the fp32 table and rounds to bf16 once (M:392-406)."""

from __future__ import annotations

import torch

from patching import patched
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import attention as at
from v41_conformance.reference import indexer as ix
from v41_conformance.reference import kv_finish as kf
from v41_conformance.reference import rope as rp

UPSTREAM = rp.apply_rotary


def _bf16(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.bfloat16).float()


def products_in_bf16(x, table, rope_dim, inverse=False):
    """Each of the four products rounded to bf16 before the sums (a bf16 multiply unit)."""
    y = UPSTREAM(x, table, rope_dim, inverse).clone()
    head = x.shape[-1] - rope_dim
    pairs = x[..., head:].float().unflatten(-1, (-1, 2))
    rows = table if x.ndim == 2 else (table[None] if x.ndim == 3 else table[None, :, None])
    cos, sin = rows[..., 0], rows[..., 1] * (-1 if inverse else 1)
    re, im = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([_bf16(re * cos) - _bf16(im * sin), _bf16(re * sin) + _bf16(im * cos)], -1)
    y[..., head:] = rotated.flatten(-2).to(x.dtype)
    return y


def table_in_bf16(x, table, rope_dim, inverse=False):
    """The (cos, sin) table stored in bf16 (a kernel's freqs buffer of the activations' dtype)."""
    return UPSTREAM(x, _bf16(table), rope_dim, inverse)


class _Rotation(ReferenceAdapter):
    rotation = staticmethod(UPSTREAM)

    def run(self, component, inputs, params):
        with (
            patched(rp, "apply_rotary", self.rotation),
            patched(kf, "apply_rotary", self.rotation),
            patched(at, "apply_rotary", self.rotation),
            patched(ix, "apply_rotary", self.rotation),
        ):
            return super().run(component, inputs, params)


class ProductsInBf16(_Rotation):
    rotation = staticmethod(products_in_bf16)


class TableInBf16(_Rotation):
    rotation = staticmethod(table_in_bf16)


WRONG = (ProductsInBf16, TableInBf16)
