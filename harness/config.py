"""`conformance.yaml`: where goldens and cases live, tolerances, floors, implementations.

Every problem is a UsageError naming the file and the field, so the CLI exits 2 with a message
that says what to fix. Tolerances resolve in this order (later wins): the registry's kind,
`tolerances.defaults.<kind>`, `tolerances.components.<component>`,
`tolerances.components.<component>.<output>`, then the implementation's own `tolerances` block.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .errors import UsageError
from .policy import FLOAT_KINDS, KINDS, TUNABLE, Policy
from .yamlio import safe_load

if TYPE_CHECKING:  # reading a configuration imports no torch: a pytest-xdist controller plans a run without it
    import torch

    from .registry import Component

DTYPE_KINDS = {"torch.bfloat16": "bf16", "torch.float32": "f32"}  # by str(dtype)

CONFIG_NAME = "conformance.yaml"
TOP_KEYS = {"version", "goldens", "cases", "timeout", "tolerances", "floors", "impls", "extends"}
# `extends:` of a team's conformance.yaml: `default` (the store installed with the harness: its goldens,
# cases, tolerances and floors, with this file's own keys on top) or `none` (this file says it all).
EXTENDS = ("default", "none")
# Per-implementation verdict flags: which accepted differences it opts into (docs/verdicts.md).
IMPL_FLAGS = {
    "accept_ties": ("index", "accept_ties", True),
    "accept_near_ties": ("index", "accept_near_ties", True),
    "strict_boundaries": ("quantised", "accept_boundary", False),
    "strict_signed_zeros": (None, "accept_signed_zeros", False),  # None: every kind
    "strict_topk_order": ("index", "strict_order", True),
}  # an unsorted top-k in torch's order
IMPL_KEYS = {
    "python",
    "command",
    "batch",
    "expectations",
    "tolerances",
    "note",
    "supports",
    "accumulator_bits",
    *IMPL_FLAGS,
}
TOLERANCE_SECTIONS = ("defaults", "components")  # tolerances.defaults.<kind>, tolerances.components.<component>
TOLERANCE_FIELDS = (*TUNABLE, "note")
# The implementation's fp8 GEMM accumulator, in significant bits (harness/accumulation.py): 14 as an H800's
# tensor cores keep (the default), 24 for an fp32 accumulator (judged tighter), fewer for narrower hardware.
ACCUMULATOR_BITS = (8, 53)


TIERS = ("small", "production")  # production: built locally, pinned by SHA-256 (docs/tiers.md)
# The production tier's cases run for minutes (its attention case: about two on 2 cores for the
# reference itself): its default timeout per case is at least this; --timeout overrides it.
PRODUCTION_TIMEOUT = 1200.0
# Re-runs of the reference a failing case's diagnosis may make (harness/diagnosis): one per variant of
# the catalogue that can change the component, then pairs of them. Work, not seconds, so a case gets
# the same diagnosis on any machine under any load. The small tier's cases re-run in milliseconds to
# a few tenths of a second; the production tier's attention case in about a minute, so that tier's
# default is smaller. --diagnosis-budget changes it for a run, and the environment variable
# CONFORMANCE_DIAGNOSIS_BUDGET for every run of a job (0 turns it off).
DIAGNOSIS_BUDGET = 64
PRODUCTION_DIAGNOSIS_BUDGET = 8
DIAGNOSIS_ENV = "CONFORMANCE_DIAGNOSIS_BUDGET"


def parse_diagnosis_budget(raw, where: str) -> int:
    """A diagnosis budget: a whole number of re-runs >= 0 (UsageError naming `where` otherwise)."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not (value >= 0 and value == int(value)):
        raise UsageError(f"{where}={raw!r}: expected a whole number of re-runs >= 0 (0 turns the diagnosis off)")
    return int(value)


