"""The record of one case's verdict (`CaseResult`) and the statuses it may have.

Plain data, importing nothing heavy: the processes that only drive isolation children (an xdist
worker of the pytest plugin, `v41_conformance.isolation`, `v41_conformance.pool`) pass results on
without importing torch. `v41_conformance.runner` fills them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# partial: every output judged passes, and the implementation declined at least one (never a pass of those)
STATUSES = ("pass", "partial", "fail", "error", "crash", "timeout", "unsupported", "xfail", "xpass", "not_run")
PASSING = ("pass", "partial", "xfail", "unsupported")


@dataclass
class CaseResult:
    id: str
    component: str
    status: str
    message: str = ""
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # worst / total over the outputs
    duration_s: float = 0.0
    golden_sha256: str = ""
    tie_rows: int = 0
    tie_example: str = ""
    near_tie_rows: int = 0
    near_tie_example: str = ""
    boundary_flips: int = 0
    boundary_example: str = ""
    signed_zeros: int = 0
    signed_zero_example: str = ""
    diagnosis: dict[str, Any] | None = None  # a failing case's (harness/diagnosis): known bugs that reproduce it
    first_divergent_step: int | None = None
    first_divergent_stage: str = ""  # along a chain: the first output or intermediate that fails
    chain: str = ""  # along a chain: the stages of the first call whose values differ, in order
    expectation: str = ""
    repro: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    output: str = ""  # the tail of what the implementation printed during the case
    declined: list[str] = field(default_factory=list)  # outputs the implementation declined (status partial)
    kind: str = ""  # an error's kind (dtype error, exception, ...: report/text.py groups the cases by it)

    def to_json(self) -> dict[str, Any]:
        """The result as plain data (its fields are plain already: a shallow copy, not `asdict`'s deep
        one, which costs more than judging a passing case of hundreds of outputs)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})
