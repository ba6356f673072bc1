"""RoPE tables built the ways real ports build them, and three wrong ones (`rope.yarn_table` only).

The correct ones all take upstream's fp32 inverse frequencies and fp32 angle fp32(p) * inv
(M:368-389) and differ only in the library that evaluates cos and sin, except `Float64Table`,
which computes the whole table in float64 and rounds once. conformance.yaml's `rope.yarn_table`
tolerance is calibrated on exactly these (tests/test_verdicts.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import torch

from gate import table_args
from v41_conformance.reference import rope as rp

COMPONENT = "rope.yarn_table"


class TableImpl:
    """An implementation of rope.yarn_table only: `cos_sin(angle)` decides how the table is made."""

    def supports(self, component: str) -> bool:
        return component == COMPONENT

    def inv_freq(self, args: dict) -> torch.Tensor:
        return rp.yarn_inv_freq(**args)  # upstream's fp32 expression

    def angle(self, positions: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
        return torch.outer(positions, inv)  # fp32(p) * inv, one rounding (M:385)

    def cos_sin(self, angle: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def run(self, component: str, inputs: dict, params: dict) -> dict:
        inv = self.inv_freq(table_args(params))
        table = self.cos_sin(self.angle(inputs["positions"], inv))
        return {"inv_freq": inv, "table": table.to(torch.float32).contiguous()}


class TorchPolar(TableImpl):
    """Upstream's own expression on the CPU: torch.polar(ones, angle) viewed as real."""

    def cos_sin(self, angle):
        return torch.view_as_real(torch.polar(torch.ones_like(angle), angle))


class TorchCosSin(TableImpl):
    """torch.cos / torch.sin on fp32 (ATen's vectorised kernels)."""

    def cos_sin(self, angle):
        return torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)


class NumpyFloat32(TableImpl):
    """numpy's float32 cos/sin (its own SIMD implementations)."""

    def cos_sin(self, angle):
        a = angle.numpy()
        return torch.from_numpy(np.stack([np.cos(a), np.sin(a)], axis=-1))


class LibmCosf(TableImpl):
    """The C library's cosf/sinf, called element by element through ctypes (what a C port does)."""

    def __init__(self):
        libm = ctypes.CDLL(ctypes.util.find_library("m"))
        self.cosf, self.sinf = libm.cosf, libm.sinf
        for fn in (self.cosf, self.sinf):
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]

    def cos_sin(self, angle):
        flat = angle.flatten().tolist()
        cos = torch.tensor([self.cosf(a) for a in flat], dtype=torch.float32)
        sin = torch.tensor([self.sinf(a) for a in flat], dtype=torch.float32)
        return torch.stack([cos, sin], dim=-1).reshape(*angle.shape, 2)


class Float64Table(TableImpl):
    """inv_freq, angle, cos and sin all in float64, each output rounded once to fp32."""

    def inv_freq(self, args):
        return self._inv64(args).float()

    def _inv64(self, args):
        dim, base = args["dim"], args["base"]
        inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        if args["original_seq_len"] > 0:
            low, high = rp.yarn_correction_range(
                dim, base, args["original_seq_len"], args["beta_fast"], args["beta_slow"]
            )
            smooth = 1 - ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
            inv = inv / args["factor"] * (1 - smooth) + inv * smooth
        return inv

    def run(self, component, inputs, params):
        args = table_args(params)
        angle = torch.outer(inputs["positions"].double(), self._inv64(args))
        table = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)
        return {"inv_freq": self.inv_freq(args), "table": table.float().contiguous()}


CORRECT = (TorchPolar, TorchCosSin, NumpyFloat32, LibmCosf, Float64Table)


class ShiftedPositions(TorchPolar):
    """Wrong: the rows of positions p + 1 (an off-by-one start position)."""

    def angle(self, positions, inv):
        return torch.outer(positions + 1, inv)


class SwappedRamp(TorchPolar):
    """Wrong: YaRN's beta_fast and beta_slow swapped, so the ramp runs backwards."""

    def inv_freq(self, args):
        return rp.yarn_inv_freq(**{**args, "beta_fast": args["beta_slow"], "beta_slow": args["beta_fast"]})


class OtherBase(TorchPolar):
    """Wrong: rope_theta (10000) where the compressed layers use compress_rope_theta."""

    def inv_freq(self, args):
        return rp.yarn_inv_freq(**{**args, "base": 10000.0 if args["base"] != 10000.0 else 160000.0})


class ScaledTable(TorchPolar):
    """Wrong: every entry 2^-6 too large."""

    def cos_sin(self, angle):
        return super().cos_sin(angle) * (1 + 2.0**-6)


WRONG = (ShiftedPositions, SwappedRamp, OtherBase, ScaledTable)
