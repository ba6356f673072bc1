"""fp8 Linears on the GPU's own tensor cores, judged by the accumulator model (docs/verdicts.md,
"GPU arithmetic"): `torch._scaled_mm` multiplies each 32-wide K block of the act_quant'd activation
and the fp8 weight on the tensor cores (their own accumulation inside the block), and each block's
fp32 sum is scaled and added in an fp32 accumulator, as DeepGEMM promotes it.

`ScaledMmFp8` computes `linear.fp8` so, and `attention` (and `indexer`) with upstream's torch
arithmetic (tests/impls/gate_upstream.py) whose every fp8 Linear is this one. GPU only: run it with
`--device cuda` (examples/cuda/gpu_check.sh, step `tensorcores`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "impls"))

import upstream_ops as up  # noqa: E402
from gate_upstream import UpstreamTorch  # noqa: E402
from patching import patched  # noqa: E402

from v41_conformance import Unsupported  # noqa: E402

BLOCK = up.FP8_BLOCK


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows added up to a multiple of `rows` (_scaled_mm's shape rule)."""
    extra = -t.shape[0] % rows
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) if extra else t


def tensor_core_fp8_linear(
    x: torch.Tensor, w_codes: torch.Tensor, w_scale_bytes: torch.Tensor, promote: int = BLOCK
) -> tuple[torch.Tensor, up.Quantised]:
    """upstream_ops.fp8_linear with each K block's products summed by the tensor cores."""
    q = up.act_quant(x)
    n, k = w_codes.shape
    nb = k // BLOCK
    lead = x.shape[:-1]
    qa = q.codes.reshape(-1, k).view(torch.float8_e4m3fn)
    m = qa.shape[0]
    qa = _padded(qa, 16).contiguous()
    qw = _padded(w_codes.view(torch.float8_e4m3fn), 16).contiguous()
    sa = (q.scale_bytes.to(torch.int32) << 23).view(torch.float32).reshape(-1, nb)  # [M, K/32]
    sw = (w_scale_bytes.to(torch.int32) << 23).view(torch.float32).repeat_interleave(BLOCK, dim=0)[:n]  # [N, K/32]
    one = torch.ones((), device=x.device, dtype=torch.float32)
    acc = torch.zeros(m, n, device=x.device, dtype=torch.float32)
    for kb in range(nb):
        a = qa[:, kb * BLOCK : (kb + 1) * BLOCK].contiguous()
        b = qw[:, kb * BLOCK : (kb + 1) * BLOCK].contiguous()
        block = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)[:m, :n]
        acc += block * sa[:, kb : kb + 1] * sw[:, kb][None, :]
    return acc.reshape(*lead, n).to(torch.bfloat16), q


class ScaledMmFp8(UpstreamTorch):
    """Upstream's arithmetic with every fp8 GEMM on the tensor cores (needs a CUDA device with fp8)."""

    def run(self, component, inputs, params):
        if not any(t.is_cuda for t in inputs.values()):
            raise Unsupported("ScaledMmFp8 runs its fp8 GEMMs on a CUDA device: conformance run --device cuda")
        if component == "linear.fp8":
            y, q = tensor_core_fp8_linear(inputs["x"], inputs["weight"], inputs["weight_scale"])
            return {"y": y, "x_codes": q.codes, "x_scale_bytes": q.scale_bytes}
        with patched(up, "fp8_linear", tensor_core_fp8_linear):
            return super().run(component, inputs, params)
