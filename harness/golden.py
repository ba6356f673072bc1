"""Golden files: one safetensors file per case, plus `MANIFEST.json` with SHA-256 per file.

Tensors are named `in.<name>` (what the implementation receives), `out.<name>` (what it must
return) and `aux.<name>` (what the comparator needs). `__metadata__` holds one JSON document under
the key `conformance` (schema version, case id, component, params, build, seed, generator and
torch versions, the policy of every output). fp4 codes and e4m3/e8m0 scales are stored as uint8.

Writes are atomic (a temporary file in the same folder, then `os.replace`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CaseSpecError, GoldenError
from .ids import check_case_id

if TYPE_CHECKING:  # torch and safetensors are imported where tensors are read or written, so that
    import torch  # reading the manifest (which cases exist) stays light

SCHEMA_VERSION = 1
MANIFEST = "MANIFEST.json"
PREFIXES = ("in.", "out.", "aux.")
REQUIRED_META = ("schema", "case_id", "component", "params", "seed", "generator", "torch", "policies")


@dataclass
class Golden:
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    aux: dict[str, torch.Tensor]
    meta: dict[str, Any]
    path: Path | None = None
    sha256: str = ""
    size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f"in.{k}": v for k, v in self.inputs.items()}
        out.update({f"out.{k}": v for k, v in self.outputs.items()})
        out.update({f"aux.{k}": v for k, v in self.aux.items()})
        return out


def golden_path(goldens_dir: Path, case_id: str) -> Path:
    """goldens/<component>/<case>.safetensors; a GoldenError for an id that is not well formed,
    so no manifest entry or case name can point outside the golden store."""
    try:
        component, case = check_case_id(case_id)
    except CaseSpecError as exc:
        raise GoldenError(str(exc)) from None
    return Path(goldens_dir) / component / f"{case}.safetensors"


def encode(golden: Golden) -> bytes:
    from safetensors.torch import save as st_save

    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in sorted(golden.tensors().items())}
    meta = json.dumps(golden.meta, sort_keys=True, separators=(",", ":"))
    return st_save(tensors, metadata={"conformance": meta})


def decode(data: bytes, where: str) -> Golden:
    from safetensors import SafetensorError
    from safetensors.torch import load as st_load

    """Parse golden bytes; every problem is a GoldenError naming `where`."""
    try:
        tensors = st_load(data)
    except (SafetensorError, Exception) as exc:  # safetensors raises several types on garbage
        raise GoldenError(
            f"{where}: not a readable safetensors file ({exc}); regenerate it with `conformance generate`"
        ) from None
    meta = _read_metadata(data, where)
    golden = Golden({}, {}, {}, meta)
    buckets = dict(zip((p.rstrip(".") for p in PREFIXES), (golden.inputs, golden.outputs, golden.aux)))
    for name, tensor in tensors.items():
        prefix, dot, rest = name.partition(".")
        bucket = buckets.get(prefix) if dot else None
        if bucket is None:
            raise GoldenError(f"{where}: tensor {name!r} has no in./out./aux. prefix")
        bucket[rest] = tensor
    if not golden.outputs:
        raise GoldenError(f"{where}: holds no out.* tensors")
    return golden


_METADATA_KEY = '"__metadata__":'
_JSON = json.JSONDecoder()


def _header_metadata(header: str) -> dict[str, Any]:
    """The header's `__metadata__` object, parsed alone where the key stands as a key of the top-level
    object (the tensors' entries, most of a chain golden's header, are left to safetensors); else the
    whole header."""
    at = header.find(_METADATA_KEY)
    if at > 0 and header[:at].rstrip()[-1:] in ("{", ","):
        try:
            value, _ = _JSON.raw_decode(header, at + len(_METADATA_KEY))
            if isinstance(value, dict):
                return value
        except ValueError:
            pass
    return json.loads(header)["__metadata__"]


def _read_metadata(data: bytes, where: str) -> dict[str, Any]:
    try:
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(_header_metadata(data[8 : 8 + header_len].decode())["conformance"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise GoldenError(f"{where}: metadata missing or not JSON ({exc})") from None
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise GoldenError(f"{where}: metadata lacks {missing}")
    if meta["schema"] != SCHEMA_VERSION:
        raise GoldenError(f"{where}: schema {meta['schema']} but this harness reads schema {SCHEMA_VERSION}")
    return meta


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; goldens are ordinary readable files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- manifest -------------------------------------------------------------------------------


def read_manifest(goldens_dir: Path, drop_invalid: bool = False) -> dict[str, dict[str, Any]]:
    """case id -> {file, sha256, size}. A missing manifest is empty; a corrupt one an error, and so
    is a key that is not a well-formed case id (`drop_invalid`: left out instead, for `generate`,
    which rewrites the manifest)."""
    path = Path(goldens_dir) / MANIFEST
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
        entries = doc["cases"]
        assert isinstance(entries, dict)
    except (ValueError, KeyError, AssertionError) as exc:
        raise GoldenError(f"{path}: not a valid manifest ({exc}); regenerate with `conformance generate`") from None
    invalid = sorted(key for key in entries if not _valid_id(key))
    if invalid and not drop_invalid:
        raise GoldenError(
            f"{path}: key(s) {invalid[:5]} are not case ids <component>/<case>; the manifest was edited "
            "or corrupted: restore it from git or run `conformance generate`"
        )
    return {k: v for k, v in entries.items() if k not in invalid}


def _valid_id(case_id: str) -> bool:
    try:
        check_case_id(case_id)
    except CaseSpecError:
        return False
    return True


def write_manifest(goldens_dir: Path, entries: dict[str, dict[str, Any]]) -> None:
    doc = {"schema": SCHEMA_VERSION, "cases": dict(sorted(entries.items()))}
    write_atomic(Path(goldens_dir) / MANIFEST, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def manifest_entry(goldens_dir: Path, case_id: str, data: bytes) -> dict[str, Any]:
    rel = golden_path(Path("."), case_id).as_posix()
    return {"file": rel, "sha256": sha256(data), "size": len(data)}


def load_verified(
    goldens_dir: Path, case_id: str, manifest: dict[str, dict[str, Any]], generate: str = "conformance generate"
) -> Golden:
    """Read one golden and check it against its manifest entry and the schema; `generate` is the
    command that builds this tier's goldens (named when the file is missing)."""
    path = golden_path(goldens_dir, case_id)
    entry = manifest.get(case_id)
    if not path.exists():
        pinned = " (MANIFEST.json pins its SHA-256, so the build is checked)" if entry else ""
        raise GoldenError(
            f"{path}: golden missing for {case_id}; build it with `{generate} --select '{case_id}'`{pinned}"
        )
    data = path.read_bytes()
    if entry is None:
        raise GoldenError(f"{path}: not listed in {MANIFEST}; regenerate with `conformance generate` so it is hashed")
    digest = sha256(data)
    if digest != entry.get("sha256"):
        raise GoldenError(
            f"{path}: SHA-256 {digest[:12]}… does not match {MANIFEST} ({str(entry.get('sha256'))[:12]}…): "
            "the file is corrupt or was edited by hand; restore it from git or run `conformance generate`"
        )
    golden = decode(data, str(path))
    if golden.meta.get("case_id") != case_id:
        raise GoldenError(f"{path}: metadata says case {golden.meta.get('case_id')!r}, expected {case_id!r}")
    golden.path, golden.sha256, golden.size = path, digest, len(data)
    return golden


def discover(goldens_dir: Path) -> list[str]:
    """Case ids of golden files present on disk."""
    root = Path(goldens_dir)
    ids = []
    for path in sorted(root.glob("*/*.safetensors")):
        case_id = f"{path.parent.name}/{path.name[: -len('.safetensors')]}"
        if _valid_id(case_id):
            ids.append(case_id)
    return ids
