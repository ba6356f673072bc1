"""A small outside implementation in numpy: what plugging in your own code looks like.

Run it:  conformance run --impl examples/numpy_impl.py:NumpyImpl
(or by its name in conformance.yaml: --impl numpy-example)

It implements a few components from the written semantics (not by calling the harness's
reference) and declares everything else unsupported, which the report lists separately and
never counts as a failure.
"""

from __future__ import annotations

import numpy as np
import torch

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_codes(v: np.ndarray) -> np.ndarray:
    """Nearest grid point, ties to the even code index; bit 3 carries the sign (-0 included)."""
    mag = np.minimum(np.abs(v), 6.0)
    dist = np.abs(mag[..., None] - E2M1)  # [..., 8]
    best = dist.min(axis=-1, keepdims=True)
    tied = dist == best
    # among tied neighbours prefer the even code index
    index = np.where(
        tied[..., ::2].any(axis=-1), np.argmax(tied & (np.arange(8) % 2 == 0), axis=-1), np.argmax(tied, axis=-1)
    )
    sign = np.signbit(v).astype(np.uint8) << 3
    return (index.astype(np.uint8) | sign).astype(np.uint8)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    mag = E2M1[codes & 7]
    return np.where(codes & 8, -mag, mag).astype(np.float32)


def pow2_ceil(y: np.ndarray) -> np.ndarray:
    bits = y.astype(np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.int64) + ((bits & 0x7FFFFF) != 0)
    return (exponent.astype(np.uint32) << 23).view(np.float32)


class NumpyImpl:
    COMPONENTS = {"quant.e2m1", "quant.fp4_e8m0", "linear.f32", "norm.rms"}

    def supports(self, component: str) -> bool:
        return component in self.COMPONENTS

    def run(self, component, inputs, params):
        return getattr(self, "_" + component.replace(".", "_"))(inputs, params)

    def _quant_e2m1(self, inputs, params):
        codes = e2m1_codes(inputs["v"].numpy())
        return {"codes": torch.from_numpy(codes), "y": torch.from_numpy(e2m1_values(codes))}

    def _quant_fp4_e8m0(self, inputs, params):
        x = inputs["x"].float().numpy()
        blocks = x.reshape(*x.shape[:-1], -1, 32)
        amax = np.maximum(np.abs(blocks).max(axis=-1, keepdims=True), np.float32(6 * 2.0**-126))
        scale = pow2_ceil(amax * np.float32(1 / 6))
        codes = e2m1_codes(np.clip(blocks / scale, -6, 6))
        y = (e2m1_values(codes) * scale).reshape(x.shape)
        scale_bytes = (scale.view(np.uint32) >> 23).astype(np.uint8)[..., 0]
        return {
            "y": torch.from_numpy(y).to(torch.bfloat16),
            "codes": torch.from_numpy(codes.reshape(x.shape)),
            "scale_bytes": torch.from_numpy(scale_bytes),
        }

    def _linear_f32(self, inputs, params):
        return {"y": torch.from_numpy(inputs["x"].numpy() @ inputs["w"].numpy().T)}

    def _norm_rms(self, inputs, params):
        x = inputs["x"].float().numpy().astype(np.float64)
        w = inputs["weight"].float().numpy().astype(np.float64)
        y = w * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(params.get("eps", 1e-20)))
        return {"y": torch.from_numpy(y).to(torch.float32).to(inputs["x"].dtype)}
