"""Case specs: `cases/<component>.yaml` files, expanded into concrete cases with stable ids.

File format::

    component: quant.e2m1
    defaults:            # optional, merged under every case
      params: {...}
      build: {...}
    cases:
      - name: midpoints  # the case part of the id
        params: {...}    # passed to the reference and to the implementation
        build: {...}     # only for the input builder (distribution, shape, edge values)

Inputs are derived deterministically from the case id: the seed is the first 8 bytes of the
SHA-256 of the id, so renaming a case changes its data and nothing else does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .errors import CaseSpecError
from .ids import make_case_id, matches, may_select
from .yamlio import safe_load

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CaseSpec:
    component: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def id(self) -> str:
        return make_case_id(self.component, self.name)

    @property
    def seed(self) -> int:
        return seed_for(self.id)

    def generator(self) -> torch.Generator:
        import torch

        gen = torch.Generator()
        gen.manual_seed(self.seed)
        return gen


def seed_for(case_id: str) -> int:
    return int.from_bytes(hashlib.sha256(case_id.encode()).digest()[:8], "little") & ((1 << 63) - 1)


DECLARED = re.compile(r"^component:[ \t]*([\w.]+)[ \t]*(?:#.*)?$", re.MULTILINE)


def load_case_file(path: Path, select: list[str] | None = None) -> list[CaseSpec]:
    """The cases of one file; none, unparsed, when its `component:` line names a component no case
    of which `select` can match (a one-case run reads one case file, not all of them)."""
    text = path.read_text()
    declared = DECLARED.search(text)
    if select and declared and not may_select(declared.group(1), select):
        return []
    try:
        doc = safe_load(text)
    except yaml.YAMLError as exc:
        raise CaseSpecError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or "component" not in doc or "cases" not in doc:
        raise CaseSpecError(f"{path}: expected a mapping with 'component' and 'cases'")
    component = doc["component"]
    defaults = doc.get("defaults") or {}
    if not isinstance(doc["cases"], list):
        raise CaseSpecError(f"{path}: 'cases' must be a list")
    specs = []
    for i, entry in enumerate(doc["cases"]):
        where = f"{path}: cases[{i}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise CaseSpecError(f"{where}: each case needs a 'name'")
        unknown = set(entry) - {"name", "params", "build", "note"}
        if unknown:
            raise CaseSpecError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: name, params, build, note")
        params = {**(defaults.get("params") or {}), **(entry.get("params") or {})}
        build = {**(defaults.get("build") or {}), **(entry.get("build") or {})}
        specs.append(CaseSpec(component, str(entry["name"]), params, build, source=where))
    return specs


def concrete_specs(spec: CaseSpec, component) -> list[CaseSpec]:
    """A case file entry as the cases it stands for: expanded by its component (one per schedule,
    say), every param in its declared type (the YAML literal's spelling no longer matters)."""
    expand = component.extra.get("expand")
    return [
        dataclasses.replace(c, params=component.typed_params(c.params, c.source))
        for c in (expand(spec) if expand else [spec])
    ]


def load_cases(cases_dir: Path, select: list[str] | None = None) -> list[CaseSpec]:
    """Every case of every file, expanded by its component, in a stable order."""
    from .known import components

    registry = components()
    specs: list[CaseSpec] = []
    seen: dict[str, str] = {}
    for path in sorted(Path(cases_dir).glob("*.yaml")):
        for spec in load_case_file(path, select):
            if spec.component not in registry:
                raise CaseSpecError(
                    f"{spec.source}: unknown component {spec.component!r}; known: {', '.join(sorted(registry))}"
                )
            for concrete in concrete_specs(spec, registry[spec.component]):
                case_id = concrete.id
                if case_id in seen:
                    raise CaseSpecError(f"{concrete.source}: duplicate case id {case_id} (first in {seen[case_id]})")
                seen[case_id] = concrete.source
                specs.append(concrete)
    return [s for s in specs if matches(s.id, select or [])]
