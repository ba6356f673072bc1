"""The reference, but each case first initialises the CUDA driver (`libcuda.so.1`, the stand-in of
tests/test_cuda_fork.py) as a GPU implementation's first CUDA call does, and fails as torch does if it cannot."""

from __future__ import annotations

import ctypes

from v41_conformance.adapters.reference import ReferenceAdapter


class InitialisesCuda(ReferenceAdapter):
    def run(self, component, inputs, params):
        code = ctypes.CDLL("libcuda.so.1").cuInit(0)
        if code != 0:
            raise RuntimeError(f"CUDA error: initialization error (cuInit returned {code})")
        return super().run(component, inputs, params)
