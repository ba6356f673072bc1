"""Compressor-family implementations with one deliberate bug each (and one correct float64 one),
built on the reference for everything else. tests/test_components_compressor.py runs them through
the real CLI and checks which component, case and first divergent step each one fails.
"""

from __future__ import annotations

import torch

from v41_conformance.adapters.reference import ReferenceAdapter
from patching import patched
from v41_conformance.reference import compressor as cp
from v41_conformance.reference import kv_finish as kf
from v41_conformance.reference.numerics import rms_norm


def _weights(inputs, params) -> cp.CompressorWeights:
    if int(params["ratio"]) == 1:
        return cp.CompressorWeights(wkv=inputs["wkv"], norm_w=inputs["norm_w"])
    return cp.CompressorWeights(wkv=inputs["wkv"], norm_w=inputs["norm_w"], wgate=inputs["wgate"])


def _result(rows, positions, ring):
    return {"rows": rows, "row_positions": positions, "ring": ring}


class RingOneSlotSmall(ReferenceAdapter):
    """Sizes the ring r + q_max - 2: accepts one slot too few, and runs the compressor on the
    first S - 1 slots of the ring it is given (so position p lives in slot p mod (S - 1))."""

    def run(self, component, inputs, params):
        if component == "compressor.ring" and int(params["ratio"]) == 2:
            need = int(params["ratio"]) + int(params["q_max"]) - 2
            slots = inputs["ring"].shape[1]
            return {"accepted": torch.tensor(slots >= need), "min_slots": torch.tensor(need, dtype=torch.int64)}
        if component == "compressor" and int(params["ratio"]) == 2:
            ring = inputs["ring"]
            res = cp.compressor_step(
                inputs["x"], int(params["start"]), ring[:, :-1], _weights(inputs, params), 2, check_capacity=False
            )
            return _result(res.rows, res.row_positions, torch.cat([res.ring, ring[:, -1:]], dim=1))
        return super().run(component, inputs, params)


class KeepsLiveSlotsOnly(ReferenceAdapter):
    """Frees every ring slot but the open group's at the step's end (as a port that never rolls back
    might): a rollback then reads a freed slot."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if component == "compressor" and int(params["ratio"]) == 2:
            ring = out["ring"].clone()
            live = cp.live_slots(int(params["end"]), 2, ring.shape[1])
            freed = torch.ones(ring.shape[1], dtype=torch.bool)
            freed[live] = False
            ring[:, freed, 0], ring[:, freed, 1] = float("-inf"), 0.0  # a fresh slot
            out["ring"] = ring
        return out


class EarlyPool(ReferenceAdapter):
    """Treats the end of every chunk as a group boundary: an open group is pooled over the
    positions it has so far and emitted as a row (a pair pooled before its boundary)."""

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        ratio, end = int(params.get("ratio", 2)), int(params.get("end", 0))
        if component != "compressor" or ratio != 2 or end % ratio == 0:
            return out
        open_pos = list(cp.pending_positions(end, ratio))
        group = out["ring"][:, [p % out["ring"].shape[1] for p in open_pos]]  # [b, P, 2, hd]
        pooled = cp.pool_group(group).unsqueeze(1).to(torch.bfloat16)
        row = rms_norm(pooled, inputs["norm_w"])
        out["rows"] = torch.cat([out["rows"], row], dim=1)
        out["row_positions"] = torch.cat([out["row_positions"], torch.tensor([open_pos[0]])])
        return out


def _channel_softmax_pool(group: torch.Tensor) -> torch.Tensor:
    score, latent = group[:, :, cp.SCORE], group[:, :, cp.LATENT]  # [b, r, hd]
    return (latent * score.softmax(dim=-1)).sum(dim=1)  # softmax over channels: the bug


class ChannelSoftmax(ReferenceAdapter):
    """Pools each group with a softmax over the channels instead of over the group's positions."""

    def run(self, component, inputs, params):
        if component != "compressor":
            return super().run(component, inputs, params)
        with patched(cp, "pool_group", _channel_softmax_pool):
            return super().run(component, inputs, params)


