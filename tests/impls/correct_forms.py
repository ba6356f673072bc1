"""The registry of correct implementations that compute differently from the reference (the gates):
upstream's torch arithmetic, float64, the GPU-arithmetic models, every attention core, the GEMM
orders and the forms that drop one internal rounding, each with the components it can change. The fuzz of fresh cases (`benchmarks/fuzz_gates.py`)
and its smoke in the test suite (`tests/test_fuzz.py`) read it."""

from __future__ import annotations

from pathlib import Path

import attention_cores
import gemm_orders
import gpu_gates
import precise_roundings
from gate_float64 import Float64
from gate_upstream import UpstreamTorch
from wrong_attention import PlainSoftmax

IMPLS = Path(__file__).resolve().parent

CPU = {"upstream": UpstreamTorch, "float64": Float64}
CORES = {
    "PlainSoftmax": PlainSoftmax,
    **{
        name: getattr(attention_cores, name)
        for name in ("TiledFp32P", "Tiles128", "OnePassBf16P", "SinkColumn64", "SinkFactor64")
    },
}
ORDERS = {
    "Fp8K128": gemm_orders.Fp8K128,
    "BlasBf16": gemm_orders.BlasBf16,
    "Fp32Sequential": gemm_orders.Fp32Sequential,
}
# one internal rounding of the reference dropped at a time (P's is TiledFp32P's, among the cores)
PRECISE = {
    "ExactHeadDots": precise_roundings.ExactHeadDots,
    "ExactHeadProducts": precise_roundings.ExactHeadProducts,
    "ExactPooledRow": precise_roundings.ExactPooledRow,
    "ExactZ": precise_roundings.ExactZ,
}
GPU = dict(gpu_gates.GATES)
MAKERS = {**CPU, **GPU, **CORES, **ORDERS, **PRECISE}
# Where each lives, as `--impl` takes it (the command that re-creates a failure).
_FILES = {
    **{name: "gate_upstream.py" if name == "upstream" else "gate_float64.py" for name in CPU},
    **{name: "gpu_gates.py" for name in GPU},
    "PlainSoftmax": "wrong_attention.py",
    **{name: "attention_cores.py" for name in CORES if name != "PlainSoftmax"},
    **{name: "gemm_orders.py" for name in ORDERS},
    **{name: "precise_roundings.py" for name in PRECISE},
}
SPECS = {name: f"{IMPLS / _FILES[name]}:{MAKERS[name].__name__}" for name in MAKERS}
# The components a form can change (every component where it is not named): elsewhere it is the
# reference (or upstream's arithmetic), which the upstream gate already covers.
REACH = {
    **{name: ("sparse_attn", "attention") for name in CORES},
    "Fp8K128": ("linear.fp8", "attention", "indexer"),
    "Fp32Sequential": ("compressor", "attention"),
    "ExactHeadDots": ("indexer", "indexer.scores", "attention"),
    "ExactHeadProducts": ("indexer", "indexer.scores", "attention"),
    "ExactPooledRow": ("compressor", "attention"),
    "ExactZ": ("attention",),
}


def reaches(form: str, component: str) -> bool:
    """Whether `form` can compute `component` differently from the reference."""
    return component in REACH.get(form, (component,))
