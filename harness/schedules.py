"""Chunking schedules as data: how a sequence of positions is fed to a stateful component.

A schedule is a list of steps `(start, end)`: step i processes positions `start .. end-1` in one
call. Upstream (`docs/v41-reference.md` §3.5) supports exactly one schedule shape: one prefill
chunk at position 0, then one token per call. Everything else here (chunked prefill, ragged and
short-final chunks, multi-token speculative decode steps, rejected drafts) is the harness's
generalisation (§10.3), which must give the completed rows and pending state of the one-shot run.

Rules (`validate_schedule`):
- at least one step; every step non-empty (`start < end`); the first step starts at 0;
- each later step starts at the previous step's end (contiguous), or earlier, which is a
  rollback: the previous step was a speculative draft and only positions `< start` were accepted.
  A rollback may undo the previous step only (`prev_start <= start`): earlier positions were
  accepted when that step began;
- with `n` given, no step writes a position `>= n`; with `q_max` given, no step after the first
  (the prefill) is longer than `q_max`.

The accepted sequence length after the whole schedule is the last step's end (`accepted_end`):
a schedule never ends on a rejected draft, because a rejection is only visible as the next step
starting early.

Names (`schedule_name`) are readable id parts made of letters, digits, '-' and '_':
- up to four contiguous steps list their lengths: `chunks-7`, `chunks-1-3-3`;
- longer schedules and schedules with rollbacks are prefill + run-length decode steps:
  `p5-d1x4` (prefill 5, four 1-token steps), `p5-d3-d1x2`, and a rollback of k positions is
  written `rbK` before the step that restarts: `p5-d4-rb2-d1x3`.
Both forms decode back to the schedule, so distinct schedules get distinct names.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

Step = tuple[int, int]
Schedule = list[Step]

_MAX_LISTED_STEPS = 4


def validate_schedule(schedule: Sequence[Sequence[int]], n: int | None = None, q_max: int | None = None) -> Schedule:
    """Check the rules in the module docstring; return the schedule as a list of int pairs.

    Example: validate_schedule([(0, 5), (5, 9), (7, 8)]) -> [(0, 5), (5, 9), (7, 8)]
    (the step (5, 9) was a draft of which positions 5 and 6 were accepted).
    """
    steps: Schedule = []
    for i, step in enumerate(schedule):
        if len(step) != 2:
            raise ValueError(f"schedule step {i} must be (start, end), got {step!r}")
        start, end = int(step[0]), int(step[1])
        if (start, end) != tuple(step):
            raise ValueError(f"schedule step {i} must hold integers, got {step!r}")
        steps.append((start, end))
    if not steps:
        raise ValueError("a schedule needs at least one step, got an empty list")
    if steps[0][0] != 0:
        raise ValueError(f"the first step must start at position 0, got {steps[0]}")
    for i, (start, end) in enumerate(steps):
        if end <= start:
            raise ValueError(f"step {i} {steps[i]} is empty or reversed: every step needs start < end")
        if n is not None and end > n:
            raise ValueError(f"step {i} {steps[i]} writes position {end - 1}, beyond the sequence of {n} positions")
        if q_max is not None and i > 0 and end - start > q_max:
            raise ValueError(
                f"decode step {i} {steps[i]} has {end - start} positions, more than q_max = {q_max}; "
                "split it or raise q_max (and the compressor ring with it)"
            )
        if i == 0:
            continue
        prev_start, prev_end = steps[i - 1]
        if start > prev_end:
            raise ValueError(
                f"step {i} {steps[i]} starts after the previous step's end {prev_end}: positions "
                f"{prev_end}..{start - 1} would never be written"
            )
        if start < prev_start:
            raise ValueError(
                f"step {i} {steps[i]} rolls back to {start}, before the previous step's start "
                f"{prev_start}: a rollback can only undo (part of) the previous draft step"
            )
    return steps


def accepted_end(schedule: Sequence[Step]) -> int:
    """Sequence length after the schedule: the last step's end (a rollback is always followed)."""
    return validate_schedule(schedule)[-1][1]