def default_diagnosis_budget() -> int:
    raw = os.environ.get(DIAGNOSIS_ENV)
    return DIAGNOSIS_BUDGET if raw is None else parse_diagnosis_budget(raw, DIAGNOSIS_ENV)


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
    diagnosis_budget: int = field(default_factory=default_diagnosis_budget)  # re-runs per failing case; 0: off
    _policies: dict = field(default_factory=dict, repr=False)

    def for_tier(self, tier: str) -> Config:
        """This configuration for a case tier: `small` (the goldens in git) or `production`
        (cases/production, goldens/production: built locally, checked against MANIFEST.json)."""
        if tier not in TIERS:
            raise UsageError(f"--tier {tier!r}: expected one of {', '.join(TIERS)}")
        if tier == "small":
            return self
        from .store import production_goldens

        budget = (
            self.diagnosis_budget
            if DIAGNOSIS_ENV in os.environ
            else min(self.diagnosis_budget, PRODUCTION_DIAGNOSIS_BUDGET)
        )
        return replace(
            self,
            goldens=production_goldens(self.goldens),
            cases=self.cases / tier,
            tier=tier,
            timeout=max(self.timeout, PRODUCTION_TIMEOUT),
            diagnosis_budget=budget,
        )

    def settings(self) -> dict:
        """What a worker without this conformance.yaml needs of it (plain JSON; harness/execution.py)."""
        return {
            "tolerances": self.tolerances,
            "floors": self.floors,
            "default_floor": self.default_floor,
            "timeout": self.timeout,
            "impls": self.impls,
        }

    @property
    def generate_command(self) -> str:
        """How to build this tier's goldens."""
        return "conformance generate" + ("" if self.tier == "small" else f" --tier {self.tier}")

    def policy(
        self, component: Component, output: str, impl: dict[str, Any] | None = None, dtype: torch.dtype | None = None
    ) -> Policy:
        """The resolved policy of one output (step outputs `sNN.x` resolve like `x`); cached.

        `dtype`, the output's dtype, picks the tolerance kind of a float output: an fp32 output
        is judged by the f32 policy even where the component declares bf16 (and vice versa).
        """
        own = (
            (
                tuple(bool(impl.get(flag)) for flag in IMPL_FLAGS),
                impl.get("accumulator_bits"),
                repr((impl.get("tolerances") or {}).get(component.name)),
            )
            if impl
            else None
        )
        by_name = (component.name, output, dtype, own)  # the per-call fast path: a case judges thousands
        cached = self._policies.get(by_name)
        if cached is not None:
            return cached
        spec = component.output_spec(output)
        if spec.kind in FLOAT_KINDS and str(dtype) in DTYPE_KINDS:
            spec = replace(spec, kind=DTYPE_KINDS[str(dtype)])
        key = (component.name, spec, own)
        cached = self._policies.get(key)
        if cached is None:
            cached = self._policies[key] = self._resolve(component, spec, impl)
        self._policies[by_name] = cached
        return cached

    def boundary_policy(self, component: Component, impl: dict[str, Any] | None = None) -> Policy:
        """The quantised policy (boundary_ulps, accept_boundary) for flips inside a computation."""
        from .registry import OutputSpec

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
            own = (impl.get("tolerances") or {}).get(component.name) or {}
            own_flat = {k: v for k, v in own.items() if not isinstance(v, dict)}
            policy = policy.with_overrides(own_flat, f"{where}: impl tolerances.{component.name}")
            own_nested = own.get(spec.name)
            if isinstance(own_nested, dict):
                policy = policy.with_overrides(own_nested, f"{where}: impl tolerances.{component.name}.{spec.name}")
            bits = impl.get("accumulator_bits")
            if bits is not None:
                lo, hi = ACCUMULATOR_BITS
                if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not lo <= bits <= hi:
                    raise UsageError(
                        f"{where}: impls accumulator_bits must be a number of significant bits in "
                        f"[{lo}, {hi}] (14: an H800's fp8 tensor cores; 24: an fp32 accumulator), not {bits!r}"
                    )
                policy = replace(policy, accumulator_bits=float(bits))
        return policy

    def validate(self) -> None:
        """Every key names something real, and every policy resolves, so a misplaced or mistyped
        tolerance is a usage error before anything runs (never a block that silently does nothing)."""
        import torch

        from .expectations import load_expectations
        from .known import components

        registry = components()
        known = set(registry)
        for name, block in (self.tolerances.get("components") or {}).items():
            where = f"{self.path}: tolerances.components.{name}"
            if name not in known:
                raise UsageError(f"{where}: no such component; known: {', '.join(sorted(known))}")
            _check_component_block(block, where, registry[name])
        for name in self.floors:
            if name not in known:
                raise UsageError(
                    f"{self.path}: floors.{name}: no such component; allowed: default, {', '.join(sorted(known))}"
                )
        for impl_name, impl in self.impls.items():
            where = f"{self.path}: impls.{impl_name}.tolerances"
            own = impl.get("tolerances") or {}
            if not isinstance(own, dict):
                raise UsageError(f"{where} must be a mapping of component: {{tolerance field: value}}")
            for name, block in own.items():
                if name not in known:
                    raise UsageError(f"{where}.{name}: no such component; known: {', '.join(sorted(known))}")
                _check_component_block(block, f"{where}.{name}", registry[name])
            load_expectations(impl, self.root, f"{self.path}: impls.{impl_name}")
        for component in registry.values():
            for output in component.outputs + component.intermediates:
                dtypes = (torch.bfloat16, torch.float32) if output.kind in FLOAT_KINDS else (None,)
                for dtype in dtypes:
                    for changing in (None, *(conf for conf in self.impls.values() if _changes_policies(conf))):
                        self.policy(component, output.name, changing, dtype=dtype)

    def overrides(self, impl_name: str | None = None) -> list[dict[str, Any]]:
        """Every tolerance, floor, timeout and per-implementation switch or tolerance in which this
        configuration differs from the packaged defaults (the store installed with the harness), as
        {key, value, default} (None: not set). results.json, the console and every report list them."""
        from . import store

        default = store.default_config()
        mine, theirs = _flat_settings(self), {}
        if default is not None:
            theirs = _flat_settings(load_config(default))
            if self.tier != "small":  # the tier's own default timeout is no override
                theirs["timeout"] = max(theirs["timeout"], PRODUCTION_TIMEOUT)
        out = [
            {"key": key, "value": mine.get(key), "default": theirs.get(key)}
            for key in sorted(set(mine) | set(theirs))
            if mine.get(key) != theirs.get(key)
        ]
        impl = (self.impls.get(impl_name) if impl_name is not None else None) or {}
        for flag in IMPL_FLAGS:
            if impl.get(flag):
                out.append({"key": f"impls.{impl_name}.{flag}", "value": True, "default": False})
        for key, value in sorted(_leaves(impl.get("tolerances") or {}, f"impls.{impl_name}.tolerances").items()):
            packaged_key = "tolerances.components." + key.split(".tolerances.", 1)[1]
            out.append({"key": key, "value": value, "default": theirs.get(packaged_key)})
        return out

    def floor(self, component: Component) -> int:
        if component.name in self.floors:
            return self.floors[component.name]
        if self.default_floor is not None:
            return self.default_floor
        return component.floor


