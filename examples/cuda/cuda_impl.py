"""CUDA C++ kernels (examples/cuda/fp4_quant.cu) reached through ctypes: a CUDA port under test.

Run it on a GPU machine with nvcc:
    conformance run --device cuda --impl examples/cuda/cuda_impl.py:CudaImpl --select 'quant.e2m1/*,quant.fp4_*'

`prepare()` (called once by `conformance run` before any worker starts) compiles the source
with nvcc into examples/cuda/build/<hash>/ (build.py: cached by source, flags and nvcc
version); every worker then only loads the library. `run()` passes the device pointers of the
CUDA tensors the device adapter hands it, the device index and torch's current stream; the
adapter synchronises after the call, so an asynchronous fault is charged to this case.

Only meaningful with `--device cuda`: on CPU tensors `run()` raises and says so.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def _load_build_module():
    spec = importlib.util.spec_from_file_location("conformance_cuda_example_build", HERE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_library(path: Path) -> ctypes.CDLL:
    """Open the built library and declare the launchers' C signatures."""
    lib = ctypes.CDLL(str(path))
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int
    for name in ("conformance_fp4_e8m0", "conformance_fp4_e4m3"):
        fn = getattr(lib, name)
        fn.argtypes = [i32, ptr, ptr, ptr, ptr, i64, ptr]  # device, x, y, codes, scale_bytes, n, stream
        fn.restype = i32
    lib.conformance_e2m1.argtypes = [i32, ptr, ptr, ptr, i64, ptr]  # device, v, codes, y, n, stream
    lib.conformance_e2m1.restype = i32
    lib.conformance_fp4_host.argtypes = [i32, ptr, ptr, ptr, ptr, i64]  # e4m3, x, y, codes, scale_bytes, n
    lib.conformance_fp4_host.restype = i32
    lib.conformance_e2m1_host.argtypes = [ptr, ptr, ptr, i64]
    lib.conformance_e2m1_host.restype = None
    lib.conformance_cuda_error_string.argtypes = [i32]
    lib.conformance_cuda_error_string.restype = ctypes.c_char_p
    return lib


class CudaImpl:
    """quant.e2m1, quant.fp4_e8m0 and quant.fp4_e4m3 as CUDA kernels."""

    COMPONENTS = ("quant.e2m1", "quant.fp4_e8m0", "quant.fp4_e4m3")
    BLOCKS = {"quant.fp4_e8m0": 32, "quant.fp4_e4m3": 16}

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None

    def prepare(self) -> None:
        """Build the shared library once (a no-op when the cached build is current)."""
        _load_build_module().build()

    def supports(self, component: str) -> bool:
        return component in self.COMPONENTS

    def _library(self) -> ctypes.CDLL:
        if self._lib is None:  # a worker: load the build prepare() left (or build it now)
            self._lib = load_library(_load_build_module().build())
        return self._lib

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            text = self._library().conformance_cuda_error_string(rc).decode()
            raise RuntimeError(f"{what} launch failed: CUDA error {rc} ({text})")

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
        if component not in self.COMPONENTS:
            raise ValueError(f"CudaImpl does not implement {component!r}; supported: {', '.join(self.COMPONENTS)}")
        x = inputs["v"] if component == "quant.e2m1" else inputs["x"]
        if x.device.type != "cuda":
            raise RuntimeError(
                f"CudaImpl runs CUDA kernels and got a {x.device.type} tensor: "
                "use `conformance run --device cuda` on a GPU machine"
            )
        lib = self._library()
        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
        stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
        if component == "quant.e2m1":
            v = x.float().contiguous()
            codes = torch.empty(v.shape, dtype=torch.uint8, device=v.device)
            y = torch.empty(v.shape, dtype=torch.float32, device=v.device)
            self._check(
                lib.conformance_e2m1(device, v.data_ptr(), codes.data_ptr(), y.data_ptr(), v.numel(), stream), component
            )
            return {"codes": codes, "y": y}
        block = self.BLOCKS[component]
        if x.dtype != torch.bfloat16 or x.shape[-1] % block:
            raise ValueError(
                f"{component}: wants bf16 [..., D] with D a multiple of {block}; got {x.dtype} {tuple(x.shape)}"
            )
        x = x.contiguous()
        y = torch.empty_like(x)
        codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        scale_bytes = torch.empty((*x.shape[:-1], x.shape[-1] // block), dtype=torch.uint8, device=x.device)
        launch = lib.conformance_fp4_e4m3 if component == "quant.fp4_e4m3" else lib.conformance_fp4_e8m0
        self._check(
            launch(device, x.data_ptr(), y.data_ptr(), codes.data_ptr(), scale_bytes.data_ptr(), x.numel(), stream),
            component,
        )
        return {"y": y, "codes": codes, "scale_bytes": scale_bytes}
