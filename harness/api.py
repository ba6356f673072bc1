"""The Python API for a team's own tests: the cases by pattern, their inputs, and a verdict.

    from v41_conformance import api

    for case in api.cases("quant.fp4_*"):
        out = my_kernel(case.inputs()["x"])                          # your own call
        verdict = api.check_outputs(case, {"y": out.y, "scale_bytes": out.scale})
        assert verdict.ok, verdict.message

    verdict = api.check("indexer/r1-prefill-s21", MyIndexer())        # stepped cases too

`check` drives an implementation (an object with supports() and run(), or a plain function
run(component, inputs, params)) through a case exactly as `conformance run` does, in this process:
schedules step by step, every output judged by its policy, the chain and the diagnosis included.
`check_outputs` judges outputs you computed yourself, for a case that is one call. Both load the
configuration the CLI would (the nearest conformance.yaml, layered on the packaged store).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from .errors import UsageError

if TYPE_CHECKING:
    from .adapters.base import Declined, Implementation, Outputs

    # A plain function run(component, inputs, params) -> outputs, as `check` takes one.
    RunFunction = Callable[[str, dict[str, torch.Tensor], dict[str, Any]], Outputs]

__all__ = ["Case", "Verdict", "cases", "case", "check", "check_outputs"]


@dataclass(frozen=True)
class Verdict:
    """A case's verdict: `status` (pass, fail, error, unsupported, ...), `ok`, the harness's message,
    and every output's record (`outputs`: ok, policy, metrics), as in results.json."""

    case_id: str
    status: str
    message: str
    outputs: dict[str, dict[str, Any]]
    record: dict[str, Any]  # the whole results.json entry

    @property
    def ok(self) -> bool:
        """Every output judged passes (`partial`: some were declined, see `declined`)."""
        return self.status in ("pass", "partial")

    @property
    def declined(self) -> list[str]:
        return list(self.record.get("declined") or [])

    def __str__(self) -> str:
        return f"{self.case_id}: {self.status}" + (f"\n{self.message}" if self.message else "")


@dataclass(frozen=True)
class Case:
    id: str
    component: str
    params: dict[str, Any]  # every param the implementation receives, defaults filled in
    stepped: bool  # a schedule: driven call by call (use `check`)
    _config: Any
    _manifest: dict

    def golden(self):
        from . import regenerated
        from .golden import load_verified
        from .known import components

        golden = load_verified(self._config.goldens, self.id, self._manifest, self._config.generate_command)
        regenerated.restore(golden, components()[self.component])
        return golden

    def inputs(self) -> dict[str, torch.Tensor]:
        """The case's input tensors (fresh copies: change them freely)."""
        return {k: v.clone() for k, v in self.golden().inputs.items()}

    def expected(self) -> dict[str, torch.Tensor]:
        """The reference's outputs, for looking at; judge with `check_outputs`, never with equality."""
        return dict(self.golden().outputs)


@lru_cache(maxsize=8)
def _store(config_path: str | None, tier: str):
    from .config import load_config
    from .golden import read_manifest

    config = load_config(Path(config_path) if config_path else None)
    config.validate()
    config = config.for_tier(tier)
    return config, read_manifest(config.goldens)


def cases(select: str | list[str] = "*", tier: str = "small", config: str | Path | None = None) -> list[Case]:
    """The cases whose ids match `select` (shell patterns, comma separated or a list), sorted by id."""
    from .golden import load_verified
    from .ids import parse_select
    from .known import components
    from .session import select_case_ids

    harness_config, manifest = _store(str(config) if config else None, tier)
    patterns = parse_select([select] if isinstance(select, str) else list(select))
    registry = components()
    out = []
    for case_id in select_case_ids(harness_config, patterns):
        component = registry[case_id.split("/")[0]]
        meta = load_verified(harness_config.goldens, case_id, manifest).meta
        out.append(
            Case(
                case_id,
                component.name,
                component.with_defaults(meta["params"]),
                bool(component.steps),
                harness_config,
                manifest,
            )
        )
    return out


def case(case_id: str, tier: str = "small", config: str | Path | None = None) -> Case:
    found = [c for c in cases(case_id, tier, config) if c.id == case_id]
    if not found:
        raise UsageError(f"no case {case_id!r} in the {tier} tier; `conformance list` shows them")
    return found[0]


_by_id = case  # `check` and `check_outputs` take a parameter named `case`


class _Function:
    """A plain function run(component, inputs, params) as an implementation of every component."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def supports(self, component: str) -> bool:
        return True

    def run(self, component, inputs, params):
        return self.fn(component, inputs, params)


class _Given:
    """The outputs a caller computed, returned for the case's one call."""

    def __init__(self, outputs: Mapping[str, torch.Tensor | Declined]):
        self.outputs, self.calls = outputs, 0

    def supports(self, component: str) -> bool:
        return True

    def run(self, component, inputs, params):
        self.calls += 1
        return dict(self.outputs)


def check(
    case: Case | str, impl: Implementation | RunFunction, impl_conf: dict[str, Any] | None = None, tier: str = "small"
) -> Verdict:
    """Run `impl` through the case and judge it (`impl_conf`: its conformance.yaml entry, for flags
    such as accept_ties; default: the entry named like the implementation's class, if any)."""
    from .runner import run_case

    if isinstance(case, str):
        case = _by_id(case, tier)
    if not (callable(getattr(impl, "run", None)) and callable(getattr(impl, "supports", None))):
        if not callable(impl):
            raise UsageError(
                "check(): impl must have supports() and run(), or be a function run(component, inputs, params)"
            )
        impl = _Function(impl)
    name = type(impl).__name__
    result = run_case(case.id, case._config, impl, name, case._manifest, impl_conf or {})
    record = result.to_json()
    return Verdict(case.id, record["status"], record.get("message") or "", record.get("outputs") or {}, record)


def check_outputs(
    case: Case | str,
    outputs: Mapping[str, torch.Tensor | Declined],
    impl_conf: dict[str, Any] | None = None,
    tier: str = "small",
) -> Verdict:
    """Judge outputs computed for the case's inputs (`case.inputs()`). Only for a case that is one call;
    a schedule needs `check` (its later calls depend on the state the earlier ones returned)."""
    if isinstance(case, str):
        case = _by_id(case, tier)
    if case.stepped:
        raise UsageError(f"{case.id}: a stepped case is several calls; judge it with api.check(case, impl)")
    given = _Given(outputs)
    verdict = check(case, given, impl_conf)
    if given.calls != 1:
        raise UsageError(f"{case.id}: the case made {given.calls} calls; check_outputs is for one-call cases")
    return verdict
