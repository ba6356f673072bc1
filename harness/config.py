"""`conformance.yaml`: where goldens and cases live, tolerances, floors, implementations.

Every problem is a UsageError naming the file and the field, so the CLI exits 2 with a message
that says what to fix. Tolerances resolve in this order (later wins): the registry's kind,
`tolerances.defaults.<kind>`, `tolerances.components.<component>`,
`tolerances.components.<component>.<output>`, then the implementation's own `tolerances` block.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .policy import FLOAT_KINDS, Policy
from .registry import Component, OutputSpec
from .yamlio import safe_load



@functools.cache
def dtype_kinds() -> dict:
    """The tolerance kind of each float dtype (torch is imported on first use: reading a configuration
    and resolving `--impl` do not need it, so a typo is reported at once)."""
    import torch

    return {torch.bfloat16: "bf16", torch.float32: "f32"}


CONFIG_NAME = "conformance.yaml"
TOP_KEYS = {"version", "goldens", "cases", "timeout", "tolerances", "floors", "impls", "extends"}
# `extends:` of a team's conformance.yaml: `default` (the store installed with the harness: its goldens,
# cases, tolerances and floors, with this file's own keys on top) or `none` (this file says it all).
EXTENDS = ("default", "none")
# Per-implementation verdict flags: which accepted differences it opts into (docs/verdicts.md).
IMPL_FLAGS = {"accept_ties": ("index", "accept_ties", True),
              "accept_near_ties": ("index", "accept_near_ties", True),
              "strict_boundaries": ("quantised", "accept_boundary", False),
              "strict_signed_zeros": (None, "accept_signed_zeros", False),  # None: every kind
              "strict_topk_order": ("index", "strict_order", True)}  # an unsorted top-k in torch's order
IMPL_KEYS = {"python", "command", "batch", "kind", "device", "expectations", "tolerances", "note",
             "options", "supports", *IMPL_FLAGS}


TIERS = ("small", "production")  # production: built locally, pinned by SHA-256 (docs/tiers.md)
# The production tier's cases run for minutes (its attention case: about two on 2 cores for the
# reference itself): its default timeout per case is at least this; --timeout overrides it.
PRODUCTION_TIMEOUT = 1200.0
# Seconds a failing case's diagnosis may take (harness/diagnosis): the small tier's cases re-run in
# milliseconds to a second per variant. --diagnosis-budget changes it for a run, and the environment
# variable CONFORMANCE_DIAGNOSIS_BUDGET for every run of a job (0 turns it off).
DIAGNOSIS_BUDGET = 30.0
DIAGNOSIS_ENV = "CONFORMANCE_DIAGNOSIS_BUDGET"


def default_diagnosis_budget() -> float:
    raw = os.environ.get(DIAGNOSIS_ENV)
    if raw is None:
        return DIAGNOSIS_BUDGET
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{DIAGNOSIS_ENV}={raw!r}: expected seconds >= 0 (0 turns the diagnosis off)") from None
    if not value >= 0:
        raise UsageError(f"{DIAGNOSIS_ENV}={raw!r}: expected seconds >= 0 (0 turns the diagnosis off)")
    return value


@dataclass
class Config:
    root: Path
    goldens: Path
    cases: Path
    timeout: float = 120.0
    tolerances: dict[str, Any] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)
    default_floor: int | None = None
    impls: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: Path | None = None
    layered_on: Path | None = None  # the default store's conformance.yaml this file was layered on
    tier: str = "small"
    diagnosis_budget: float = field(default_factory=default_diagnosis_budget)  # seconds per failing case; 0: off
    _policies: dict = field(default_factory=dict, repr=False)

    def for_tier(self, tier: str) -> Config:
        """This configuration for a case tier: `small` (the goldens in git) or `production`
        (cases/production, goldens/production: built locally, checked against MANIFEST.json)."""
        if tier not in TIERS:
            raise UsageError(f"--tier {tier!r}: expected one of {', '.join(TIERS)}")
        if tier == "small":
            return self
        from .store import production_goldens

        return replace(self, goldens=production_goldens(self.goldens), cases=self.cases / tier, tier=tier,
                       timeout=max(self.timeout, PRODUCTION_TIMEOUT))

    def settings(self) -> dict:
        """What a worker without this conformance.yaml needs of it (plain JSON; harness/execution.py)."""
        return {"tolerances": self.tolerances, "floors": self.floors, "default_floor": self.default_floor,
                "timeout": self.timeout, "impls": self.impls}

    @property
    def generate_command(self) -> str:
        """How to build this tier's goldens."""
        return "conformance generate" + ("" if self.tier == "small" else f" --tier {self.tier}")

    def policy(self, component: Component, output: str, impl: dict[str, Any] | None = None,
               dtype: torch.dtype | None = None) -> Policy:
        """The resolved policy of one output (step outputs `sNN.x` resolve like `x`); cached.

        `dtype`, the output's dtype, picks the tolerance kind of a float output: an fp32 output
        is judged by the f32 policy even where the component declares bf16 (and vice versa).
        """
        own = (tuple(bool(impl.get(flag)) for flag in IMPL_FLAGS),
               repr((impl.get("tolerances") or {}).get(component.name))) if impl else None
        by_name = (component.name, output, dtype, own)  # the per-call fast path: a case judges thousands
        cached = self._policies.get(by_name)
        if cached is not None:
            return cached
        spec = component.output_spec(output)
        if spec.kind in FLOAT_KINDS and dtype in dtype_kinds():
            spec = replace(spec, kind=dtype_kinds()[dtype])
        key = (component.name, spec, own)
        cached = self._policies.get(key)
        if cached is None:
            cached = self._policies[key] = self._resolve(component, spec, impl)
        self._policies[by_name] = cached
        return cached

    def boundary_policy(self, component: Component, impl: dict[str, Any] | None = None) -> Policy:
        """The quantised policy (boundary_ulps, accept_boundary) for flips inside a computation."""
        spec = OutputSpec("(internal)", "quantised", quant="-", pre="-")
        key = (component.name, spec, tuple(bool((impl or {}).get(flag)) for flag in IMPL_FLAGS))
        if key not in self._policies:
            self._policies[key] = self._resolve(component, spec, impl)
        return self._policies[key]

    def _resolve(self, component: Component, spec, impl: dict[str, Any] | None) -> Policy:
        policy = spec.base_policy()
        where = str(self.path or CONFIG_NAME)
        defaults = (self.tolerances.get("defaults") or {}).get(spec.kind) or {}
        policy = policy.with_overrides(defaults, f"{where}: tolerances.defaults.{spec.kind}")
        per_component = (self.tolerances.get("components") or {}).get(component.name) or {}
        flat = {k: v for k, v in per_component.items() if not isinstance(v, dict)}
        policy = policy.with_overrides(flat, f"{where}: tolerances.components.{component.name}")
        nested = per_component.get(spec.name)
        if isinstance(nested, dict):
            policy = policy.with_overrides(nested, f"{where}: tolerances.components.{component.name}.{spec.name}")
        if impl:
            for flag, (kind, field_name, value) in IMPL_FLAGS.items():
                if impl.get(flag) and kind in (None, policy.kind):
                    policy = policy.with_overrides({field_name: value}, f"{where}: impls {flag}")
            own = ((impl.get("tolerances") or {}).get(component.name) or {})
            own_flat = {k: v for k, v in own.items() if not isinstance(v, dict)}
            policy = policy.with_overrides(own_flat, f"{where}: impl tolerances.{component.name}")
        return policy

    def validate(self) -> None:
        """Resolve every policy once so a bad tolerance is a usage error before anything runs."""
        from .registry import components

        registry = components()
        known = set(registry)
        for name, block in (self.tolerances.get("components") or {}).items():
            if name not in known:
                raise UsageError(f"{self.path}: tolerances.components.{name}: no such component; known: {', '.join(sorted(known))}")
            if not isinstance(block, dict):
                raise UsageError(f"{self.path}: tolerances.components.{name} must be a mapping")
        for name in self.floors:
            if name not in known:
                raise UsageError(f"{self.path}: floors.{name}: no such component")
        for component in registry.values():
            for output in component.outputs:
                dtypes = dtype_kinds() if output.kind in FLOAT_KINDS else (None,)
                for dtype in dtypes:
                    self.policy(component, output.name, dtype=dtype)

    def floor(self, component: Component) -> int:
        if component.name in self.floors:
            return self.floors[component.name]
        if self.default_floor is not None:
            return self.default_floor
        return component.floor


