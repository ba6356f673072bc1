"""Top-k implementations that differ from torch's CPU order in known ways."""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter


def lowest_index_topk(values: torch.Tensor, k: int, largest: bool = True):
    """Sorted by value, ties broken by the lowest index (what CUDA radix select tends to do)."""
    v = values.double()
    nan = torch.isnan(v)
    key = torch.where(nan, torch.full_like(v, float("inf")), v) if largest else torch.where(nan, torch.full_like(v, float("inf")), v)
    if largest:
        order = torch.sort(-key, dim=-1, stable=True).indices
        # NaN counts above +inf when largest: put NaN first, keeping index order among them
        nan_first = torch.sort((~nan).to(torch.int8), dim=-1, stable=True).indices
        order = torch.stack([torch.cat([r_nan[:int(n.sum())], r[~torch.isin(r, r_nan[:int(n.sum())])]])
                             for r, r_nan, n in zip(order, nan_first, nan)])
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
