"""Triton kernels for the fp4 quantisers and the indexer scores: a GPU port under test.

Run it natively on a GPU:
    conformance run --device cuda --impl examples/triton_impl.py:TritonImpl --select 'quant.*,indexer.scores*'
or on the CPU through Triton's interpreter (slow, but the same kernels):
    TRITON_INTERPRET=1 conformance run --impl examples/triton_impl.py:TritonImpl --select 'quant.e2m1/*'

Written from the semantics in docs/v41-reference.md, not by calling the harness's reference:
- quant.fp4_e8m0 / quant.fp4_e4m3: `fp4_act_quant` (K41:116-199, §6.2). Per block of 32 / 16:
  amax floored at 6*2^-126 / 6*2^-9; scale 2^ceil(log2(amax*fp32(1/6))) on the IEEE bits, or
  e4m3(amax / 6) rounded to nearest even; v = clamp(x / s, -6, 6); e2m1 code ties to the even
  code; y = e2m1 * s (exact in bf16).
- quant.e2m1: the e2m1 rounding alone.
- indexer.scores: M:556-557 (§4.2 step 5): s_h = bf16(q_h . k) with fp32 accumulation, ReLU,
  p_h = bf16(s_h * w_h), out = bf16(sum_h p_h) with an fp32 sum.

bfloat16 caveat: with triton 3.9 the interpreter misreads and miswrites bfloat16 tensors on the
CPU, so every kernel takes and returns float32 holding bf16-exact values; the wrappers convert
(x.float() in, .to(torch.bfloat16) out), and the bf16 rounding points inside a kernel are
emulated on the fp32 bits (round to nearest even on the upper 16 bits). The same code runs
natively on a GPU, where it costs one extra conversion per tensor.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

FP4_E8M0_BLOCK = 32
FP4_E4M3_BLOCK = 16
ROWS_PER_PROGRAM = 64  # quantiser blocks one program handles: [ROWS, BLOCK] tiles


# --- element helpers (inlined into the kernels) ------------------------------------------------


@triton.jit
def _rne_integer(t):
    """Round non-negative fp32 t (< 2^22) to the nearest integer, ties to even; fp32 out."""
    whole = t.to(tl.int32)  # truncation == floor for t >= 0
    frac = t - whole.to(tl.float32)  # exact
    odd = (whole & 1) == 1
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return (whole + up.to(tl.int32)).to(tl.float32)


@triton.jit
def _bf16_round(x):
    """fp32 -> the nearest bf16 value (ties to even), still held in fp32 (finite inputs)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pow2_exponent_ceil(y):
    """Biased exponent of 2^ceil(log2(y)) for positive normal fp32 y, from the IEEE bits."""
    bits = y.to(tl.int32, bitcast=True)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)


@triton.jit
def _e4m3_rne(y):
    """Positive fp32 y -> nearest float8_e4m3fn value (ties to even, saturating at 448), fp32."""
    bits = y.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    quantum = tl.maximum(exponent, -6) - 3  # 3 mantissa bits; subnormals step 2^-9
    up = ((127 - quantum) << 23).to(tl.float32, bitcast=True)  # 2^-quantum
    down = ((127 + quantum) << 23).to(tl.float32, bitcast=True)  # 2^quantum
    return tl.minimum(_rne_integer(y * up) * down, 448.0)  # both products exact


@triton.jit
def _e4m3_bits(r):
    """Non-negative float8_e4m3fn value held in fp32 -> its bit pattern (int32 0..126)."""
    bits = r.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    normal = ((exponent + 7) << 3) | ((bits >> 20) & 7)
    subnormal = (r * 512.0).to(tl.int32)  # multiples of 2^-9 below 2^-6
    return tl.where(exponent >= -6, normal, subnormal)


@triton.jit
def _e2m1(v):
    """fp32 v -> (code int32, signed grid value fp32): nearest e2m1, ties to the even code.

    The sign (bit 3 of the code) comes from v's sign bit, so -0 and small negatives keep it.
    On each binade the grid is uniform (step 0.5 below 2, 1 on [2, 4), 2 on [4, 6]), so
    scaling by 1/step and rounding half to even is nearest-even on the code index.
    """
    negative = (v.to(tl.int32, bitcast=True) >> 31) != 0
    mag = tl.minimum(tl.abs(v), 6.0)
    inv_step = tl.where(mag < 2.0, 2.0, tl.where(mag < 4.0, 1.0, 0.5))
    step = tl.where(mag < 2.0, 0.5, tl.where(mag < 4.0, 1.0, 2.0))
    grid = _rne_integer(mag * inv_step) * step  # both products exact (powers of two)
    index = tl.where(grid < 2.0, grid * 2.0, tl.where(grid < 4.0, grid + 2.0, grid * 0.5 + 4.0))
    code = index.to(tl.int32) | (negative.to(tl.int32) << 3)
    return code, tl.where(negative, -grid, grid)


