"""Golden generation, the drift check, and verification.

`generate` runs every selected case through the reference serially (one process, so files and
the manifest are written once each, atomically) and writes `goldens/<component>/<case>.safetensors`
and `goldens/MANIFEST.json`. Before a golden is written, its comparison policies must prove they
reject trivial wrong answers: all zeros, the input copied, the reference scaled by (1 + 2^-6), and
the previous case's golden, each where it differs from the reference. `check` regenerates in
memory and reports drift against the frozen files without writing. `verify` checks every file
against the manifest and the schema.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import __version__
from .cases import CaseSpec, load_cases
from .compare import compare_output
from .config import Config
from .errors import GoldenError, HarnessError, UsageError
from .golden import (
    MANIFEST,
    SCHEMA_VERSION,
    Golden,
    decode,
    discover,
    encode,
    golden_path,
    load_verified,
    manifest_entry,
    read_manifest,
    sha256,
    write_atomic,
    write_manifest,
)
from . import cache, regenerated
from .registry import Component
from .known import get
from .runner import golden_context
from .stepnames import step_name, step_of

SCALE = 1.0 + 2.0**-6


class GenerationError(HarnessError):
    """A case could not be generated, or its policy accepts a trivial wrong answer."""


@dataclass
class GenerateReport:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    drift: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.drift and not self.errors


def build_golden(spec: CaseSpec, config: Config) -> Golden:
    """Run one case through the reference and assemble its golden (not yet written)."""
    component = get(spec.component)
    inputs = component.build(dict(spec.params), dict(spec.build), spec.generator())
    missing = [t.name for t in component.inputs if not t.when and t.name not in inputs]
    if missing:
        raise GenerationError(f"{spec.id}: input builder did not produce {missing}")
    frozen = {k: v.clone() for k, v in inputs.items()}
    # The reference also returns its intermediates (it is an implementation too); a golden holds
    # what judges them (their row digests, or the values themselves), never as outputs to return.
    outputs, aux = component.reference_golden(inputs, spec.params)
    regenerate = list(spec.build.get("regenerate") or [])
    unknown = [n for n in regenerate if n not in frozen]
    if unknown:
        raise GenerationError(
            f"{spec.id}: build.regenerate names {unknown}, not inputs of {spec.component} ({sorted(frozen)})"
        )
    # One entry per declared output: step outputs `sNN.rows` share the policy of `rows`.
    declared = {component.output_spec(name).name: tensor.dtype for name, tensor in sorted(outputs.items())}
    policies = {name: config.policy(component, name, dtype=dtype).to_json() for name, dtype in sorted(declared.items())}
    meta = {
        "schema": SCHEMA_VERSION,
        "case_id": spec.id,
        "component": spec.component,
        "params": spec.params,
        "build": spec.build,
        "seed": spec.seed,
        "generator": f"v41-conformance {__version__}",
        "torch": torch.__version__.split("+")[0],
        "policies": policies,
        "tensors": {f"out.{k}": _describe(v) for k, v in sorted(outputs.items())},
        "upstream": component.upstream,
    }
    if component.notes:
        meta["notes"] = component.notes
    if regenerate:
        meta["regenerated_inputs"] = {n: regenerated.describe(frozen[n]) for n in sorted(regenerate)}
    golden = Golden({k: v for k, v in frozen.items() if k not in regenerate}, outputs, aux, meta)
    golden.extra["all_inputs"] = frozen
    return golden


def _describe(t: torch.Tensor) -> dict:
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}


def discrimination_problems(
    component: Component, golden: Golden, neighbour: Golden | None, config: Config
) -> list[str]:
    """Trivial wrong answers that a tolerance policy would accept (must be empty)."""
    problems = []
    params = golden.meta["params"]
    context = golden_context(golden)
    for name in _representatives(golden.outputs):
        expected = golden.outputs[name]
        policy = config.policy(component, name, dtype=expected.dtype)
        for label, wrong in _wrong_answers(name, expected, golden, neighbour):
            if (
                wrong.dtype != expected.dtype
                or wrong.shape != expected.shape
                or torch.equal(_bits(wrong), _bits(expected))
            ):
                continue
            verdict = compare_output(name, expected, wrong, policy, context, params)
            if verdict.ok:
                problems.append(f"output '{name}' accepts {label} under {policy.describe()}")
    return problems


def _representatives(outputs: dict) -> list[str]:
    """The outputs whose policy is tried against trivial wrong answers: every output of a call, and of
    a schedule the first and the last step's (the steps between have the same outputs and policies)."""
    steps: dict[str, list[int]] = {}
    names = []
    for name in sorted(outputs):
        step = step_of(name)
        if step is None:
            names.append(name)
        else:
            steps.setdefault(name.split(".", 1)[1], []).append(step)
    names += [step_name(step, rest) for rest, seen in steps.items() for step in sorted({min(seen), max(seen)})]
    return sorted(names)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.is_floating_point else t


