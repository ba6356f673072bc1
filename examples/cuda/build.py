"""Build examples/cuda/fp4_quant.cu into a shared library with nvcc, cached by content hash.

    python examples/cuda/build.py            # build (or reuse) and print the library's path
    python examples/cuda/build.py --force    # rebuild even when a cached build exists

The cache key hashes the source, the nvcc flags and `nvcc --version`, so editing the kernel or
switching toolkits rebuilds; the library lands in examples/cuda/build/<key>/ (ignored by git),
written to a temporary name first and renamed, so concurrent builders never see half a file.

Environment: NVCC (default: `nvcc` on PATH, then /usr/local/cuda/bin/nvcc) and
CONFORMANCE_CUDA_ARCH (default sm_75: SASS for sm_75 plus compute_75 PTX, which the driver
JIT-compiles for any newer GPU; set `native` or e.g. `sm_90` on the GPU machine for a faster
start). The CUDA runtime is linked statically (nvcc's default), so loading the library needs
only the driver, not a matching libcudart.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fp4_quant.cu"
LIBRARY = "libconformance_fp4.so"
LAUNCHERS = (
    "conformance_fp4_e8m0",
    "conformance_fp4_e4m3",
    "conformance_e2m1",
    "conformance_cuda_error_string",
    "conformance_fp4_host",
    "conformance_e2m1_host",
)


class BuildError(RuntimeError):
    """nvcc is missing or the compile failed; the message carries the command and its output."""


def find_nvcc() -> str | None:
    """The nvcc to use: $NVCC, then PATH, then the usual toolkit location; None if absent."""
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def nvcc_flags() -> list[str]:
    arch = os.environ.get("CONFORMANCE_CUDA_ARCH", "sm_75")
    return ["-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-arch={arch}"]


def build(build_root: Path = HERE / "build", force: bool = False) -> Path:
    """Compile SOURCE once per (source, flags, nvcc) and return the shared library's path."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found: install the CUDA toolkit, put nvcc on PATH or set NVCC=/path/to/nvcc")
    flags = nvcc_flags()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode() + version.encode()).hexdigest()[:16]
    target = Path(build_root) / key / LIBRARY
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{LIBRARY}.{os.getpid()}.tmp")
    command = [nvcc, *flags, "-o", str(partial), str(SOURCE)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"nvcc failed (exit {proc.returncode}): {' '.join(command)}\n{proc.stdout}{proc.stderr}")
    os.replace(partial, target)
    return target


if __name__ == "__main__":
    try:
        print(build(force="--force" in sys.argv[1:]))
    except BuildError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        sys.exit(1)
