"""`topk.torch_cpu`: torch's CPU top-k, tie order included (libstdc++ introselect/partial_sort).

Upstream selects with CPU `torch.topk` (M:578-580 indexer, M:607 candidate blocks). Which tied
elements come back, and in what order, is decided by libstdc++'s algorithms; the reference
reproduces them (`v41_conformance.reference.topk`, docs/topk-tie-order.md). An implementation that picks
other tied elements is told so: its differing rows are classified `tie` (every differing id ties
with the k-th score) or `miss`.

The indices are compared position by position (`order="sequence"`): this component pins torch's
exact order, including the algorithmic order of `sorted=False` on the nth_element branch.
"""

from __future__ import annotations

import torch

from ..errors import CaseSpecError
from ..reference.topk import torch_cpu_topk
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from .build import dtype_of, need
from ..reference.numerics import randn

NINF = float("-inf")


def _topk_inputs(params, build, gen):
    rows, n = (int(v) for v in need(build, "shape", "topk.torch_cpu"))
    kind = build.get("kind", "gauss_bf16")
    shape = (rows, n)
    if kind == "gauss_bf16":  # bf16-quantised Gaussians: ties from the 8-bit mantissa
        x = randn(shape, generator=gen).to(torch.bfloat16).float()
    elif kind == "few_values":
        pool = torch.tensor([float(v) for v in build.get("pool", [0.0, 1.0, 2.0])])
        x = pool[torch.randint(len(pool), shape, generator=gen)]
    elif kind == "all_ninf":
        x = torch.full(shape, NINF)
    elif kind == "ninf_scattered":  # mostly -inf with a few finite (the masked indexer rows)
        x = torch.full(shape, NINF)
        keep = torch.rand(shape, generator=gen) < float(build.get("finite_fraction", 0.05))
        x[keep] = randn(shape, generator=gen)[keep].to(torch.bfloat16).float()
    elif kind == "relu_zeros":  # ReLU zeros: many exact ties at 0 and a positive tail
        x = torch.relu(randn(shape, generator=gen) - float(build.get("shift", 1.0))).to(torch.bfloat16).float()
    elif kind == "special":  # NaN, +-inf, +-0 sprinkled over small integers
        pool = torch.tensor([float("nan"), float("inf"), NINF, 0.0, -0.0, 1.0, 2.0, -1.0])
        x = pool[torch.randint(len(pool), shape, generator=gen)]
    elif kind == "distinct":
        x = torch.randperm(rows * n, generator=gen).reshape(shape).float()
    else:
        raise CaseSpecError(f"topk.torch_cpu: unknown build kind {kind!r}")
    return {"values": x.to(dtype_of(build.get("dtype", "f32")))}


def _topk_reference(inputs, params):
    values, indices = torch_cpu_topk(inputs["values"], int(params["k"]), dim=-1,
                                     largest=bool(params.get("largest", True)), sorted=bool(params.get("sorted", True)))
    return {"values": values, "indices": indices}


register(Component(
    name="topk.torch_cpu",
    summary="torch CPU top-k values and indices in torch's order (k*64 <= n: partial_sort; else nth_element)",
    upstream="M:578-580, M:607; aten TopKImpl.h",
    inputs=(T("values", "f32|bf16|f16", "rows n"),),
    outputs=(OutputSpec("values", "exact", "the selected values, in torch's order", "as values", "rows k"),
             OutputSpec("indices", "index", "ids in torch's order (sorted: by value; unsorted: the algorithm's)",
                        "int64", "rows k", scores="in.values", order="sequence")),
    params=(P("k", "int", "how many to select"),
            P("largest", "bool", "the k largest (else the smallest)", required=False, default=True),
            P("sorted", "bool", "return them sorted (else in the algorithm's order)", required=False, default=True)),
    dims={"rows": "independent rows", "n": "candidates per row", "k": "params.k"},
    build=_topk_inputs,
    reference=_topk_reference,
    floor=6,
))
