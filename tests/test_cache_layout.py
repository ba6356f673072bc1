"""cache.bytes: per-row and per-block byte budgets (cache_layout.py, seed 000 §A.5)."""

from __future__ import annotations

import pytest

from v41_conformance.reference.cache_layout import (
    cache_bytes,
    fp4_index_row_bytes,
    fp4_main_row_bytes,
    fp8_main_row_bytes,
    rows_per_block,
    state_bytes,
)
from v41_conformance.reference.compressor import ring_capacity


def test_production_rows_pinned():
    assert fp8_main_row_bytes(512) == 512 + 16 == 528
    assert fp4_main_row_bytes(512) == 256 + 32 == 288
    assert fp4_index_row_bytes(128) == 64 + 4 == 68


def test_c2_state_default_ring():
    slots = ring_capacity(2, 6)  # nextn = 5 -> backtracking allowance 6 -> S = 7
    assert slots == 7
    assert state_bytes(2, slots, 512) == 7 * 2 * 512 * 4 == 28672
    assert state_bytes(1, 7, 512) == 0  # C1 keeps no state


def test_128_position_c2_block_pinned():
    table = cache_bytes(512, 128, 2, 128, 7)
    assert table == {
        "fp8_main_row": 528,
        "fp4_main_row": 288,
        "fp4_index_row": 68,
        "rows_per_block": 64,
        "fp8_main_block": 33792,
        "fp4_main_block": 18432,
        "fp4_index_block": 4352,
        "state": 28672,
    }
    assert all(type(v) is int for v in table.values())


@pytest.mark.parametrize("hd, ihd", [(128, 64), (256, 128), (1024, 256)])
@pytest.mark.parametrize("ratio, block", [(1, 64), (2, 64), (2, 256)])
def test_general_dims_follow_the_formulas(hd, ihd, ratio, block):
    table = cache_bytes(hd, ihd, ratio, block, 5)
    assert table["fp8_main_row"] * 32 == hd * 33  # 8 bits per value + 8 bits per 32 values
    assert table["fp4_main_row"] * 16 == hd * 9  # 4 bits per value + 8 bits per 16 values
    assert table["fp4_index_row"] * 32 == ihd * 17  # 4 bits per value + 8 bits per 32 values
    assert table["rows_per_block"] * ratio == block
    assert table["fp4_main_block"] == block // ratio * table["fp4_main_row"]
    assert table["state"] == (0 if ratio == 1 else 5 * 2 * hd * 4)


def test_tiny_config_a():
    assert cache_bytes(128, 64, 2, 64, 7) == {
        "fp8_main_row": 132,
        "fp4_main_row": 72,
        "fp4_index_row": 34,
        "rows_per_block": 32,
        "fp8_main_block": 4224,
        "fp4_main_block": 2304,
        "fp4_index_block": 1088,
        "state": 7168,
    }


def test_refusals():
    with pytest.raises(ValueError, match="multiple of the compress ratio 2"):
        rows_per_block(127, 2)
    with pytest.raises(ValueError, match="multiple of the scale block 32"):
        fp8_main_row_bytes(500)
    with pytest.raises(ValueError, match="multiple of the scale block 16"):
        fp4_main_row_bytes(100)
    with pytest.raises(ValueError, match="ratio must be 1 or 2"):
        state_bytes(4, 7, 512)
