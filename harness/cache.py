"""A local cache of bytes that are expensive to rebuild, keyed and checked by SHA-256.

Holds the production-size inputs a golden records by hash (`v41_conformance.regenerated`) and the
production tier's goldens (`conformance generate --tier production`). Every read is verified
against its key, so a damaged or stale entry is rebuilt, never used. The cache lives in the
user's cache directory, never in a checkout:

    $CONFORMANCE_CACHE            if set (an empty value or "off" turns the cache off)
    $XDG_CACHE_HOME/v41-conformance
    ~/.cache/v41-conformance

Writes are atomic (a temporary file renamed into place), so parallel workers and concurrent
runs share it safely; a cache that cannot be written is skipped silently (it only saves time).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


NAME = "v41-conformance"


def cache_dir() -> Path | None:
    """Where the cache lives, or None when it is turned off."""
    override = os.environ.get("CONFORMANCE_CACHE")
    if override is not None:
        return None if override.strip() in ("", "off", "0") else Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / NAME


def _is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _path(kind: str, key: str) -> Path | None:
    root = cache_dir()
    if root is None or not _is_digest(key):
        return None
    return root / kind / key[:2] / key


def read(kind: str, sha256: str, key: str | None = None, verify: bool = True) -> memoryview | None:
    """The cached bytes whose SHA-256 is `sha256` (stored under `key`, by default the digest
    itself), or None when absent, unreadable or damaged. A writable buffer read straight from the
    file (no zero-filled copy first): a tensor may wrap it as is, `bytes()` of it is the data.
    `verify` false: the bytes as read, their hash unchecked (the caller checks it when it matters:
    `v41_conformance.regenerated.settle`)."""
    path = _path(kind, key or sha256)
    if path is None:
        return None
    import numpy  # here: the store's identity (every run's first step) needs no numpy

    try:
        with open(path, "rb") as fh:
            # numpy's stubs declare the buffer protocol (__buffer__) for Python >= 3.12 only
            data = memoryview(numpy.empty(os.fstat(fh.fileno()).st_size, dtype=numpy.uint8))  # type: ignore[arg-type]
            if fh.readinto(data) != len(data):
                return None
    except OSError:
        return None
    if verify and hashlib.sha256(data).hexdigest() != sha256:
        if key is None:  # bytes that are not what their name says: damaged, the next write replaces them
            try:
                path.unlink()
            except OSError:
                pass
        return None
    return data


def write(kind: str, sha256: str, data: bytes, key: str | None = None) -> bool:
    """Store `data`, whose SHA-256 must be `sha256`, under `key` (default: that digest); False
    when it could not."""
    path = _path(kind, key or sha256)
    if path is None or hashlib.sha256(data).hexdigest() != sha256:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def source_digest() -> str:
    """The SHA-256 of the harness's own Python sources: a cache entry that depends on what the
    code computes (a built golden) is keyed by it, so any change to the code misses the cache."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def keyed(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
