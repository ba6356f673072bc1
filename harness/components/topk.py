"""`topk.torch_cpu`: torch's CPU top-k, tie order included (libstdc++ introselect/partial_sort).

Upstream selects with CPU `torch.topk` (M:578-580 indexer, M:607 candidate blocks). Which tied
elements come back, and in what order, is decided by libstdc++'s algorithms; the reference
reproduces them (`v41_conformance.reference.topk`, docs/topk-tie-order.md). An implementation that picks
other tied elements is told so: its differing rows are classified `tie` (every differing id ties
with the k-th score) or `miss`.

The indices are compared position by position (`order="sequence"`) where `sorted` is true. With
`sorted=False` the order of the k picks is unspecified (torch's is the algorithm's, on the
nth_element branch): the picks are judged as the set of (index, value) pairs returned, in any order
(`_in_your_order`), unless the implementation promises torch's order (`strict_topk_order: true`).
"""

from __future__ import annotations

import torch

from ..errors import CaseSpecError
from ..reference.topk import torch_cpu_topk
from ..reference.topk_adversary import TARGETS, antiqsort_keys
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
    elif kind == "adversarial":  # McIlroy's adversary: introselect / introsort run out of depth
        x = _adversarial_rows(params, build, rows, n)
    else:
        raise CaseSpecError(f"topk.torch_cpu: unknown build kind {kind!r}")
    return {"values": x.to(dtype_of(build.get("dtype", "f32")))}


def _adversarial_rows(params, build, rows, n):
    """[rows, n] f32, every row the one row `topk_adversary.antiqsort_keys` plays for this case's k and
    sorted (`target`: select exhausts __introselect's depth, sort the std::sort's), its keys divided by
    `tie_step` (ties: the fallback's choice among equal keys shows in the indices), negated for
    largest; as values that the case's dtype holds exactly, so no rounding merges two keys
    (`_exact_levels`)."""
    target, tie_step = build.get("target", "select"), int(build.get("tie_step", 1))
    if target not in TARGETS or tie_step < 1:
        raise CaseSpecError(
            f"topk.torch_cpu: adversarial rows need target in {TARGETS} and tie_step >= 1, got {target!r}, {tie_step}"
        )
    k = int(params["k"])
    if not 1 <= k <= n:
        raise CaseSpecError(f"topk.torch_cpu: adversarial rows need 1 <= k <= n, got k={k}, n={n}")
    keys = torch.tensor(antiqsort_keys(n, k, bool(params.get("sorted", True)), target)) // tie_step
    levels = _exact_levels(keys, dtype_of(build.get("dtype", "f32")))
    row = -levels if params.get("largest", True) else levels  # small key = picked first
    return row.expand(rows, n).clone()


_ONE_BITS = {torch.bfloat16: 0x3F80, torch.float16: 0x3C00}  # the bit pattern of 1.0
_INF_BITS = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}
# Integers each dtype holds exactly (f64 too is built through f32 here, hence f32's bound).
_EXACT_INTEGERS = {torch.bfloat16: 256, torch.float16: 2048, torch.float32: 1 << 24, torch.float64: 1 << 24}


def _exact_levels(keys, dtype):
    """f32 values increasing with the int64 `keys` (>= 0), exact in `dtype`: the keys themselves where it
    holds them all as integers, else its consecutive finite values from 1.0 up (bit patterns)."""
    top = int(keys.max()) if keys.numel() else 0
    if top <= _EXACT_INTEGERS[dtype]:
        return keys.float()
    if _ONE_BITS[dtype] + top >= _INF_BITS[dtype]:
        raise CaseSpecError(f"topk.torch_cpu: {top + 1} adversarial levels do not fit {dtype}; use fewer elements")
    return (keys + _ONE_BITS[dtype]).to(torch.int16).view(dtype).float()


def _topk_reference(inputs, params):
    values, indices = torch_cpu_topk(
        inputs["values"],
        int(params["k"]),
        dim=-1,
        largest=bool(params.get("largest", True)),
        sorted=bool(params.get("sorted", True)),
    )
    return {"values": values, "indices": indices}


def _in_your_order(expected, actual, params, policy_of):
    """An unsorted top-k's reference (index, value) pairs in the implementation's order: each pair
    where the implementation returned its index, the pairs it did not return in the slots left (in
    the reference's order). A permutation of the reference's pairs is then exact; a wrong value
    differs at its index, a wrong index is a miss (or tie order, judged on the sets); the values of
    tied picks are equal wherever they sit. None where the order is specified (sorted, or
    strict_topk_order) or the indices are not comparable (their own verdict says why)."""
    if params.get("sorted", True) or policy_of("indices").strict_order:
        return None
    ids, want = actual.get("indices"), expected["indices"]
    if (
        not (
            isinstance(ids, torch.Tensor)
            and ids.dtype == want.dtype
            and ids.shape == want.shape
            and ids.device.type == "cpu"
        )
        or want.numel() == 0
        or torch.equal(ids, want)
    ):
        return None
    k = want.shape[-1]
    order = torch.arange(k).expand(want.shape).clone()
    for row, (mine, theirs) in enumerate(zip(ids.reshape(-1, k).tolist(), want.reshape(-1, k).tolist())):
        if mine != theirs:
            order.view(-1, k)[row] = torch.tensor(_alignment(mine, theirs))
    return (
        {"indices": want.gather(-1, order), "values": expected["values"].gather(-1, order)},
        "sorted: false leaves the order unspecified: judged as the set of (index, value) pairs, the reference's "
        "put in your order (strict_topk_order: true judges torch's order)",
    )


def _alignment(mine: list[int], theirs: list[int]) -> list[int]:
    """For each slot of `mine`, the slot of `theirs` holding the same index (each used once), the
    rest in order."""
    where = {index: slot for slot, index in reversed(list(enumerate(theirs)))}
    used = [False] * len(theirs)
    picks = []
    for index in mine:
        slot = where.get(index)
        picks.append(slot if slot is not None and not used[slot] else None)
        if slot is not None:
            used[slot] = True
    rest = iter(slot for slot, taken in enumerate(used) if not taken)
    return [slot if slot is not None else next(rest) for slot in picks]


register(
    Component(
        name="topk.torch_cpu",
        summary="torch CPU top-k values and indices in torch's order (k*64 <= n: partial_sort; else nth_element)",
        upstream="M:578-580, M:607; aten TopKImpl.h",
        inputs=(T("values", "f32|bf16|f16", "rows n"),),
        outputs=(
            OutputSpec("values", "exact", "the selected values, in the order of indices", "as values", "rows k"),
            OutputSpec(
                "indices",
                "index",
                "ids in torch's order (sorted: by value); unsorted: any order, judged as (index, value) pairs",
                "int64",
                "rows k",
                scores="in.values",
                order="sequence",
            ),
        ),
        params=(
            P("k", "int", "how many to select"),
            P("largest", "bool", "the k largest (else the smallest)", required=False, default=True),
            P("sorted", "bool", "return them sorted (else in the algorithm's order)", required=False, default=True),
        ),
        dims={"rows": "independent rows", "n": "candidates per row", "k": "params.k"},
        build=_topk_inputs,
        reference=_topk_reference,
        unordered=_in_your_order,
        floor=6,
    )
)
