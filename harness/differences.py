"""The kinds of difference a verdict may accept, each counted wherever results are shown.

A correct implementation may differ from the reference without being wrong: it breaks a top-k
tie another way, picks between scores closer than their own tolerance, rounds a value that sits
on a quantisation boundary the other way, or writes +0 where the reference has -0 (docs/verdicts.md). Each kind is counted per
output (`metric`), per case (`count`, with a first `example`) and per component, and every
report shows the counts, so a reviewer sees what was accepted even when everything passed.
"""

from __future__ import annotations

from typing import NamedTuple


class Difference(NamedTuple):
    metric: str  # per-output metric key
    count: str  # type: ignore[assignment]  # a field may shadow tuple.count; CaseResult / component summary field
    example: str  # CaseResult field: the first output message that showed it
    column: str  # terminal table column
    label: str  # column of summary.md and report.html
    what: str  # "N <what>" in messages


DIFFERENCES = (
    Difference("rows_tie", "tie_rows", "tie_example", "ties", "tie rows", "row(s) differ only in tie order"),
    Difference(
        "rows_near_tie",
        "near_tie_rows",
        "near_tie_example",
        "near",
        "near-tie rows",
        "row(s) differ only among near-tied ids",
    ),
    Difference(
        "boundary_flips",
        "boundary_flips",
        "boundary_example",
        "flips",
        "boundary flips",
        "element(s) differ only at rounding boundaries",
    ),
    Difference(
        "signed_zeros",
        "signed_zeros",
        "signed_zero_example",
        "±0",
        "signed zeros",
        "element(s) differ only in the sign of a zero",
    ),
)
