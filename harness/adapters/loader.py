"""Resolve `--impl` into an implementation.

Accepted forms, tried in this order:
1. `reference`: the built-in reference.
2. a name under `impls:` in `conformance.yaml` (`python: target`, or `command: ...` for the
   subprocess adapter);
3. a name registered in the `conformance.impls` entry-point group;
4. `package.module:attr` or `path/to/file.py:attr`, where attr is an instance, a class (called
   with no arguments) or a factory function (called with no arguments).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .supports import matches_any, supports_patterns

ENTRY_POINT_GROUP = "conformance.impls"


@dataclass(frozen=True)
class ImplSpec:
    """Plain, picklable description of an implementation: a worker rebuilds it from this."""

    name: str
    kind: str  # "reference" | "python" | "subprocess"
    target: str = ""
    root: str = "."
    conf: dict[str, Any] = field(default_factory=dict)


def resolve(impl: str, config=None) -> ImplSpec:
    root = str(config.root) if config is not None else "."
    impls = config.impls if config is not None else {}
    if impl == "reference":
        return ImplSpec("reference", "reference", root=root, conf=impls.get("reference", {}))
    if impl in impls:
        conf = impls[impl]
        if "python" in conf:
            return ImplSpec(impl, "python", str(conf["python"]), root, conf)
        if "command" in conf:
            return ImplSpec(impl, "subprocess", "", root, conf)
        raise UsageError(f"conformance.yaml: impls.{impl} needs `python: module:attr` or `command: ...`")
    eps = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if impl in eps:
        return ImplSpec(impl, "python", eps[impl].value, root)
    if ":" in impl:
        return ImplSpec(impl, "python", impl, root)
    known = ["reference", *sorted(impls), *sorted(eps)]
    raise UsageError(
        f"unknown --impl {impl!r}. Known names: {', '.join(known)}. "
        "Or pass a Python target as package.module:attr or path/to/file.py:attr"
    )


def instantiate(spec: ImplSpec):
    """Build the implementation object a spec describes (raises UsageError on bad targets)."""
    if spec.kind == "reference":
        from .reference import ReferenceAdapter

        return ReferenceAdapter()
    if spec.kind == "python":
        impl = _check_protocol(_load_target(spec.target, Path(spec.root)), spec.target)
        patterns = supports_patterns(spec.conf, spec.name)
        return impl if patterns is None else Restricted(impl, patterns)
    if spec.kind == "subprocess":
        from .subprocess_adapter import SubprocessAdapter

        return SubprocessAdapter.from_conf(spec.name, spec.conf, Path(spec.root))
    raise UsageError(f"unknown adapter kind {spec.kind!r} for {spec.name}")


IMPORTABLE = (
    "the package must be importable from here: install it (pip install -e . in its repository), "
    "add its folder to PYTHONPATH, or point --impl at the file (path/to/module.py:attr)"
)


def locate(spec: ImplSpec) -> None:
    """Check that a Python target exists without running it (a UsageError otherwise): a typo in
    `--impl` is reported before anything heavy is imported."""
    if spec.kind != "python":
        return
    module_part, attr, path = _parse_target(spec.target, Path(spec.root))
    if path is not None:
        return
    try:
        found = importlib.util.find_spec(module_part)
    except (ImportError, ValueError) as exc:  # a parent package that is not there, or does not import
        raise UsageError(
            f"--impl {spec.target!r}: cannot import {module_part}: {type(exc).__name__}: {exc}; {IMPORTABLE}"
        ) from None
    if found is None:
        raise UsageError(f"--impl {spec.target!r}: no module named {module_part!r}; {IMPORTABLE}")


def _parse_target(target: str, root: Path) -> tuple[str, str, Path | None]:
    """(module, attr, the file for the path form else None); a UsageError for a malformed target or
    a file that is not there. The module form may sit beside the conformance.yaml that names it."""
    module_part, _, attr = target.rpartition(":")
    if not module_part or not attr:
        raise UsageError(f"--impl {target!r}: expected package.module:attr or path/to/file.py:attr")
    if not (module_part.endswith(".py") or "/" in module_part):
        if str(root) not in sys.path:  # a module beside the conformance.yaml that names it (after sys.path)
            sys.path.append(str(root))
        return module_part, attr, None
    path = Path(module_part)
    if not path.is_absolute():
        path = (Path.cwd() / path) if (Path.cwd() / path).exists() else root / path
    if not path.exists():
        raise UsageError(f"--impl {target!r}: file {module_part} not found")
    return module_part, attr, path


def _load_target(target: str, root: Path):
    module_part, attr, path = _parse_target(target, root)
    if path is not None:
        # As for a script, the file's folder is importable, so the file can import its siblings.
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"conformance_impl_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:  # a folder, foo.txt: no Python source
            raise UsageError(
                f"--impl {target!r}: {path} is not a Python source file; give a .py file "
                "(path/file.py:attr) or an importable module (package.module:attr)"
            )
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise UsageError(f"--impl {target!r}: importing {path} raised {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            mine = exc.name is not None and (module_part == exc.name or module_part.startswith(exc.name + "."))
            raise UsageError(
                f"--impl {target!r}: cannot import {module_part}: {exc}" + (f"; {IMPORTABLE}" if mine else "")
            ) from None
        except Exception as exc:
            raise UsageError(f"--impl {target!r}: cannot import {module_part}: {type(exc).__name__}: {exc}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise UsageError(f"--impl {target!r}: {module_part} has no attribute {attr!r}") from None
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "run")):
        try:
            obj = obj()
        except Exception as exc:
            raise UsageError(f"--impl {target!r}: constructing {attr} raised {type(exc).__name__}: {exc}") from None
    return obj


def _check_protocol(obj, target: str):
    missing = [m for m in ("supports", "run") if not callable(getattr(obj, m, None))]
    if missing:
        raise UsageError(
            f"--impl {target!r}: {type(obj).__name__} lacks {', '.join(missing)}(); an implementation needs "
            "supports(component) -> bool and run(component, inputs, params) -> dict of tensors"
        )
    return obj


class Restricted:
    """An implementation limited to the components its `supports:` patterns name."""

    def __init__(self, impl, patterns: list[str]):
        self.impl, self.patterns = impl, patterns

    def supports(self, component: str) -> bool:
        return matches_any(component, self.patterns) and bool(self.impl.supports(component))

    def run(self, component, inputs, params):
        return self.impl.run(component, inputs, params)

    def __getattr__(self, name):  # prepare() and the like reach the implementation
        return getattr(self.impl, name)
