"""The fp8 Linear of the production checkpoint: `act_quant` of the bf16 input, then the
block-scaled fp8 GEMM (`model.py` `linear()` M:181-207; `kernel.py` `act_quant` K41:41-113 and
`fp8_gemm` K41:202-293; docs/v41-reference.md §6.4, §11 item 9).

With `ModelArgs.dtype = "fp8"` (upstream's default) every attention Linear declared without an
explicit dtype holds float8_e4m3fn weights with one power-of-two (e8m0) scale per 32 x 32 tile:
`wq_a`, attention `wq_b`, `wkv`, `wo_b` and the indexer's `wq_b`. Such a Linear:

1. quantises its bf16 input per row in blocks of 32 along K: `act_quant(x, 32, "ue8m0")`
   (`numerics.fp8_qdq_ue8m0`: e4m3 codes `qa` and power-of-two scales `sa[m, kb]`);
2. for each K block kb of 32, in order: the 32 products qa[m, k] * qw[n, k] of fp8 values, summed
   in fp32, times sa[m, kb] * sw[n // 32, kb], added to an fp32 accumulator;
3. rounds the accumulator to bf16 (the default dtype).

Portability: a product of two e4m3 values has at most 8 significant bits and lies in
[2^-18, 2^17.6], so the float64 sum of a block's 32 products is exact in any order; rounding it
once to fp32 gives the block sum of an ideal fp32 accumulator on every machine. Scaling by powers
of two is exact, and the accumulation over K blocks is a fixed sequence of fp32 additions, so the
result is bit-identical on every CPU. A GPU's tensor cores sum a block in their own order (and on
some parts with fewer bits): the `y` tolerance absorbs that (conformance.yaml, linear.fp8).

Weights are stored as the checkpoint stores them: uint8 e4m3 bit patterns [N, K] and uint8 e8m0
scale bytes [ceil(N / 32), K / 32] (2^(byte - 127)).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from v41_conformance.reference import numerics as nx
from v41_conformance.tensorbytes import tensor_bytes

BLOCK = 32  # fp8_block_size (M:23-30): activation blocks and weight tiles are 32 wide
_CHUNK_ELEMS = 1 << 23  # float64 block products computed at once (64 MB)


class Fp8Weight(NamedTuple):
    """An fp8 Linear's weight as the checkpoint holds it.

    codes:       uint8 [N, K], float8_e4m3fn bit patterns.
    scale_bytes: uint8 [ceil(N / 32), K / 32], e8m0 biased exponents of the tile scales.
    """

    codes: torch.Tensor
    scale_bytes: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:  # [N, K], as the tensor's
        return tuple(self.codes.shape)


class Fp8LinearResult(NamedTuple):
    """y bf16 [..., N]; the quantised activation: x_codes uint8 [..., K] (e4m3 bits) and
    x_scale_bytes uint8 [..., K / 32] (e8m0)."""

    y: torch.Tensor
    x_codes: torch.Tensor
    x_scale_bytes: torch.Tensor


def e4m3_value(codes: torch.Tensor) -> torch.Tensor:
    """uint8 float8_e4m3fn bit patterns -> fp32 values."""
    return codes.contiguous().view(torch.float8_e4m3fn).float()


def quantise_weight(w: torch.Tensor) -> Fp8Weight:
    """A checkpoint-style fp8 weight from real values [N, K] (K a multiple of 32): per 32 x 32 tile,
    scale = pow2_ceil(amax * fp32(1/448)) (amax floored at 1e-4, as act_quant), codes = e4m3(w / s).
    Tiles of a ragged last row block hold fewer than 32 rows."""
    n, k = w.shape
    if k % BLOCK:
        raise ValueError(f"fp8 weights need K a multiple of {BLOCK}, got [{n}, {k}]")
    rows = -(-n // BLOCK)
    wf = w.float()
    padded = torch.zeros(rows * BLOCK, k, dtype=torch.float32)
    padded[:n] = wf
    tiles = padded.view(rows, BLOCK, k // BLOCK, BLOCK)  # [row block, r, k block, c]
    amax = tiles.abs().amax(dim=(1, 3)).clamp_min(nx.FP8_AMAX_FLOOR)  # [rows, K/32]
    s = nx.pow2_ceil(amax * nx.FP8_MAX_INV)
    scaled = tiles / s[:, None, :, None]
    codes = scaled.clamp(-nx.E4M3_MAX, nx.E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return Fp8Weight(codes.reshape(rows * BLOCK, k)[:n].contiguous(), nx.e8m0_byte(s))


def dequantise_weight(weight: Fp8Weight) -> torch.Tensor:
    """fp32 [N, K]: codes times their tile scales (exact)."""
    n, k = weight.shape
    s = nx.e8m0_value(weight.scale_bytes).repeat_interleave(BLOCK, dim=0)[:n]  # [N, K/32]
    return e4m3_value(weight.codes) * s.repeat_interleave(BLOCK, dim=1)


# What the emulation derives from each fp8 weight (its values by block; the accumulator model's magnitudes),
# kept while `weight_cache()` is entered: a chain judging a case projects through the same few weights
# once per call (and a decode call's one row would otherwise pay for converting the whole weight). Keyed
# by the codes tensor and dropped with it; speed only, the values are the same.
_CACHE: ContextVar[WeakIdKeyDictionary | None] = ContextVar("fp8_weight_cache", default=None)
# e8m0 scale bytes whose tiles' values fp32 holds exactly: every nonzero e4m3 value (a multiple of 2^-9,
# at most 448, 4 significant bits) times 2^(byte - 127) is then a normal fp32 number.
_FP32_EXACT_BYTES = (10, 246)


@contextmanager
def weight_cache() -> Iterator[None]:
    """Within it, what is derived from each fp8 weight is derived once (`derived`), and each projection
    of one input through one weight computed once (`project`); nested, the outer serves."""
    if _CACHE.get() is not None:
        yield
        return
    token, kept = _CACHE.set(WeakIdKeyDictionary()), _PROJECTIONS.set(_Projections())
    try:
        yield
    finally:
        _CACHE.reset(token)
        _PROJECTIONS.reset(kept)


class _Projections:
    """`project` results by input bytes, weight and the functions and constants they are computed with,
    the most recent first, up to `budget` bytes. A judgement and its diagnosis project the same rows
    through the same weights again and again: a 1,030-row query projection is seconds of float64 work."""

    def __init__(self, budget: int = 1 << 30) -> None:
        self.budget, self.used = budget, 0
        self.kept: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()  # key -> (codes, y)

    @contextmanager
    def suspend(self) -> Iterator[None]:
        """Nothing served or kept inside (tests compare with what is computed afresh)."""
        token = _PROJECTIONS.set(None)
        try:
            yield
        finally:
            _PROJECTIONS.reset(token)

    def get(self, key: tuple, codes: torch.Tensor) -> torch.Tensor | None:
        hit = self.kept.get(key)
        if hit is None or hit[0] is not codes:
            return None
        self.kept.move_to_end(key)
        return hit[1]

    def put(self, key: tuple, codes: torch.Tensor, y: torch.Tensor) -> None:
        size = y.numel() * y.element_size()
        if size > self.budget:
            return
        self.kept[key] = (codes, y)
        self.used += size
        while self.used > self.budget:
            _, (_, old) = self.kept.popitem(last=False)
            self.used -= old.numel() * old.element_size()


_PROJECTIONS: ContextVar[_Projections | None] = ContextVar("fp8_projections", default=None)


def _computed_with() -> tuple:
    """What a projection through an fp8 weight is computed with, as bound now: a diagnosis's variant that
    replaces any of these (or changes one of the constants) projects anew (tests/test_fp8_linear.py holds
    every variant of the catalogue to it)."""
    return (
        linear_fp8,
        fp8_gemm,
        e4m3_value,
        weight_blocks,
        nx.fp8_qdq_ue8m0,
        nx._blocks,
        nx.pow2_ceil,
        nx.e8m0_byte,
        nx.e8m0_value,
        nx.FP8_AMAX_FLOOR,
        nx.FP8_MAX_INV,
        nx.E4M3_MAX,
        BLOCK,
    )


def derived(weight: Fp8Weight, kind: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """make(): a tensor derived from `weight` alone, kept by `kind` within `weight_cache()`."""
    cache = _CACHE.get()
    if cache is None:
        return make()
    versions = (weight.codes._version, weight.scale_bytes._version)
    entry = cache.get(weight.codes)
    if entry is None or entry[0] is not weight.scale_bytes or entry[1] != versions:
        entry = cache[weight.codes] = (weight.scale_bytes, versions, {})
    forms = entry[2]
    key = (kind, e4m3_value, nx.e8m0_value)  # the decoders bound now: one a diagnosis replaced derives anew
    if key not in forms:
        forms[key] = make()
    return forms[key]


def weight_blocks(weight: Fp8Weight) -> torch.Tensor:
    """[K/32, 32, N]: the weight's values (codes times their tile scales, exact) by K block: fp32 where
    that is exact (every real checkpoint's scales, `_FP32_EXACT_BYTES`), else float64."""

    def make() -> torch.Tensor:
        n, k = weight.shape
        lo, hi = _FP32_EXACT_BYTES
        scales = weight.scale_bytes
        dtype = torch.float32 if bool(((scales >= lo) & (scales <= hi)).all()) else torch.float64
        sw = nx.e8m0_value(scales).to(dtype).repeat_interleave(BLOCK, dim=0)[:n, :, None]  # [N, K/32, 1]
        values = e4m3_value(weight.codes).to(dtype).view(n, k // BLOCK, BLOCK).mul_(sw)
        return values.permute(1, 2, 0).contiguous()

    return derived(weight, "blocks", make)


def fp8_gemm(x_codes: torch.Tensor, x_scales: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """fp32 [..., N] accumulator of the block-scaled GEMM (module docstring, step 2).

    x_codes uint8 [..., K] (e4m3 bits), x_scales fp32 [..., K/32] (powers of two).
    """
    n, k = weight.shape
    if x_codes.shape[-1] != k:
        raise ValueError(f"fp8_gemm: activation K {x_codes.shape[-1]} does not match the weight [{n}, {k}]")
    lead = x_codes.shape[:-1]
    nb = k // BLOCK
    # The scales are powers of two: folded into both operands (exact in float64), each block's sum is
    # the scaled exact sum, and its one rounding to fp32 commutes with the scaling (fp32's normal
    # range holds every scaled block sum), so this equals rounding the sum and then scaling it.
    sa = x_scales.reshape(-1, nb, 1).double()  # [M, K/32, 1]
    qa = e4m3_value(x_codes).reshape(-1, nb, BLOCK).double().mul_(sa).reshape(-1, k)  # [M, K]
    qw = weight_blocks(weight)  # [K/32, 32, N], exact values (in float64 block by block below)
    m = qa.shape[0]
    acc = torch.zeros(m, n, dtype=torch.float32)
    rows = max(1, _CHUNK_ELEMS // max(n, 1))  # bounds the float64 block products (memory only)
    exact = torch.empty(min(rows, m), n, dtype=torch.float64)  # reused: a fresh 40 MB buffer per block
    block = torch.empty(min(rows, m), n, dtype=torch.float32)  # costs more than the matmul
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        blocks = qa[r0:r1].reshape(r1 - r0, nb, BLOCK).transpose(0, 1).contiguous()  # [K/32, rows, 32]
        e, b = exact[: r1 - r0], block[: r1 - r0]
        for kb in range(nb):
            torch.mm(blocks[kb], qw[kb].double(), out=e)  # the exact scaled block sum
            acc[r0:r1].add_(b.copy_(e))  # one rounding to fp32, then the fp32 accumulator
    return acc.reshape(*lead, n)


def linear_fp8(x: torch.Tensor, weight: Fp8Weight) -> Fp8LinearResult:
    """`linear()` with an fp8 weight: act_quant(x, 32, ue8m0), fp8_gemm, bf16 out. x bf16 [..., K]."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"linear_fp8 takes a bf16 input, got {x.dtype}")
    q = nx.fp8_qdq_ue8m0(x, BLOCK)
    return Fp8LinearResult(fp8_gemm(q.codes, q.scales, weight).to(torch.bfloat16), q.codes, q.scale_bytes)


def project_unrounded(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """`project` of an fp32 input a kernel never rounded to bf16 (it quantises or multiplies its own
    accumulator): act_quant of the fp32 values then the fp8 GEMM, or the bf16 weight times the fp32
    input accumulated exactly; one rounding to bf16 either way. bf16 [..., N]."""
    if isinstance(weight, Fp8Weight):
        q = nx.fp8_qdq_ue8m0(x.float(), BLOCK)
        return fp8_gemm(q.codes, q.scales, weight).to(torch.bfloat16)
    return nx.einsum_f32("...k,nk->...n", x, weight).to(torch.bfloat16)


def project(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """One of the attention path's Linears, as `linear()` dispatches it (M:181-207): an fp8 weight
    goes through act_quant + fp8_gemm, a bf16 one through the bf16 GEMM. bf16 [..., N]."""
    if isinstance(weight, Fp8Weight):
        kept = _PROJECTIONS.get()
        if kept is None:
            return linear_fp8(x, weight).y
        key = (
            hashlib.sha256(tensor_bytes(x)).digest(),
            x.dtype,
            tuple(x.shape),
            id(weight.codes),
            weight.codes._version,
            id(weight.scale_bytes),
            weight.scale_bytes._version,
            _computed_with(),
        )
        y = kept.get(key, weight.codes)
        if y is None:
            y = linear_fp8(x, weight).y
            kept.put(key, weight.codes, y)
        return y.clone()
    return nx.linear_bf16(x, weight)


# --- as golden inputs: an fp8 Linear's weight is `<name>` (codes) with `<name>.scale` ------------


def quantise_inputs(inputs: dict[str, torch.Tensor], names: tuple[str, ...]) -> None:
    """Replace the named real-valued weights by the checkpoint's fp8 form, in place: `<name>` the
    uint8 e4m3 codes, `<name>.scale` the uint8 e8m0 tile scales. Names not in `inputs` are skipped."""
    for name in names:
        if name in inputs:
            weight = quantise_weight(inputs[name].float())
            inputs[name], inputs[f"{name}.scale"] = weight.codes, weight.scale_bytes


def weight_input(inputs: dict[str, torch.Tensor], name: str) -> torch.Tensor | Fp8Weight:
    """A Linear's weight from a call's inputs: an Fp8Weight when `<name>.scale` comes with it."""
    scale = inputs.get(f"{name}.scale")
    return inputs[name] if scale is None else Fp8Weight(inputs[name], scale)
