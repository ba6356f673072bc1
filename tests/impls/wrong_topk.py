"""Top-k implementations that differ from torch's CPU order in known ways."""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter


def lowest_index_topk(values: torch.Tensor, k: int, largest: bool = True):
    """Sorted by value, ties broken by the lowest index (what CUDA radix select tends to do)."""
    v = values.double()
    nan = torch.isnan(v)
    key = (
        torch.where(nan, torch.full_like(v, float("inf")), v)
        if largest
        else torch.where(nan, torch.full_like(v, float("inf")), v)
    )
    if largest:
        order = torch.sort(-key, dim=-1, stable=True).indices
        # NaN counts above +inf when largest: put NaN first, keeping index order among them
        nan_first = torch.sort((~nan).to(torch.int8), dim=-1, stable=True).indices
        order = torch.stack(
            [
                torch.cat([r_nan[: int(n.sum())], r[~torch.isin(r, r_nan[: int(n.sum())])]])
                for r, r_nan, n in zip(order, nan_first, nan)
            ]
        )
    else:
        order = torch.sort(key, dim=-1, stable=True).indices
    idx = order[..., :k]
    return values.gather(-1, idx), idx


class LowestIndexTopk(ReferenceAdapter):
    def run(self, component, inputs, params):
        if component != "topk.torch_cpu":
            return super().run(component, inputs, params)
        values, indices = lowest_index_topk(inputs["values"], int(params["k"]), bool(params.get("largest", True)))
        return {"values": values, "indices": indices}


class DropsLarger(ReferenceAdapter):
    """Replaces the best element of each row by the (k+1)-th: a genuine miss."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "topk.torch_cpu":
            k = int(params["k"])
            values = inputs["values"]
            chosen = out["indices"].clone()
            for row in range(chosen.shape[0]):
                rest = [i for i in range(values.shape[-1]) if i not in set(chosen[row].tolist())]
                chosen[row, 0] = rest[0] if rest else chosen[row, 0]
            out["indices"] = chosen
            out["values"] = values.gather(-1, chosen)
            del k
        return out


class PermutedPairs(ReferenceAdapter):
    """An unsorted top-k (sorted=False) that returns torch's picks in another order (each row
    reversed), indices and values permuted together: a correct answer, the order is unspecified."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "topk.torch_cpu" and not params.get("sorted", True):
            out = {name: value.flip(-1).contiguous() for name, value in out.items()}
        return out


class PermutedWrongValue(PermutedPairs):
    """PermutedPairs with one value off by a step: the pair (index, value) is not the input's."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "topk.torch_cpu" and not params.get("sorted", True):
            values = out["values"].clone()
            values[0, 0] = values[0, 0] + 1 if torch.isfinite(values[0, 0]) else 0.0
            out["values"] = values
        return out


class PermutedWrongIndex(PermutedPairs):
    """PermutedPairs with one index of the first row replaced by another of that row's picks (its
    value kept): a miss, whatever the values."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "topk.torch_cpu" and not params.get("sorted", True):
            indices = out["indices"].clone()
            indices[0, 0] = indices[0, 1]
            out["indices"] = indices
        return out
