"""Where the goldens, the cases and the default policies come from, and which store a run judged.

A wheel or sdist install carries the small tier in the package (`harness/_store/`: `conformance.yaml`,
`goldens/` with its manifest, `cases/`, copied in by `setup.py`); a clone or an editable install
reads the same files from the checkout. Either is the *default store*: `conformance run` in a
folder without a `conformance.yaml` judges it, and a team's `conformance.yaml` is layered on top of
its `conformance.yaml` (harness/config.py). The production tier's goldens are built on the user's
machine: beside the small tier in a checkout, in the user cache (`v41_conformance.cache`) for a package,
whose files are not the user's to write.

Every results.json records the store's identity (`identity`): the package and its version, where the
goldens came from, and the SHA-256 of their manifest; `conformance diff` and the xdist workers compare it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from pathlib import Path

from . import __version__, cache

DISTRIBUTION = "v41-conformance"
CONFIG_NAME = "conformance.yaml"
MANIFEST = "MANIFEST.json"
PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED = PACKAGE_DIR / "_store"  # what setup.py copies into a wheel or sdist install
CHECKOUT = PACKAGE_DIR.parent  # a clone, or an editable install of one
PRODUCTION = "production"


def _is_store(root: Path) -> bool:
    return (root / CONFIG_NAME).is_file() and (root / "goldens" / MANIFEST).is_file()


def default_root() -> Path | None:
    """The folder holding the default `conformance.yaml`, `goldens/` and `cases/`; None when this
    install has neither a packaged store nor a checkout around it."""
    for root in (PACKAGED, CHECKOUT):
        if _is_store(root):
            return root
    return None


def default_config() -> Path | None:
    root = default_root()
    return root / CONFIG_NAME if root is not None else None


def origin(goldens: Path) -> str:
    """`package` (the store installed with the harness), `checkout` (a clone's goldens/) or `custom`."""
    where = Path(goldens).resolve()
    for name, root in (("package", PACKAGED), ("checkout", CHECKOUT)):
        base = (root / "goldens").resolve()
        if where == base or base in where.parents:
            return name if _is_store(root) else "custom"
    return "custom"


def manifest_sha256(goldens: Path) -> str | None:
    path = Path(goldens) / MANIFEST
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def identity(goldens: Path, tier: str) -> dict:
    """What results.json records as the store it judged (and what workers must agree on)."""
    return {
        "package": DISTRIBUTION,
        "version": __version__,
        "origin": origin(goldens),
        "tier": tier,
        "manifest_sha256": manifest_sha256(goldens),
    }


def same_store(a: dict | None, b: dict | None) -> bool:
    """Two identities judge the same goldens: the same manifest bytes (and, for the packaged store,
    the same package version)."""
    if not a or not b:
        return True  # a run from before identities were recorded: nothing to compare
    keys = ("manifest_sha256", "tier") + (("version",) if "package" in (a.get("origin"), b.get("origin")) else ())
    return all(a.get(k) == b.get(k) for k in keys)


def worker_name() -> str:
    """This process as a run names it: its pytest-xdist worker id (gw0, ...) where it is one, and its host."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{worker} on {socket.gethostname()}" if worker else socket.gethostname()


def version_refusal(theirs: str) -> str:
    """Why a worker whose package version differs from the controller's judges nothing."""
    return (
        f"this worker ({worker_name()}) runs v41-conformance {__version__} but the controller runs {theirs}: "
        "refused, every case of this worker is an error; install the same version on every machine of the run"
    )


def describe(ident: dict | None) -> str:
    if not ident:
        return "an unrecorded store"
    sha = (ident.get("manifest_sha256") or "none")[:12]
    return (
        f"{ident.get('origin', '?')} store of {ident.get('package', DISTRIBUTION)} {ident.get('version', '?')} "
        f"({ident.get('tier', 'small')} tier, manifest {sha})"
    )


def production_goldens(goldens: Path) -> Path:
    """Where the production tier's goldens live for the small tier's store `goldens`: beside it in a
    checkout or a store of the user's own; in the user cache for the packaged store, under a folder
    named by the version and the pinned manifest, with the pin (MANIFEST.json) copied in."""
    from .errors import UsageError

    if origin(goldens) != "package":
        return Path(goldens) / PRODUCTION
    pin = Path(goldens) / PRODUCTION / MANIFEST
    root = cache.cache_dir()
    if root is None:
        raise UsageError(
            "the production tier of the packaged store is built into the user cache, which "
            "CONFORMANCE_CACHE turns off; set CONFORMANCE_CACHE to a writable folder, or point "
            "`goldens:` in your conformance.yaml at a store of your own"
        )
    pinned = manifest_sha256(pin.parent) or "unpinned"
    target = root / "goldens" / f"{__version__}-{pinned[:16]}" / PRODUCTION
    if pin.is_file() and not (target / MANIFEST).is_file():
        target.mkdir(parents=True, exist_ok=True)
        partial = target / f".{MANIFEST}.copy"
        shutil.copyfile(pin, partial)
        partial.replace(target / MANIFEST)
    return target