def _wrong_answers(name: str, expected: torch.Tensor, golden: Golden, neighbour: Golden | None):
    yield "all zeros", torch.zeros_like(expected)
    for in_name, tensor in sorted((golden.extra.get("all_inputs") or golden.inputs).items()):
        if tensor.shape == expected.shape and tensor.dtype == expected.dtype:
            yield f"the input '{in_name}' copied", tensor
            break
    if expected.dtype.is_floating_point:
        yield "the reference times (1 + 2^-6)", (expected.double() * SCALE).to(expected.dtype)
    if neighbour is not None and name in neighbour.outputs:
        yield f"the golden of {neighbour.meta['case_id']}", neighbour.outputs[name]


def generate(
    config: Config,
    select: list[str] | None = None,
    check: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> GenerateReport:
    specs = load_cases(config.cases, select)
    report = GenerateReport()
    manifest = read_manifest(config.goldens, drop_invalid=True)  # invalid keys are dropped, never followed
    try:
        read_manifest(config.goldens)
        rewrite = False
    except GoldenError:  # a key that is no case id: the manifest is rewritten without it
        rewrite = True
    new_manifest = dict(manifest)
    neighbours: dict[str, Golden] = {}
    code = cache.source_digest() if config.tier != "small" and not check else ""
    for i, spec in enumerate(specs):
        if progress:
            progress(i, len(specs), spec.id)
        if code and _from_cache(config, spec.id, manifest.get(spec.id), code):
            report.unchanged.append(spec.id)
            continue
        try:
            golden = build_golden(spec, config)
            component = get(spec.component)
            problems = discrimination_problems(component, golden, neighbours.get(spec.component), config)
            if problems:
                raise GenerationError(
                    f"{spec.id}: the comparison policy is too loose: "
                    + "; ".join(problems)
                    + ". Tighten tolerances in conformance.yaml."
                )
            neighbours[spec.component] = golden
            data = encode(golden)
        except HarnessError as exc:
            report.errors[spec.id] = str(exc)
            continue
        except Exception as exc:  # a bug in a reference or builder: name the case
            report.errors[spec.id] = f"{spec.id}: reference raised {type(exc).__name__}: {exc}"
            continue
        path = golden_path(config.goldens, spec.id)
        if check:
            drift = _drift(path, data, golden, manifest.get(spec.id))
            if drift:
                report.drift[spec.id] = drift
            else:
                report.unchanged.append(spec.id)
            continue
        if path.exists() and path.read_bytes() == data:
            report.unchanged.append(spec.id)
        else:
            _writing(path, lambda: write_atomic(path, data))
            report.written.append(spec.id)
        new_manifest[spec.id] = manifest_entry(config.goldens, spec.id, data)
        if code:
            cache.write(CACHE_KIND, new_manifest[spec.id]["sha256"], data, cache.keyed(spec.id, code))
    if progress:
        progress(len(specs), len(specs), "")
    known = {s.id for s in specs}
    if not select:
        stale = sorted((set(manifest) | set(discover(config.goldens))) - known)
        for case_id in stale:
            if check:
                report.drift[case_id] = "golden exists but no case spec produces it any more"
                continue
            path = golden_path(config.goldens, case_id)  # ids are validated: always inside the store
            if path.exists():
                _writing(path, path.unlink)
            new_manifest.pop(case_id, None)
            report.removed.append(case_id)
    if not check and (report.written or report.removed or new_manifest != manifest or rewrite):
        changed = {k: v for k, v in new_manifest.items() if manifest.get(k) != v}
        _writing(config.goldens / "MANIFEST.json", lambda: _merge_manifest(config, changed, set(report.removed)))
    return report


CACHE_KIND = "goldens"


def _from_cache(config: Config, case_id: str, entry: dict | None, code: str) -> bool:
    """A locally built tier's golden restored from the cache: only the bytes this very code built
    before for this case (keyed by the case id and the harness's source digest) and only when
    they are what MANIFEST.json pins. True when the file is in place."""
    if entry is None:
        return False
    cached = cache.read(CACHE_KIND, str(entry.get("sha256")), cache.keyed(case_id, code))
    if cached is None:
        return False
    data = bytes(cached)
    path = golden_path(config.goldens, case_id)
    if not (path.exists() and path.read_bytes() == data):
        _writing(path, lambda: write_atomic(path, data))
    return True


def _writing(path, write: Callable[[], None]) -> None:
    """Run `write`; a golden store that cannot be written is a usage error naming the path."""
    try:
        write()
    except OSError as exc:
        raise UsageError(
            f"cannot write {path}: {exc.strerror or exc}; `conformance generate` needs a writable "
            "golden store (check its permissions, or point `goldens:` in conformance.yaml elsewhere)"
        ) from None


def _merge_manifest(config: Config, changed: dict, removed: set[str]) -> None:
    """Apply this run's entries to the manifest as it is on disk now, under a file lock, so two
    `generate --select` runs over different components never drop each other's entries."""
    import fcntl

    config.goldens.mkdir(parents=True, exist_ok=True)
    with open(config.goldens / ".manifest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = read_manifest(config.goldens, drop_invalid=True)
        current.update(changed)
        for case_id in removed:
            current.pop(case_id, None)
        write_manifest(config.goldens, current)


def _drift(path, data: bytes, golden: Golden, entry: dict | None = None) -> str:
    if not path.exists():  # a tier built locally: the manifest's SHA-256 is the record
        if entry is None:
            return f"{path}: no frozen golden and no manifest entry (run `conformance generate`)"
        digest = sha256(data)
        return (
            ""
            if digest == entry.get("sha256")
            else (f"rebuilt SHA-256 {digest[:12]}… differs from MANIFEST.json's {str(entry.get('sha256'))[:12]}…")
        )
    old_bytes = path.read_bytes()
    if old_bytes == data:
        return ""
    try:
        old = decode(old_bytes, str(path))
    except GoldenError as exc:
        return str(exc)
    lines = []
    new_tensors, old_tensors = golden.tensors(), old.tensors()
    for name in sorted(set(new_tensors) | set(old_tensors)):
        if name not in old_tensors:
            lines.append(f"{name}: new tensor")
        elif name not in new_tensors:
            lines.append(f"{name}: no longer produced")
        else:
            a, b = new_tensors[name], old_tensors[name]
            if a.dtype != b.dtype or a.shape != b.shape:
                lines.append(f"{name}: {b.dtype}{list(b.shape)} -> {a.dtype}{list(a.shape)}")
            elif not torch.equal(_bits(a.contiguous()), _bits(b.contiguous())):
                differ = int((_bits(a.contiguous()) != _bits(b.contiguous())).sum())
                lines.append(f"{name}: {differ} element byte(s) differ")
    new_meta = json.loads(json.dumps(golden.meta))  # tuples -> lists, as the file holds them
    for key in sorted(set(new_meta) | set(old.meta)):
        if key in ("torch", "generator"):
            continue
        if new_meta.get(key) != old.meta.get(key):
            lines.append(f"metadata '{key}' changed")
    return "; ".join(lines) or "bytes differ (tensor order or encoding)"


def verify(config: Config) -> dict[str, str]:
    """case id -> problem, for every golden that fails the manifest or schema check."""
    problems: dict[str, str] = {}
    try:
        manifest = read_manifest(config.goldens)
    except GoldenError as exc:  # report it, then check what is valid
        problems[MANIFEST] = str(exc)
        manifest = read_manifest(config.goldens, drop_invalid=True)
    for case_id in sorted(set(manifest) | set(discover(config.goldens))):
        try:
            golden = load_verified(config.goldens, case_id, manifest, config.generate_command)
            component = get(golden.meta["component"])
            regenerated.restore(golden, component)
            names = set(component.output_names(golden.meta["params"]))
            if component.expected_outputs is None and names != set(golden.outputs):
                raise GoldenError(
                    f"{golden.path}: outputs {sorted(golden.outputs)} but {component.name} declares {sorted(names)}"
                )
            missing_in = [t.name for t in component.inputs if not t.when and t.name not in golden.inputs]
            if missing_in:
                raise GoldenError(f"{golden.path}: lacks input(s) {missing_in}")
        except (GoldenError, KeyError) as exc:
            problems[case_id] = str(exc).strip("'\"")
    return problems


def print_progress(stream=sys.stderr) -> Callable[[int, int, str], None]:
    """A progress line a terminal user sees move (one line per 10% when not a terminal)."""
    tty = stream.isatty()
    last = [-1]

    def show(done: int, total: int, case_id: str) -> None:
        if tty:
            stream.write(f"\r[{done}/{total}] {case_id[:70]:<70}")
            if done == total:
                stream.write("\n")
        else:
            decile = (10 * done) // max(total, 1)
            if decile != last[0]:
                last[0] = decile
                stream.write(f"[{done}/{total}] {case_id}\n")
        stream.flush()

    return show


__all__ = ["generate", "verify", "build_golden", "GenerateReport", "GenerationError"]