def find_config(start: Path | None = None) -> Path | None:
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_NAME
        if candidate.exists():
            return candidate
    return None


def _read(path: Path) -> dict:
    if not path.exists():
        raise UsageError(f"{path}: configuration file not found")
    try:
        doc = safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: malformed YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: top level must be a mapping, got {type(doc).__name__}")
    unknown = set(doc) - TOP_KEYS
    if unknown:
        raise UsageError(f"{path}: unknown top-level key(s) {sorted(unknown)}; allowed: {sorted(TOP_KEYS)}")
    extends = doc.get("extends", "default")
    if extends not in EXTENDS:
        raise UsageError(f"{path}: extends must be one of {', '.join(EXTENDS)}, not {extends!r}")
    return doc


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _layered(doc: dict, path: Path, default: Path) -> tuple[dict, dict[str, Path]]:
    """A team's file on top of the default store's: its goldens and cases (each relative to the file
    that names it), tolerances merged key by key, floors merged, implementations the team's own."""
    base = _read(default)
    merged = {**base, **{k: v for k, v in doc.items() if k not in ("tolerances", "floors")}}
    merged["tolerances"] = _deep_merge(_mapping(base, "tolerances", default), _mapping(doc, "tolerances", path))
    merged["floors"] = {**_mapping(base, "floors", default), **_mapping(doc, "floors", path)}
    merged["impls"] = _mapping(doc, "impls", path)
    anchors = {key: (path if key in doc else default) for key in ("goldens", "cases")}
    return merged, anchors