class PooledTowardZero(ReferenceAdapter):
    """Casts the fp32 pooled latent (ratio 1: wkv's output) to bf16 toward zero before RMSNorm, where upstream rounds to
    nearest. The norm takes out most of the truncation's bias, so its rows lie 0.5-1.45x the reference's
    distance from the exact value (median 1.03x): most cases pass, some fail. No variant of the catalogue
    is this bug; an RMSNorm that rounds before its weight lies farther still from the exact value, and
    must not be named for it (a variant explains an output by matching it, not by being less precise)."""

    def run(self, component, inputs, params):
        def finish_row(pooled, weights):
            truncated = (pooled.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32)
            return rms_norm(truncated.to(torch.bfloat16), weights.norm_w, weights.eps)

        with patched(cp, "finish_row", finish_row):
            return super().run(component, inputs, params)


class RopeAtLast(ReferenceAdapter):
    """kv.finish rotates each row at its group's last position j*r + r - 1 instead of j*r."""

    def run(self, component, inputs, params):
        if component != "kv.finish":
            return super().run(component, inputs, params)
        ratio = int(params.get("ratio", 2))
        out = kf.kv_finish(
            inputs["latent"],
            inputs["groups"] * ratio + ratio - 1,
            inputs["table"],
            int(params["rope_dim"]),
            inputs["wk"],
            inputs["k_norm_w"],
        )
        return {
            "main": out.main,
            "main_rope": out.main_rope,
            "main_packed": out.main_packed,
            "main_scale_bytes": out.main_scale_bytes,
            "index_k": out.index_k,
            "index_norm": out.index_norm,
            "index_packed": out.index_packed,
            "index_scale_bytes": out.index_scale_bytes,
        }


def _norm64(x64: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm of bf16 values in float64, one rounding to bf16."""
    return (weight.double() * x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-20)).to(torch.bfloat16)


class Float64Compressor(ReferenceAdapter):
    """A correct compressor that sums in another order: one fp32 BLAS GEMM per chunk for the
    projections (not the reference's per-position ideal accumulator), then the softmax, the
    weighted sum and the norm in float64. Must pass."""

    def run(self, component, inputs, params):
        if component != "compressor":
            return super().run(component, inputs, params)
        x, start, ratio = inputs["x"], int(params["start"]), int(params["ratio"])
        b, n, _ = x.shape
        norm_w = inputs["norm_w"]
        groups = range(start // ratio, (start + n) // ratio)
        positions = torch.tensor([ratio * j for j in groups], dtype=torch.int64)
        if ratio == 1:
            y = (x.double() @ inputs["wkv"].double().T).to(torch.bfloat16)  # [b, n, hd]
            return _result(_norm64(y.double(), norm_w), positions, inputs["ring"])
        ring = inputs["ring"].clone()
        slots = ring.shape[1]
        xf = x.float()
        score = xf @ inputs["wgate"].float().T  # [b, n, hd] fp32, BLAS order
        latent = xf @ inputs["wkv"].float().T
        for t in range(n):
            ring[:, (start + t) % slots, cp.SCORE] = score[:, t]
            ring[:, (start + t) % slots, cp.LATENT] = latent[:, t]
        rows = []
        for j in groups:
            slot = [(ratio * j + m) % slots for m in range(ratio)]
            s64, l64 = ring[:, slot, cp.SCORE].double(), ring[:, slot, cp.LATENT].double()  # [b, r, hd]
            pooled = (l64 * torch.softmax(s64, dim=1)).sum(dim=1, keepdim=True)  # [b, 1, hd]
            rows.append(_norm64(pooled.to(torch.bfloat16).double(), norm_w))
        hd = ring.shape[-1]
        out = torch.cat(rows, dim=1) if rows else torch.empty(b, 0, hd, dtype=torch.bfloat16)
        return _result(out, positions, ring)
