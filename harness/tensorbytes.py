"""A tensor's bytes in row-major order, for hashing and writing: read in place where they can be."""

from __future__ import annotations

import ctypes

import torch


def tensor_bytes(t: torch.Tensor):
    """A buffer over the tensor's bytes in row-major order: its own memory where it is a plain
    contiguous CPU tensor (a case digests hundreds: no copy, no conversion), else a contiguous copy's.
    `bytes()` of it is the data (empty for an empty tensor)."""
    if t.is_cpu and t.layout is torch.strided and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
        return (ctypes.c_char * t.nbytes).from_address(t.data_ptr())
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
