"""Chunking schedules as data (harness/schedules.py)."""

from __future__ import annotations

import re

import pytest

from v41_conformance.schedules import (
    accepted_end,
    compositions,
    from_lengths,
    is_rollback,
    max_step,
    parse_schedule_name,
    prefill_then_decode,
    ragged,
    schedule_name,
    speculative,
    validate_schedule,
    with_rollback,
)

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def test_compositions_of_7():
    all7 = compositions(7)
    assert len(all7) == 64
    assert all7[0] == [(0, 7)] and all7[-1] == [(p, p + 1) for p in range(7)]
    assert len({tuple(s) for s in all7}) == 64
    for s in all7:
        assert validate_schedule(s, n=7) == s and accepted_end(s) == 7
    assert from_lengths([1, 3, 3]) in all7
    assert compositions(7) == all7  # stable order


def test_compositions_small_order():
    assert compositions(1) == [[(0, 1)]]
    assert compositions(3) == [[(0, 3)], [(0, 1), (1, 3)], [(0, 2), (2, 3)], [(0, 1), (1, 2), (2, 3)]]


def test_ragged_and_short_final():
    assert ragged(11, [3, 5]) == [(0, 3), (3, 8), (8, 11)]
    assert ragged(13, [3, 5]) == [(0, 3), (3, 8), (8, 11), (11, 13)]
    assert ragged(10, [4]) == [(0, 4), (4, 8), (8, 10)]
    assert ragged(3, [8]) == [(0, 3)]


def test_prefill_decode_and_speculative():
    assert prefill_then_decode(5, 4) == [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9)]
    assert prefill_then_decode(5, 2, step=3) == [(0, 5), (5, 8), (8, 11)]
    assert speculative(5, [3, 6, 1], q_max=6) == [(0, 5), (5, 8), (8, 14), (14, 15)]
    assert max_step(speculative(5, [3, 6, 1])) == 6
    with pytest.raises(ValueError, match="more than q_max = 6"):
        speculative(5, [7], q_max=6)


def test_with_rollback():
    s = with_rollback(5, [(4, 2)], final_step=3)
    assert s == [(0, 5), (5, 9), (7, 10)]
    assert is_rollback(s, 2) and not is_rollback(s, 1) and accepted_end(s) == 10
    s = with_rollback(5, [(4, 4), (3, 0)], final_step=2)
    assert s == [(0, 5), (5, 9), (9, 12), (9, 11)]
    assert with_rollback(5, [(4, 4)], final_step=0) == [(0, 5), (5, 9)]
    with pytest.raises(ValueError, match="final_step >= 1"):
        with_rollback(5, [(4, 2)], final_step=0)
    with pytest.raises(ValueError, match="0 <= accepted <= written"):
        with_rollback(5, [(4, 5)])


@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "at least one step"),
        ([(1, 3)], "start at position 0"),
        ([(0, 3), (3, 3)], "empty or reversed"),
        ([(0, 3), (4, 6)], "positions 3..3 would never be written"),
        ([(0, 3), (3, 6), (2, 5)], "before the previous step's start 3"),
        ([(0, 3), (3, 9)], "beyond the sequence of 8"),
        ([(0, 3.5)], "integers"),
    ],
)
def test_validation_errors(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_schedule(bad, n=8)


def test_names():
    assert schedule_name([(0, 7)]) == "chunks-7"
    assert schedule_name(from_lengths([1, 3, 3])) == "chunks-1-3-3"
    assert schedule_name(prefill_then_decode(5, 4)) == "p5-d1x4"
    assert schedule_name(speculative(5, [3, 1, 1, 6])) == "p5-d3-d1x2-d6"
    assert schedule_name(with_rollback(5, [(4, 2)], final_step=3)) == "p5-d4-rb2-d3"
    assert schedule_name(with_rollback(5, [(4, 2), (3, 3)], final_step=3)) == "p5-d4-rb2-d3x2"


def test_names_are_valid_unique_and_round_trip():
    schedules = (
        compositions(7)
        + compositions(9)
        + [
            prefill_then_decode(21, 11),
            speculative(5, [6, 1, 3, 6]),
            with_rollback(5, [(4, 2), (6, 1), (3, 0), (5, 5)], final_step=2),
            with_rollback(5, [(4, 3), (4, 3)], final_step=4),
            ragged(33, [3, 5]),
        ]
    )
    names = [schedule_name(s) for s in schedules]
    assert len(set(names)) == len(schedules)
    for s, name in zip(schedules, names):
        assert NAME_RE.match(name), name
        assert parse_schedule_name(name) == s
    with pytest.raises(ValueError, match="cannot parse"):
        parse_schedule_name("x5-d1")
