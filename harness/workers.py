"""How many parallel workers a run uses, and in which order its cases start.

Cost of a case, estimated before it runs: the bytes it must read and build (its golden file plus
the inputs it rebuilds from its seed, `regenerated_inputs`), at `BYTES_PER_SECOND`, plus
`PER_TENSOR_S` per tensor of its golden (a stepped case's calls and the outputs judged along its
chain: an attention case's thousand small tensors cost far more than their bytes say), plus a fixed
`PER_CASE_S`. Only the order and the worker count depend on it, never a verdict.

- Order: heaviest first (longest-processing-time first), so that big cases do not meet at the
  tail of a parallel run; ties by id.
- `-n auto` with isolation (children in this process, `v41_conformance.pool`): a child costs a fork and
  loading the implementation, so each one must have at least `POOL_WORK_S` of estimated work:
  `min(cores, cases, work / POOL_WORK_S)`, at least 1 (a serial run).
- `-n auto --no-isolate` (pytest-xdist workers, each a new interpreter that imports torch):
  serial below `XDIST_WORK_S` of estimated work, else `min(cores, cases, work / XDIST_WORK_S)`.
- An explicit `-n N` is taken as given.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

BYTES_PER_SECOND = 40e6
PER_CASE_S = 0.004
PER_TENSOR_S = 0.0005  # the reference on the small tier: 0.3-0.8 s for attention's 440-1030 tensors
POOL_WORK_S = 0.5
XDIST_WORK_S = 6.0
ITEMSIZE = {
    "float64": 8,
    "int64": 8,
    "float32": 4,
    "int32": 4,
    "bfloat16": 2,
    "float16": 2,
    "int16": 2,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def header_cost(path: Path) -> tuple[int, int]:
    """(bytes of the inputs a golden rebuilds from its seed, tensors it holds), from its header only."""
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(min(length, 1 << 20)))
        meta = json.loads(header.get("__metadata__", {}).get("conformance", "{}"))
    except (OSError, ValueError, struct.error, AttributeError):
        return 0, 0
    total = 0
    for entry in (meta.get("regenerated_inputs") or {}).values():
        total += math.prod(entry.get("shape", [])) * ITEMSIZE.get(str(entry.get("dtype")), 4)
    return total, len(header) - ("__metadata__" in header)


def estimate(case_id: str, manifest: dict, goldens: Path) -> float:
    """Seconds this case should take the reference, roughly."""
    entry = manifest.get(case_id) or {}
    size = int(entry.get("size", 0) or 0)
    file = entry.get("file")
    extra, tensors = header_cost(Path(goldens) / file) if file else (0, 0)
    return PER_CASE_S + (size + extra) / BYTES_PER_SECOND + tensors * PER_TENSOR_S


def heaviest_first(ids: list[str], costs: dict[str, float]) -> list[str]:
    return sorted(ids, key=lambda i: (-costs.get(i, 0.0), i))


def resolve(requested: str, costs: dict[str, float], isolate: bool) -> int:
    """The number of parallel workers: 0 or 1 mean serial."""
    if requested not in ("auto", "logical"):
        return int(requested or 0)
    work = sum(costs.values())
    per_worker = POOL_WORK_S if isolate else XDIST_WORK_S
    if not isolate and work < XDIST_WORK_S:
        return 0
    return max(1, min(cores(), len(costs), int(work // per_worker)))
