"""Tests of v41_conformance.reference.rope: the YaRN constants of docs/v41-reference.md Appendix B, the
(cos, sin) table, and the interleaved rotation of the last rope_dim channels (§2)."""

from __future__ import annotations

import pytest
import torch

from v41_conformance.reference import rope

F32 = torch.float32
PROD = dict(dim=64, base=160000.0, original_seq_len=65536, factor=16.0, beta_fast=32.0, beta_slow=1.0)
TINY = dict(PROD, dim=32)


def bits16(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16)


def test_yarn_correction_range_production_and_tiny() -> None:
    assert rope.yarn_correction_range(64, 160000, 65536, 32, 1) == (15, 25)
    assert rope.yarn_correction_range(32, 160000, 65536, 32, 1) == (7, 13)


def test_production_inverse_frequencies_of_appendix_b() -> None:
    inv = rope.yarn_inv_freq(**PROD)
    assert inv.dtype == F32 and inv.shape == (32,)
    listed = {
        0: 1.0,
        1: 0.687656045,
        15: 0.0036355385,
        16: 0.0022656249,
        20: 0.00029697779,
        24: 1.9531253e-05,
        25: 5.3723124e-06,
        31: 5.6805294e-07,
    }
    for i, value in listed.items():  # the listed digits identify the fp32 value exactly
        assert inv[i].item() == torch.tensor(value, dtype=F32).item(), f"pair {i}"
    # pairs <= low keep the plain frequency, pairs >= high are divided by the factor exactly
    plain = rope.yarn_inv_freq(64, 160000.0)
    assert torch.equal(inv[:16], plain[:16])
    assert torch.equal(inv[25:], plain[25:] / 16)
    assert (inv[16:25] < plain[16:25]).all() and (inv[16:25] > plain[16:25] / 16).all()


def test_tiny_config_inverse_frequencies_of_appendix_b() -> None:
    inv = rope.yarn_inv_freq(**TINY)
    listed = [
        1.0,
        0.472870797,
        0.223606795,
        0.10573712,
        0.050000001,
        0.02364354,
        0.01118034,
        0.005286857,
        0.002109375,
        0.000812747,
        0.000296978,
        9.9129e-05,
        2.7344e-05,
        3.694e-06,
        1.747e-06,
        8.26e-07,
    ]
    assert inv.tolist() == pytest.approx(listed, rel=2e-4)  # the later entries are listed to 3-4 digits
    for i in range(7):  # the first seven are listed precisely enough to pin the fp32 value
        assert inv[i].item() == torch.tensor(listed[i], dtype=F32).item(), f"pair {i}"


def test_window_frequencies_have_no_yarn() -> None:
    inv = rope.yarn_inv_freq(64, 10000.0)
    assert inv[0].item() == 1.0
    assert inv[1].item() == torch.tensor(0.74989420, dtype=F32).item()
    assert inv[31].item() == torch.tensor(1.3335215e-04, dtype=F32).item()
    # original_seq_len = 0 turns YaRN off whatever the other arguments are
    assert torch.equal(rope.yarn_inv_freq(64, 10000.0, 0, 40.0, 7.0, 3.0), inv)


def test_int_and_float_base_give_the_same_table() -> None:
    # inference/config.json writes the bases as integers
    assert torch.equal(rope.freqs_table(64, 33, 160000, 65536, 16), rope.freqs_table(64, 33, 160000.0, 65536, 16.0))


def test_freqs_table_layout_and_values() -> None:
    table = rope.freqs_table(64, 4096, **{k: v for k, v in PROD.items() if k != "dim"})
    assert table.dtype == F32 and table.shape == (4096, 32, 2) and table.is_contiguous()
    assert torch.equal(table[0], torch.tensor([[1.0, 0.0]] * 32))  # position 0 is the identity
    inv = rope.yarn_inv_freq(**PROD).double()
    for p in (1, 7, 100, 4095):
        angle = (float(p) * inv).float().double()  # p * inv is exact in float64: one fp32 rounding
        assert torch.allclose(table[p, :, 0].double(), angle.cos(), atol=2e-7, rtol=0)
        assert torch.allclose(table[p, :, 1].double(), angle.sin(), atol=2e-7, rtol=0)
    assert torch.allclose(table.square().sum(-1), torch.ones(4096, 32), atol=1e-6)


def test_freqs_table_rows_do_not_depend_on_seqlen() -> None:
    long = rope.freqs_table(32, 64, 160000.0, 65536, 16)
    assert torch.equal(rope.freqs_table(32, 21, 160000.0, 65536, 16), long[:21])


def _rotate_slow(x: torch.Tensor, table: torch.Tensor, rope_dim: int, inverse: bool) -> torch.Tensor:
    """float64 rotation of pairs (a, b) by (c, s): (a c - b s, a s + b c), conjugate if inverse."""
    c = table[..., 0].double()  # [S, rope_dim/2]
    s = table[..., 1].double() * (-1 if inverse else 1)
    if x.ndim == 4:
        c, s = c[:, None], s[:, None]
    tail = x[..., -rope_dim:].double().unflatten(-1, (-1, 2))
    a, b = tail[..., 0], tail[..., 1]
    return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)