def _changes_policies(impl: dict[str, Any]) -> bool:
    return bool(impl.get("tolerances")) or any(impl.get(flag) for flag in IMPL_FLAGS)


def _check_fields(block: Any, where: str) -> None:
    """A block of tolerance fields (their values are checked when the policy resolves)."""
    if not isinstance(block, dict):
        raise UsageError(f"{where} must be a mapping of tolerance fields ({', '.join(TOLERANCE_FIELDS)})")
    unknown = sorted(set(block) - set(TOLERANCE_FIELDS))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(TOLERANCE_FIELDS)}")


def _check_component_block(block: Any, where: str, component: Component) -> None:
    """A component's tolerances: fields for every output, and a block of fields per output."""
    outputs = [o.name for o in component.outputs + component.intermediates]
    if not isinstance(block, dict):
        raise UsageError(f"{where} must be a mapping of tolerance fields and output blocks")
    for key, value in block.items():
        if key in TOLERANCE_FIELDS and not isinstance(value, dict):
            continue
        if key in outputs:
            _check_fields(value, f"{where}.{key}")
            continue
        what = (
            "a tolerance field takes a number or true/false, not a mapping"
            if key in TOLERANCE_FIELDS
            else f"neither a tolerance field nor an output of {component.name}"
        )
        raise UsageError(
            f"{where}.{key}: {what}; allowed: the fields {', '.join(TOLERANCE_FIELDS)}, "
            f"or a block per output: {', '.join(outputs)}"
        )


def _check_tolerance_sections(tolerances: dict, path: Path) -> None:
    """tolerances: holds `defaults` (per kind) and `components` (per component) and nothing else."""
    for key, value in tolerances.items():
        if key not in TOLERANCE_SECTIONS:
            raise UsageError(
                f"{path}: tolerances.{key}: unknown key; allowed: {', '.join(TOLERANCE_SECTIONS)} "
                f"(a component's tolerances go under tolerances.components.<component>)"
            )
        if value is not None and not isinstance(value, dict):
            raise UsageError(f"{path}: tolerances.{key} must be a mapping")
    for kind, block in (tolerances.get("defaults") or {}).items():
        if kind not in KINDS:
            raise UsageError(f"{path}: tolerances.defaults.{kind}: unknown kind; allowed: {', '.join(KINDS)}")
        _check_fields(block, f"{path}: tolerances.defaults.{kind}")


def _leaves(tree: dict, prefix: str) -> dict[str, Any]:
    """{dotted.key: value} of every leaf of a nested mapping, notes left out."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}.{key}"))
        elif key != "note":
            out[f"{prefix}.{key}"] = value
    return out


def _flat_settings(config: Config) -> dict[str, Any]:
    """The settings a configuration may change from the packaged defaults, as dotted keys."""
    floors = {**config.floors, **({"default": config.default_floor} if config.default_floor is not None else {})}
    return {**_leaves(config.tolerances, "tolerances"), **_leaves(floors, "floors"), "timeout": config.timeout}


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
            raise UsageError(
                f"no {CONFIG_NAME} found in this folder or above, and this install of the harness "
                "carries no golden store; pass --config, or reinstall the package (its wheel holds "
                "the goldens)"
            )
    path = Path(path)
    doc = _read(path)
    anchors = {"goldens": path, "cases": path}
    layered = default is not None and doc.get("extends", "default") == "default" and path.resolve() != default.resolve()
    if layered:
        assert default is not None  # layered: there is a packaged default
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
            raise UsageError(
                f"{path}: impls.{name}.supports must be a list of component name patterns "
                f"(e.g. [quant.*, indexer.select]), not {supports!r}"
            )
    _check_tolerance_sections(config.tolerances, path)
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