def load_config(path: Path | None = None) -> Config:
    """Read `conformance.yaml` (found upwards from the cwd when `path` is None; the default store's
    when there is none), layered on the default store's unless it says `extends: none`."""
    from . import store

    default = store.default_config()
    if path is None:
        path = find_config() or default
        if path is None:
            raise UsageError(f"no {CONFIG_NAME} found in this folder or above, and this install of the harness "
                             "carries no golden store; pass --config, or reinstall the package (its wheel holds "
                             "the goldens)")
    path = Path(path)
    doc = _read(path)
    anchors = {"goldens": path, "cases": path}
    layered = default is not None and doc.get("extends", "default") == "default" and path.resolve() != default.resolve()
    if layered:
        doc, anchors = _layered(doc, path, default)
    root = path.resolve().parent
    config = Config(
        root=root,
        goldens=anchors["goldens"].resolve().parent / _str(doc, "goldens", "goldens", path),
        cases=anchors["cases"].resolve().parent / _str(doc, "cases", "cases", path),
        timeout=_number(doc, "timeout", 120.0, path),
        tolerances=_mapping(doc, "tolerances", path),
        impls=_mapping(doc, "impls", path),
        path=path,
        layered_on=default if layered else None,
    )
    floors = _mapping(doc, "floors", path)
    for key, value in floors.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UsageError(f"{path}: floors.{key} must be a non-negative integer, not {value!r}")
    config.default_floor = floors.pop("default", None)
    config.floors = floors
    for name, impl in config.impls.items():
        if not isinstance(impl, dict):
            raise UsageError(f"{path}: impls.{name} must be a mapping")
        bad = set(impl) - IMPL_KEYS
        if bad:
            raise UsageError(f"{path}: impls.{name}: unknown key(s) {sorted(bad)}; allowed: {sorted(IMPL_KEYS)}")
        for flag in IMPL_FLAGS:
            if flag in impl and not isinstance(impl[flag], bool):
                raise UsageError(f"{path}: impls.{name}.{flag} must be true or false, not {impl[flag]!r}")
        supports = impl.get("supports")
        if supports is not None and (not isinstance(supports, list) or not all(isinstance(p, str) for p in supports)):
            raise UsageError(f"{path}: impls.{name}.supports must be a list of component name patterns "
                             f"(e.g. [quant.*, indexer.select]), not {supports!r}")
    for section in ("defaults", "components"):
        value = config.tolerances.get(section, {})
        if value is not None and not isinstance(value, dict):
            raise UsageError(f"{path}: tolerances.{section} must be a mapping")
    return config


def _str(doc: dict, key: str, default: str, path: Path) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise UsageError(f"{path}: {key} must be a path string, not {value!r}")
    return value


def _number(doc: dict, key: str, default: float, path: Path) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UsageError(f"{path}: {key} must be a positive number of seconds, not {value!r}")
    return float(value)


def _mapping(doc: dict, key: str, path: Path) -> dict:
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        raise UsageError(f"{path}: {key} must be a mapping, not {type(value).__name__}")
    return value