@pytest.mark.parametrize("shape", [(2, 9, 128), (2, 9, 3, 64), (9, 96)])
@pytest.mark.parametrize("inverse", [False, True])
def test_apply_rotary_matches_slow_rotation_and_keeps_other_channels(shape: tuple[int, ...], inverse: bool) -> None:
    rope_dim = 32
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).bfloat16()
    before = x.clone()
    table = rope.freqs_table(rope_dim, 64, 160000.0, 65536, 16)[5:14]  # positions 5..13
    y = rope.apply_rotary(x, table, rope_dim, inverse=inverse)
    assert torch.equal(bits16(x), bits16(before))  # input untouched
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(bits16(y[..., :-rope_dim]), bits16(x[..., :-rope_dim]))  # non-rope channels
    slow = _rotate_slow(x, table, rope_dim, inverse)
    err = (y[..., -rope_dim:].double() - slow).abs()
    assert (err <= slow.abs() * 2.0**-8 + 1e-6).all()  # within one bf16 rounding
    # heads share the row of their token: rotating each head alone gives the same bits
    if x.ndim == 4:
        for h in range(shape[2]):
            assert torch.equal(bits16(y[:, :, h]), bits16(rope.apply_rotary(x[:, :, h], table, rope_dim, inverse)))


def test_inverse_after_forward_is_close_to_identity() -> None:
    x = torch.randn(1, 40, 4, 128, generator=torch.Generator().manual_seed(1)).bfloat16()
    table = rope.freqs_table(64, 4096, 160000.0, 65536, 16)[4000:4040]
    back = rope.apply_rotary(rope.apply_rotary(x, table, 64), table, 64, inverse=True)
    assert torch.equal(bits16(back[..., :64]), bits16(x[..., :64]))
    err = (back[..., 64:].float() - x[..., 64:].float()).abs()
    pair_norm = x[..., 64:].float().unflatten(-1, (-1, 2)).norm(dim=-1).repeat_interleave(2, -1)
    assert (err <= pair_norm * 2.0**-7).all()  # two bf16 roundings of the rotated pair
    assert not torch.equal(rope.apply_rotary(x, table, 64), x)  # the forward did rotate


def test_position_zero_and_full_width_rotation() -> None:
    x = torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    table = rope.freqs_table(32, 3, 10000.0)
    y = rope.apply_rotary(x, table, 32)  # rope_dim == D rotates every channel
    assert torch.equal(bits16(y[:, 0]), bits16(x[:, 0]))  # (1, 0) rows leave position 0 alone
    assert not torch.equal(y[:, 1:], x[:, 1:])


def test_apply_rotary_by_hand_quarter_turn() -> None:
    # a hand-made table row (cos, sin) = (0, 1) maps the pair (a, b) to (-b, a)
    x = torch.tensor([[[7.0, 1.0, 2.0, 3.0]]], dtype=torch.bfloat16)  # [B=1, S=1, D=4]
    table = torch.tensor([[[0.0, 1.0]]], dtype=F32)  # [S=1, 1, 2]
    assert rope.apply_rotary(x, table, 2).float().tolist() == [[[7.0, 1.0, -3.0, 2.0]]]
    assert rope.apply_rotary(x, table, 2, inverse=True).float().tolist() == [[[7.0, 1.0, 3.0, -2.0]]]


def test_apply_rotary_validates_its_arguments() -> None:
    x = torch.zeros(2, 5, 64, dtype=torch.bfloat16)
    table = rope.freqs_table(32, 8, 10000.0)
    with pytest.raises(ValueError, match=r"table must be fp32 \[5, 16, 2\]"):
        rope.apply_rotary(x, table, 32)  # 8 rows for 5 tokens
    with pytest.raises(ValueError, match="rope_dim must be even"):
        rope.apply_rotary(x, table[:5], 31)
    with pytest.raises(ValueError, match="rope_dim must be even"):
        rope.apply_rotary(x, table[:5], 66)
    with pytest.raises(ValueError, match=r"\[B, S, H, D\]"):
        rope.apply_rotary(torch.zeros(1, 1, 5, 1, 64, dtype=torch.bfloat16), table[:5], 32)
    with pytest.raises(ValueError, match="positive even"):
        rope.yarn_inv_freq(31, 10000.0)


def test_strided_table_rows_for_compressed_positions() -> None:
    # compressed rows stand for the first token of their group: rows 0, r, 2r, ... (doc §2.4)
    full = rope.freqs_table(32, 64, 160000.0, 65536, 16)
    x = torch.randn(1, 10, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    y = rope.apply_rotary(x, full[0:20:2], 32)  # a non-contiguous slice of rows
    for j in range(10):
        one = rope.apply_rotary(x[:, j : j + 1], full[2 * j : 2 * j + 1], 32)
        assert torch.equal(bits16(y[:, j : j + 1]), bits16(one)), f"group {j}"