def max_step(schedule: Sequence[Step]) -> int:
    """Largest number of positions one step writes (sizes the compressor ring: r + max - 1)."""
    return max(end - start for start, end in validate_schedule(schedule))


def is_rollback(schedule: Sequence[Step], i: int) -> bool:
    """True when step i starts before step i-1 ended (step i-1 was a partly rejected draft)."""
    return i > 0 and schedule[i][0] < schedule[i - 1][1]


def from_lengths(lengths: Sequence[int]) -> Schedule:
    """Contiguous schedule from chunk lengths: [1, 3, 3] -> [(0, 1), (1, 4), (4, 7)]."""
    steps: Schedule = []
    pos = 0
    for length in lengths:
        steps.append((pos, pos + int(length)))
        pos += int(length)
    return validate_schedule(steps)


def compositions(n: int) -> list[Schedule]:
    """All 2^(n-1) ways to cut positions 0..n-1 into contiguous non-empty chunks.

    Stable order: schedule k has a cut after position i+1 iff bit i of k is set, so index 0 is
    the one-shot run [(0, n)] and index 2^(n-1) - 1 is n single-position steps.
    Example: len(compositions(7)) == 64; compositions(3) == [[(0, 3)], [(0, 1), (1, 3)],
    [(0, 2), (2, 3)], [(0, 1), (1, 2), (2, 3)]].
    """
    if n < 1:
        raise ValueError(f"compositions needs n >= 1 positions, got {n}")
    if n > 16:
        raise ValueError(f"compositions({n}) would list 2^{n - 1} schedules; use ragged() for long sequences")
    out: list[Schedule] = []
    for mask in range(1 << (n - 1)):
        cuts = [i + 1 for i in range(n - 1) if mask >> i & 1]
        bounds = [0, *cuts, n]
        out.append([(bounds[j], bounds[j + 1]) for j in range(len(bounds) - 1)])
    return out


def ragged(n: int, sizes: Sequence[int]) -> Schedule:
    """Cover n positions with chunks of the given sizes, cycling; the final chunk may be short.

    Example: ragged(11, [3, 5]) -> [(0, 3), (3, 8), (8, 11)] (3, 5, and the cycle restarts
    with 3); ragged(13, [3, 5]) -> chunks 3, 5, 3, 2 (a short final chunk).
    """
    if n < 1:
        raise ValueError(f"ragged needs n >= 1 positions, got {n}")
    if not sizes or any(int(s) < 1 for s in sizes):
        raise ValueError(f"ragged needs a non-empty list of positive chunk sizes, got {list(sizes)}")
    lengths: list[int] = []
    pos = 0
    while pos < n:
        size = min(int(sizes[len(lengths) % len(sizes)]), n - pos)
        lengths.append(size)
        pos += size
    return from_lengths(lengths)


def prefill_then_decode(prefill: int, decode_steps: int, step: int = 1) -> Schedule:
    """One prefill chunk of `prefill` positions, then `decode_steps` steps of `step` positions.

    Example: prefill_then_decode(5, 4) -> [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9)]
    (upstream's only supported shape when step == 1).
    """
    if prefill < 1 or decode_steps < 0 or step < 1:
        raise ValueError(
            f"prefill_then_decode needs prefill >= 1, decode_steps >= 0, step >= 1; "
            f"got {prefill}, {decode_steps}, {step}"
        )
    return from_lengths([prefill] + [step] * decode_steps)


def speculative(prefill: int, steps: Sequence[int], q_max: int | None = None) -> Schedule:
    """Prefill, then decode steps of several positions each (all accepted), each <= q_max.

    Example: speculative(5, [3, 6, 1], q_max=6) -> [(0, 5), (5, 8), (8, 14), (14, 15)].
    """
    if prefill < 1:
        raise ValueError(f"speculative needs prefill >= 1, got {prefill}")
    return validate_schedule(from_lengths([prefill, *steps]), q_max=q_max)


