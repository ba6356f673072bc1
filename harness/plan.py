"""What a run judges, decided before anything heavy is imported: its options, its cases, their
estimated cost, and the run document every process of the run rebuilds it from.

Imports no torch (nor anything that does): the pytest plugin's xdist controller plans a run with it
while its workers start, and loads the implementation beside them (`v41_conformance.pytest_run`).
`v41_conformance.session` runs what this plans.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .cases import load_cases
from .config import Config
from .golden import discover, read_manifest
from .ids import matches
from .rundir import DEFAULT_REPORT_DIR, rerun_dir  # noqa: F401  (DEFAULT_REPORT_DIR re-exported)
from .store import identity


@dataclass
class RunOptions:
    impl: str
    select: list[str]
    report_dir: Path
    workers: str = "0"
    device: str = "cpu"
    timeout: float | None = None
    isolate: bool = True
    shard: tuple[int, int] | None = None
    pytest_args: tuple[str, ...] = ()
    config_path: str | None = None  # --config as the user gave it (for re-run commands)
    tier: str = "small"
    stores: tuple[str | None, str | None] = (None, None)  # --goldens, --cases as given
    baseline: Path | None = None  # a report dir or results.json to diff against (harness/diff.py)
    diagnosis_budget: int | None = None  # re-runs per failing case (None: the configuration's; 0: off)

    def repro(self, case_id: str, front: str = "conformance") -> str:
        """The command that re-runs exactly this case the way this run ran it: `conformance run ...`,
        or (front "pytest", the plugin) `pytest conformance::<case id> --conformance-impl ...`."""
        if front == "pytest":
            flags = self._flags()
            parts = ["pytest", f"conformance::{case_id}", "--conformance-impl", self.impl]
            for flag, value in flags:
                parts += [flag.replace("--", "--conformance-", 1)] + ([value] if value is not None else [])
            return " ".join(shlex.quote(p) for p in parts)
        parts = ["conformance", "run", "--impl", self.impl, "--select", case_id]
        for flag, value in self._flags():
            parts += [flag] + ([value] if value is not None else [])
        return " ".join(shlex.quote(p) for p in parts)

    def _flags(self) -> list[tuple[str, str | None]]:
        """The options (beyond the implementation and the case) a re-run needs, as (flag, value)."""
        parts: list = []
        if self.config_path:
            parts.append(("--config", self.config_path))
        if self.tier != "small":
            parts.append(("--tier", self.tier))
        for flag, value in zip(("--goldens", "--cases"), self.stores):
            if value:
                parts.append((flag, value))
        if self.device != "cpu":
            parts.append(("--device", self.device))
        if self.timeout is not None:
            parts.append(("--timeout", f"{self.timeout:g}"))
        if not self.isolate:
            parts.append(("--no-isolate", None))
        if self.report_dir is not None:  # a sibling report dir: re-running one case never replaces this run's report
            parts.append(("--report-dir", str(rerun_dir(self.report_dir))))
        return parts


def select_case_ids(config: Config, select: list[str]) -> list[str]:
    """Every case the run should judge: specs, manifest entries and files on disk."""
    ids = set(discover(config.goldens))
    try:
        ids |= set(read_manifest(config.goldens))
    except Exception:  # a corrupt manifest is reported per case by the executor
        pass
    if config.cases.exists():
        ids |= {spec.id for spec in load_cases(config.cases)}
    return sorted(i for i in ids if matches(i, select))


def case_costs(config: Config, ids: list[str]) -> dict[str, float]:
    from .workers import estimate

    try:
        manifest = read_manifest(config.goldens, drop_invalid=True)
    except Exception:  # a corrupt manifest is reported per case by the executor
        manifest = {}
    return {i: estimate(i, manifest, config.goldens) for i in ids}


def ids_digest(ids: list[str]) -> str:
    """Which cases a run chose from (before sharding): shards of one run agree on it."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def shard_ids(ids: list[str], index: int, count: int) -> list[str]:
    """Deterministic split for CI matrices: a case goes to shard hash(id) mod count."""
    return [i for i in ids if int(hashlib.sha256(i.encode()).hexdigest()[:8], 16) % count == index - 1]


def run_document(
    config: Config,
    options: RunOptions,
    spec,
    ids: list[str],
    token: str,
    run_dir: str | None,
    workers: int = 1,
    prefetch: bool = False,
) -> dict:
    """What every process of a run needs to judge its cases (`CaseExecutor.from_run`): plain JSON."""
    return {
        "token": token,
        "run_dir": run_dir,
        "config": str(config.path),
        "tier": config.tier,
        "store": identity(config.goldens, config.tier),
        "harness_version": __version__,
        "settings": config.settings(),
        "goldens_dir": str(config.goldens.resolve()),
        "cases_dir": str(config.cases.resolve()),
        "impl": {"name": spec.name, "kind": spec.kind, "target": spec.target, "root": spec.root, "conf": spec.conf},
        "device": options.device,
        "timeout": options.timeout or config.timeout,
        "diagnosis_budget": config.diagnosis_budget if options.diagnosis_budget is None else options.diagnosis_budget,
        "isolate": options.isolate,
        "workers": workers,
        "prefetch": prefetch,
        "cases": ids,
    }