# --- kernels ------------------------------------------------------------------------------------


@triton.jit
def _e2m1_kernel(v_ptr, code_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    code, y = _e2m1(v)
    tl.store(code_ptr + offs, code.to(tl.uint8), mask=mask)
    tl.store(y_ptr + offs, y, mask=mask)


@triton.jit
def _fp4_qdq_kernel(
    x_ptr, y_ptr, code_ptr, scale_ptr, nblocks, BLOCK: tl.constexpr, ROWS: tl.constexpr, E4M3: tl.constexpr
):
    """One program: ROWS consecutive quantisation blocks of BLOCK elements (x fp32, bf16-exact)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    row_ok = rows < nblocks
    offs = rows[:, None].to(tl.int64) * BLOCK + tl.arange(0, BLOCK)[None, :]  # [ROWS, BLOCK]
    x = tl.load(x_ptr + offs, mask=row_ok[:, None], other=0.0)
    amax = tl.max(tl.abs(x), axis=1)  # [ROWS]
    if E4M3:
        # K41:158-161: floor 6*2^-9, true division by 6, RNE to e4m3 (saturating)
        scale = _e4m3_rne(tl.math.div_rn(tl.maximum(amax, 0.01171875), 6.0))
        scale_byte = _e4m3_bits(scale)
        v = tl.math.div_rn(x, scale[:, None])  # IEEE division, inexact: the scale is not 2^k
    else:
        # K41:163-164: floor 6*2^-126, times fp32(1/6), power-of-two ceiling on the bits
        exponent = _pow2_exponent_ceil(tl.maximum(amax, 7.052966104933726e-38) * 0.1666666716337204)
        scale = (exponent << 23).to(tl.float32, bitcast=True)
        scale_byte = exponent
        # x / 2^e == x * 2^-e exactly (2^-e stays normal: e <= 253), subnormal x included
        v = x * ((254 - exponent) << 23).to(tl.float32, bitcast=True)[:, None]
    v = tl.minimum(tl.maximum(v, -6.0), 6.0)
    code, grid = _e2m1(v)
    tl.store(code_ptr + offs, code.to(tl.uint8), mask=row_ok[:, None])
    tl.store(y_ptr + offs, grid * scale[:, None], mask=row_ok[:, None])  # exact in bf16
    tl.store(scale_ptr + rows, scale_byte.to(tl.uint8), mask=row_ok)


@triton.jit
def _index_scores_kernel(
    q_ptr, k_ptr, w_ptr, out_ptr, S, T, H, D, BS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr
):
    """One program: a [BS queries, BT keys] tile of batch row b; q [b,S,H,D], k [b,T,D], w [b,S,H]."""
    b = tl.program_id(0)
    s_idx = tl.program_id(1) * BS + tl.arange(0, BS)  # [BS]
    t_idx = tl.program_id(2) * BT + tl.arange(0, BT)  # [BT]
    d_idx = tl.arange(0, BD)  # [BD]
    s_ok, t_ok, d_ok = s_idx < S, t_idx < T, d_idx < D
    k = tl.load(
        k_ptr + (b * T + t_idx[:, None]).to(tl.int64) * D + d_idx[None, :],
        mask=t_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [BT, BD]
    kt = tl.trans(k)  # [BD, BT]
    total = tl.zeros((BS, BT), dtype=tl.float32)
    for h in range(0, H):
        q = tl.load(
            q_ptr + ((b * S + s_idx[:, None]) * H + h).to(tl.int64) * D + d_idx[None, :],
            mask=s_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # [BS, BD]
        w = tl.load(w_ptr + (b * S + s_idx) * H + h, mask=s_ok, other=0.0)  # [BS]
        dots = tl.dot(q, kt, input_precision="ieee")  # fp32 accumulate (bf16 products exact)
        s_h = tl.maximum(_bf16_round(dots), 0.0)  # einsum -> bf16, ReLU
        total += _bf16_round(s_h * w[:, None])  # product -> bf16, summed in fp32
    out = _bf16_round(total) + 0.0  # +0.0: no -0 in the output
    tl.store(
        out_ptr + (b * S + s_idx[:, None]).to(tl.int64) * T + t_idx[None, :], out, mask=s_ok[:, None] & t_ok[None, :]
    )


# --- wrappers -------------------------------------------------------------------------------------


def _check_runnable(*tensors: torch.Tensor) -> None:
    on_cpu = [t for t in tensors if t.device.type == "cpu"]
    if on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "TritonImpl got CPU tensors but Triton's interpreter is off: run with "
            "--device cuda on a GPU, or set TRITON_INTERPRET=1 before starting Python"
        )


def e2m1(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """v fp32 [...] -> (codes uint8 [...], y fp32 [...])."""
    _check_runnable(v)
    flat = v.float().contiguous().reshape(-1)
    codes = torch.empty(flat.shape, dtype=torch.uint8, device=v.device)
    y = torch.empty(flat.shape, dtype=torch.float32, device=v.device)
    block = 1024
    if flat.numel():
        _e2m1_kernel[(triton.cdiv(flat.numel(), block),)](flat, codes, y, flat.numel(), BLOCK=block)
    return codes.reshape(v.shape), y.reshape(v.shape)


def fp4_qdq(x: torch.Tensor, block: int, e4m3: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x bf16 [..., D] -> (y bf16 [..., D], codes uint8 [..., D], scale_bytes uint8 [..., D/block])."""
    _check_runnable(x)
    if x.shape[-1] % block:
        raise ValueError(f"fp4 quantiser: last dim {x.shape[-1]} is not a multiple of the block {block}")
    flat = x.float().contiguous().reshape(-1)  # fp32, bf16-exact (interpreter caveat)
    nblocks = flat.numel() // block
    y = torch.empty(flat.shape, dtype=torch.float32, device=x.device)
    codes = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
    scale_bytes = torch.empty(nblocks, dtype=torch.uint8, device=x.device)
    if nblocks:
        grid = (triton.cdiv(nblocks, ROWS_PER_PROGRAM),)
        _fp4_qdq_kernel[grid](flat, y, codes, scale_bytes, nblocks, BLOCK=block, ROWS=ROWS_PER_PROGRAM, E4M3=e4m3)
    return (
        y.reshape(x.shape).to(torch.bfloat16),
        codes.reshape(x.shape),
        scale_bytes.reshape(*x.shape[:-1], x.shape[-1] // block),
    )


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """q bf16 [b, S, H, D], k bf16 [b, T, D], w bf16 [b, S, H] -> scores bf16 [b, S, T]."""
    _check_runnable(q, k, w)
    b, S, H, D = q.shape
    T = k.shape[1]
    if k.shape[0] != b or k.shape[2] != D or tuple(w.shape) != (b, S, H):
        raise ValueError(
            f"index_scores: q {tuple(q.shape)} needs k [{b}, T, {D}] and w [{b}, {S}, {H}]; "
            f"got k {tuple(k.shape)}, w {tuple(w.shape)}"
        )
    out = torch.empty((b, S, T), dtype=torch.float32, device=q.device)
    if out.numel():
        BS, BT, BD = 16, 32, max(16, triton.next_power_of_2(D))  # tl.dot wants every dim >= 16
        grid = (b, triton.cdiv(S, BS), triton.cdiv(T, BT))
        _index_scores_kernel[grid](
            q.float().contiguous(), k.float().contiguous(), w.float().contiguous(), out, S, T, H, D, BS=BS, BT=BT, BD=BD
        )
    return out.to(torch.bfloat16)


class TritonImpl:
    """quant.e2m1, quant.fp4_e8m0, quant.fp4_e4m3 and indexer.scores as Triton kernels."""

    COMPONENTS = ("quant.e2m1", "quant.fp4_e8m0", "quant.fp4_e4m3", "indexer.scores")

    def supports(self, component: str) -> bool:
        return component in self.COMPONENTS

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
        device = next(iter(inputs.values())).device
        if device.type == "cuda":  # Triton launches on the current device: make it the tensors' one
            with torch.cuda.device(device):
                return self._run(component, inputs)
        return self._run(component, inputs)

    def _run(self, component: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if component == "quant.e2m1":
            codes, y = e2m1(inputs["v"])
            return {"codes": codes, "y": y}
        if component in ("quant.fp4_e8m0", "quant.fp4_e4m3"):
            e4m3 = component == "quant.fp4_e4m3"
            y, codes, scale_bytes = fp4_qdq(inputs["x"], FP4_E4M3_BLOCK if e4m3 else FP4_E8M0_BLOCK, e4m3)
            return {"y": y, "codes": codes, "scale_bytes": scale_bytes}
        if component == "indexer.scores":
            return {"scores": index_scores(inputs["q"], inputs["k"], inputs["w"])}
        raise ValueError(f"TritonImpl does not implement {component!r}; supported: {', '.join(self.COMPONENTS)}")