def with_rollback(
    prefill: int, drafts: Sequence[tuple[int, int]], final_step: int = 1, q_max: int | None = None
) -> Schedule:
    """Prefill, then speculative steps that may be partly rejected, then a final step.

    `drafts` lists `(written, accepted)` per draft step: the step writes `written` positions at
    the current end, the verifier accepts the first `accepted` of them (0 <= accepted <= written),
    and the next step starts at the accepted position, overwriting the rejected ones.
    `final_step` positions follow the last draft (0 allowed only if that draft was fully accepted).

    Example: with_rollback(5, [(4, 2)], final_step=3) -> [(0, 5), (5, 9), (7, 10)]: the draft
    wrote 5..8, positions 5 and 6 were accepted, and the next step rewrites 7..9.
    """
    if prefill < 1:
        raise ValueError(f"with_rollback needs prefill >= 1, got {prefill}")
    steps: Schedule = [(0, prefill)]
    pos = prefill
    for i, (written, accepted) in enumerate(drafts):
        if written < 1 or not 0 <= accepted <= written:
            raise ValueError(f"draft {i}: need written >= 1 and 0 <= accepted <= written, got ({written}, {accepted})")
        steps.append((pos, pos + written))
        pos += accepted
    if final_step < 0:
        raise ValueError(f"final_step must be >= 0, got {final_step}")
    if final_step:
        steps.append((pos, pos + final_step))
    elif drafts and drafts[-1][1] < drafts[-1][0]:
        raise ValueError(
            "the last draft is partly rejected but final_step = 0: a rollback is only visible as "
            "the next step starting early, so give final_step >= 1"
        )
    return validate_schedule(steps, q_max=q_max)


def schedule_name(schedule: Sequence[Step]) -> str:
    """Short readable id part; see the module docstring. Distinct schedules get distinct names.

    Example: schedule_name(from_lengths([1, 3, 3])) == "chunks-1-3-3";
    schedule_name(prefill_then_decode(5, 4)) == "p5-d1x4";
    schedule_name(with_rollback(5, [(4, 2)], 3)) == "p5-d4-rb2-d3".
    """
    steps = validate_schedule(schedule)
    rollbacks = [i for i in range(1, len(steps)) if is_rollback(steps, i)]
    if not rollbacks and len(steps) <= _MAX_LISTED_STEPS:
        return "chunks-" + "-".join(str(end - start) for start, end in steps)
    parts = [f"p{steps[0][1]}"]
    # segments of decode steps separated by rollback markers, each run-length encoded
    tokens: list[tuple[str, int]] = []
    for i in range(1, len(steps)):
        if is_rollback(steps, i):
            tokens.append(("rb", steps[i - 1][1] - steps[i][0]))
        tokens.append(("d", steps[i][1] - steps[i][0]))
    for (kind, value), run in groupby(tokens):  # a rollback marker is never repeated
        count = len(list(run))
        if kind == "rb":
            parts.append(f"rb{value}")
        else:
            parts.append(f"d{value}" if count == 1 else f"d{value}x{count}")
    return "-".join(parts)


def parse_schedule_name(name: str) -> Schedule:
    """Inverse of `schedule_name`: "chunks-1-3-3" or "p5-d4-rb2-d1x3" -> the schedule."""
    parts = name.split("-")
    try:
        if parts[0] == "chunks":
            return from_lengths([int(p) for p in parts[1:]])
        if not parts[0].startswith("p"):
            raise ValueError("must start with 'chunks-' or 'pN'")
        steps: Schedule = [(0, int(parts[0][1:]))]
        rollback = 0  # positions the next step un-does
        for part in parts[1:]:
            if part.startswith("rb"):
                rollback = int(part[2:])
            elif part.startswith("d"):
                length, _, count = part[1:].partition("x")
                for _ in range(int(count) if count else 1):
                    start = steps[-1][1] - rollback
                    steps.append((start, start + int(length)))
                    rollback = 0
            else:
                raise ValueError(f"unknown part {part!r}")
        return validate_schedule(steps)
    except (ValueError, IndexError) as err:
        raise ValueError(f"cannot parse schedule name {name!r}: {err}") from None
