"""Executes cases for one run inside this process (an isolation child, or a run without isolation).

`CaseExecutor` holds what every case of a run shares: the configuration, the manifest and the
implementation, and judges one case at a time here. A run with isolation (the default for
`conformance run`) keeps the implementation in child processes instead (`v41_conformance.pool.executor_for`),
each of which judges its cases with a `CaseExecutor` of its own.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import __version__, capture, store
from .adapters.loader import ImplSpec, instantiate
from .config import Config, load_config
from .errors import GoldenError, HarnessError, UsageError
from .golden import read_manifest
from .runner import CaseResult, run_case


def stores_of(config: Config, run: dict) -> Config:
    """The run's tier and stores (--tier, --goldens, --cases) applied to its conformance.yaml. A run
    that judges the packaged store judges this process's own package (a remote xdist worker needs the
    same package version, not the same paths; `store_problem` checks they agree)."""
    config = config.for_tier(run.get("tier", "small"))
    origin = (run.get("store") or {}).get("origin")
    given = Path(run["goldens_dir"]) if "goldens_dir" in run else None
    own = store.default_root()
    if own is not None and (origin == "package" or (origin == "checkout" and given is not None and not given.exists())):
        small = dataclasses.replace(config, goldens=own / "goldens", cases=own / "cases", tier="small")
        return small.for_tier(run.get("tier", "small"))
    if given is not None:
        config = dataclasses.replace(config, goldens=given, cases=Path(run["cases_dir"]))
    return config


def config_of(run: dict) -> Config:
    """The run's configuration: its conformance.yaml where this machine has it, else the default
    store's with the controller's settings (tolerances, floors, timeout, implementations) on top."""
    path = Path(run["config"])
    settings = run.get("settings")
    if not path.exists() and settings is not None:
        default = store.default_config()
        if default is None:
            raise UsageError(
                f"this machine has neither the run's {path} nor a packaged golden store: install "
                "v41-conformance from its wheel on every machine of the run"
            )
        path = default
    config = load_config(path)
    if settings is not None:  # the controller's effective settings, whatever file this machine read
        config = dataclasses.replace(
            config,
            tolerances=settings["tolerances"],
            floors=settings["floors"],
            default_floor=settings["default_floor"],
            timeout=float(settings["timeout"]),
            impls=settings["impls"],
            _policies={},
        )
    return stores_of(config, run)


def store_problem(config: Config, run: dict) -> str:
    """'' when this process judges the store the controller judged; else why every case is an error."""
    host = store.worker_name()
    theirs = run.get("harness_version")
    if theirs is not None and theirs != __version__:
        return store.version_refusal(theirs)
    want, mine = run.get("store"), store.identity(config.goldens, config.tier)
    if want and not store.same_store(want, mine):
        return (
            f"this worker ({host}) judges the {store.describe(mine)} but the controller judged the "
            f"{store.describe(want)}: every machine of a run must hold the same golden store (the same "
            "package version, or the same --goldens)"
        )
    return ""


@dataclass
class CaseExecutor:
    config: Config
    spec: ImplSpec
    manifest: dict
    device: str = "cpu"
    timeout: float = 120.0
    run_dir: str | None = None  # the run's private folder (v41_conformance.rundir): output capture, children
    _impl: Any = None
    _manifest_error: str = ""
    _store_error: str = ""  # this process judges another store than the controller (every case an error)

    @classmethod
    def from_run(cls, run: dict) -> CaseExecutor:
        # Small-tier cases are small: intra-op threads only add synchronisation, and with -n every
        # worker would fight for the same cores. The production tier's GEMMs use every core when one
        # process runs them. CONFORMANCE_THREADS overrides both (a big CPU port, say).
        import torch

        config = config_of(run)
        config = dataclasses.replace(config, diagnosis_budget=int(run.get("diagnosis_budget", config.diagnosis_budget)))
        alone = config.tier != "small" and "PYTEST_XDIST_WORKER" not in os.environ
        torch.set_num_threads(int(os.environ.get("CONFORMANCE_THREADS", torch.get_num_threads() if alone else 1)))
        spec = ImplSpec(**run["impl"])
        try:
            manifest = read_manifest(config.goldens)
            problem = ""
        except GoldenError as exc:
            manifest, problem = {}, str(exc)
        executor = cls(
            config,
            spec,
            manifest,
            run.get("device", "cpu"),
            float(run.get("timeout", config.timeout)),
            run.get("run_dir"),
        )
        executor._manifest_error = problem
        executor._store_error = store_problem(config, run)
        return executor

    def run(self, case_id: str, on_executed=None) -> CaseResult:
        """`on_executed`: see `runner.run_case` (an isolation child reports the implementation done)."""
        if self._store_error:
            from .ids import split_case_id

            return CaseResult(case_id, split_case_id(case_id)[0], "error", self._store_error)
        if case_id not in self.manifest:
            self._reread_manifest()  # a golden written after this run started (conformance fuzz shrinking)
        if self._manifest_error:
            from .ids import split_case_id

            return CaseResult(case_id, split_case_id(case_id)[0], "error", f"golden: {self._manifest_error}")
        return capture.run_captured(
            capture.output_file(self.run_dir, case_id),
            lambda: run_case(
                case_id, self.config, self.impl(), self.spec.name, self.manifest, self.spec.conf, on_executed
            ),
        )

    def _reread_manifest(self) -> None:
        try:
            self.manifest, self._manifest_error = read_manifest(self.config.goldens), ""
        except GoldenError as exc:
            self.manifest, self._manifest_error = {}, str(exc)

    def impl(self):
        if self._impl is None:
            impl = instantiate(self.spec)
            if self.device != "cpu":
                from .adapters.device import DeviceAdapter

                impl = DeviceAdapter(impl, self.device)
            self._impl = impl
        return self._impl

    def close(self) -> None:
        """Nothing to stop: the implementation lives in this process."""


__all__ = ["CaseExecutor", "HarnessError"]
