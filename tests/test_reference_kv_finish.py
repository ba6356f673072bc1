"""kv.finish: main compressed-KV row and index-key row from the pre-RoPE latent (kv_finish.py)."""

from __future__ import annotations

import math

import pytest
import torch

from v41_conformance.reference.compressor import CompressorWeights, compressor_oneshot, compressor_run
from v41_conformance.reference.kv_finish import kv_finish, rope_rows
from v41_conformance.reference.numerics import e2m1_decode, fp4_qdq_e4m3, fp4_qdq_e8m0, linear_bf16, rms_norm
from v41_conformance.reference.rope import apply_rotary, freqs_table
from v41_conformance.schedules import from_lengths

HD, IHD, RD, DIM = 128, 64, 32, 128
TABLE = freqs_table(RD, 64, 160000.0, 65536, 16.0, 32, 1)  # tiny config A, compressed layers
_g = torch.Generator().manual_seed(7)
WC = CompressorWeights(
    wkv=(torch.randn(HD, DIM, generator=_g) / math.sqrt(DIM)).bfloat16().float(),
    wgate=(torch.randn(HD, DIM, generator=_g) / math.sqrt(DIM)).bfloat16().float(),
    norm_w=(1 + 0.1 * torch.randn(HD, generator=_g)).bfloat16(),
)
WK = (torch.randn(IHD, HD, generator=_g) / math.sqrt(HD)).bfloat16()
K_NORM_W = (1 + 0.1 * torch.randn(IHD, generator=_g)).bfloat16()
X = torch.randn(2, 21, DIM, generator=_g).bfloat16()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Independent inverse of pack_nibbles: element 2i is the low nibble of byte i."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def latent_rows(t: int = 21):
    res = compressor_oneshot(X[:, :t], WC, 2)
    return res.rows, res.row_positions


def test_main_row_uses_the_group_first_position_as_upstream_prefill():
    t = 21
    latent, pos = latent_rows(t)
    assert pos.tolist() == list(range(0, 20, 2))
    out = kv_finish(latent, pos, TABLE, RD)
    # upstream prefill: freqs_cis[0 : S - S % r : r]
    expected = apply_rotary(latent, TABLE[0 : t - t % 2 : 2], RD)
    assert torch.equal(out.main_rope, expected)
    last = apply_rotary(latent, TABLE[1 : t - t % 2 : 2], RD)  # the group's last position: wrong
    assert not torch.equal(out.main_rope[:, 1:], last[:, 1:])
    assert torch.equal(out.main, fp4_qdq_e4m3(expected, 16).y)
    assert torch.equal(out.main_rope[..., :-RD], latent[..., :-RD])  # only the tail rotates


def test_decode_row_position_is_start_pos_plus_1_minus_r():
    # prefill 9, then decode position 9 closes group 4 = positions (8, 9), rotated at 8
    run = compressor_run(X, from_lengths([9, 1]), WC, 2)
    last = run.steps[1]
    assert last.row_positions.tolist() == [9 + 1 - 2]
    out = kv_finish(last.rows, last.row_positions, TABLE, RD)
    assert torch.equal(out.main_rope, apply_rotary(last.rows, TABLE[8].unsqueeze(0), RD))


def test_index_branch_from_the_pre_rope_latent():
    latent, pos = latent_rows()
    out = kv_finish(latent, pos, TABLE, RD, wk=WK, k_norm_w=K_NORM_W)
    norm = torch.cat([rms_norm(linear_bf16(latent[:, i : i + 1], WK), K_NORM_W) for i in range(latent.shape[1])], 1)
    assert torch.equal(out.index_norm, norm)
    rope = apply_rotary(norm, TABLE[pos], RD)
    assert torch.equal(out.index_k, fp4_qdq_e8m0(rope, 32).y)
    assert out.index_k.shape == (2, 10, IHD) and out.index_k.dtype == torch.bfloat16
    # the whole-matrix GEMM agrees to within bf16 rounding (row-wise GEMM is the harness's choice)
    whole = rms_norm(linear_bf16(latent, WK), K_NORM_W).float()
    assert ((out.index_norm.float() - whole).abs() <= whole.abs() * 2**-7 + 1e-6).all()


def test_packed_bytes_decode_to_the_stored_rows():
    latent, pos = latent_rows()
    out = kv_finish(latent, pos, TABLE, RD, wk=WK, k_norm_w=K_NORM_W)
    assert out.main_packed.shape == (2, 10, HD // 2) and out.main_packed.dtype == torch.uint8
    assert out.main_scale_bytes.shape == (2, 10, HD // 16)
    assert out.index_packed.shape == (2, 10, IHD // 2) and out.index_scale_bytes.shape == (2, 10, IHD // 32)
    # main: e4m3 scale bytes, one per 16 values
    main_scales = out.main_scale_bytes.view(torch.float8_e4m3fn).float()
    main = e2m1_decode(unpack_nibbles(out.main_packed)) * main_scales.repeat_interleave(16, dim=-1)
    assert torch.equal(main, out.main.float())
    # index: e8m0 bytes = biased exponents, one per 32 values
    idx_scales = torch.exp2(out.index_scale_bytes.double() - 127).float()
    index = e2m1_decode(unpack_nibbles(out.index_packed)) * idx_scales.repeat_interleave(32, dim=-1)
    assert torch.equal(index, out.index_k.float())


def test_e4m3_scales_map_block_amax_to_6():
    latent, pos = latent_rows()
    out = kv_finish(latent, pos, TABLE, RD)
    codes = unpack_nibbles(out.main_packed).unflatten(-1, (-1, 16))
    # s = e4m3(amax / 6) is within 2^-4 relative of amax / 6, so amax / s is in (5.6, 6.4),
    # which clamps/rounds to 6 (magnitude code 7) in every block of these unit-RMS latents
    assert ((codes & 7).amax(dim=-1) == 7).all()


def test_finish_is_schedule_invariant():
    one = latent_rows()
    chunked = compressor_run(X, from_lengths([3, 1, 5, 6, 6]), WC, 2)
    a = kv_finish(*one, TABLE, RD, wk=WK, k_norm_w=K_NORM_W)
    b = kv_finish(chunked.rows, chunked.row_positions, TABLE, RD, wk=WK, k_norm_w=K_NORM_W)
    for name in a._fields:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_without_index_weights_only_the_main_row():
    latent, pos = latent_rows()
    out = kv_finish(latent, pos, TABLE, RD)
    assert out.index_k is None and out.index_packed is None and out.index_norm is None


def test_empty_step_gives_empty_rows():
    out = kv_finish(
        torch.empty(2, 0, HD, dtype=torch.bfloat16),
        torch.empty(0, dtype=torch.int64),
        TABLE,
        RD,
        wk=WK,
        k_norm_w=K_NORM_W,
    )
    assert out.main.shape == (2, 0, HD) and out.index_k.shape == (2, 0, IHD)
    assert out.main_scale_bytes.shape == (2, 0, HD // 16)


def test_refusals():
    latent, pos = latent_rows()
    with pytest.raises(ValueError, match="outside the RoPE table"):
        rope_rows(TABLE, torch.tensor([64]))
    with pytest.raises(ValueError, match="one position per latent row"):
        kv_finish(latent, pos[:-1], TABLE, RD)
    with pytest.raises(ValueError, match="both wk and k_norm_w"):
        kv_finish(latent, pos, TABLE, RD, wk=WK)
    with pytest.raises(ValueError, match="bf16"):
        kv_finish(latent.float(), pos, TABLE, RD)
