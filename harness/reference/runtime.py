"""The shared cross-layer runtime and the per-layer state, as explicit immutable values.

Upstream keeps one module-global `shared_attn` (`SharedAttentionRuntime`, M:1166-1180;
docs/v41-reference.md §5.5) with four slots that source layers overwrite and later layers
read during one forward, never reset between forwards. Here the same four slots live in a
frozen `SharedRuntime` that `attention.attention_step` takes and returns (a new value per
publication), together with the layer that published each slot, for reports:

| slot        | published by                       | when                                       |
|-------------|------------------------------------|--------------------------------------------|
| compress_kv | kv sources                         | every forward, unconditionally              |
| index_k     | key-owning index sources           | policy "upstream": only when a group closed |
|             |                                    | in the step; "fixed": every forward         |
| topk_idxs   | index sources                      | every forward (empty when nothing visible)  |
| candidates  | the candidate source               | whenever its indexer runs                   |

Upstream publishes cache *objects*; a reader slices them after the source wrote. Publishing
the source's new cache tensor right after its write is equivalent, because within a forward
nothing writes a published cache between its publication and its readers (sources run
before their readers). The "upstream" index_k rule reproduces §10.1: at a decode step that
closes no ratio-2 group, the ratio-2 sources read the previous forward's last publication
(in config A layer 4's ratio-1 keys).

`LayerState` is what one layer carries from step to step (§5.6): the window ring, the
compressed KV cache and index-key cache (sources only), the compressor ring (ratio 2, the
layout of compressor.py) and the number of positions processed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from v41_conformance.reference.compressor import new_ring, ring_capacity
from v41_conformance.reference.config import AttnConfig, layer_roles

POLICIES = ("upstream", "fixed")
SLOTS = ("compress_kv", "index_k", "topk_idxs", "candidates")  # upstream shared_attn, M:1166-1180


@dataclass(frozen=True)
class SharedRuntime:
    """The four shared slots (M:1166-1180) and who published each (None: never published).

    compress_kv bf16 [b, rows, hd]; index_k bf16 [b, rows, ihd]; topk_idxs int32 [b, S, K]
    (offset applied); candidates bool [b, S, T].
    """

    compress_kv: torch.Tensor | None = None
    index_k: torch.Tensor | None = None
    topk_idxs: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    compress_kv_from: int | None = None
    index_k_from: int | None = None
    topk_idxs_from: int | None = None
    candidates_from: int | None = None

    def publish(self, layer: int, **slots: torch.Tensor) -> SharedRuntime:
        """New runtime with the given slots replaced and attributed to `layer`."""
        unknown = set(slots) - {"compress_kv", "index_k", "topk_idxs", "candidates"}
        if unknown:
            raise ValueError(
                f"unknown shared slots {sorted(unknown)}; the slots are compress_kv, index_k, topk_idxs, candidates"
            )
        changes: dict[str, Any] = dict(slots)
        changes.update({f"{name}_from": layer for name in slots})
        return dataclasses.replace(self, **changes)

    def read(self, slot: str, layer: int) -> torch.Tensor:
        """The slot's tensor; raises when nothing was published before `layer` reads it."""
        value = getattr(self, slot)
        if value is None:
            raise ValueError(
                f"layer {layer} reads shared slot {slot!r} but no layer has "
                "published it yet; run its source layer first"
            )
        return value


@dataclass(frozen=True)
class LayerState:
    """One layer's carried state (§5.6). Caches start as zeros, like upstream's buffers.

    window:      bf16 [b, win, hd]         ring, position p in slot p % win
    compress_kv: bf16 [b, max_seq//r, hd]  kv sources only, else None
    index_k:     bf16 [b, max_seq//r, ihd] key-owning index sources only, else None
    comp_ring:   fp32 [b, S, 2, hd]        compressor ring of kv sources (compressor.py
                                           layout; [b, 0, 2, hd] at ratio 1), else None
    end:         positions processed so far (the next step must start here)
    """

    window: torch.Tensor
    compress_kv: torch.Tensor | None
    index_k: torch.Tensor | None
    comp_ring: torch.Tensor | None
    end: int = 0


def init_layer_state(cfg: AttnConfig, layer: int, batch: int, q_max: int = 1) -> LayerState:
    """Fresh state of `layer` for `batch` sequences; steps may hold up to q_max positions.

    q_max sizes the ratio-2 compressor ring (ring_capacity = 2 + q_max - 1), which this
    harness writes before it pools (compressor.py); pass the longest step, prefill included.
    """
    if not 1 <= batch <= cfg.max_batch_size:
        raise ValueError(f"batch {batch} must be in [1, max_batch_size {cfg.max_batch_size}]")
    role = layer_roles(cfg)[layer]
    hd = cfg.head_dim
    window = torch.zeros(batch, cfg.window_size, hd, dtype=torch.bfloat16)
    ckv = ik = ring = None
    if role.is_kv_source:
        rows = cfg.max_seq_len // role.ratio
        ckv = torch.zeros(batch, rows, hd, dtype=torch.bfloat16)
        slots = ring_capacity(role.ratio, max(q_max, 1))
        ring = new_ring(batch, slots, hd)
        if role.owns_k:
            ik = torch.zeros(batch, rows, cfg.index_head_dim, dtype=torch.bfloat16)
    return LayerState(window, ckv, ik, ring, 0)


def init_states(cfg: AttnConfig, batch: int, q_max: int = 1) -> tuple[LayerState, ...]:
    """`init_layer_state` for every layer (backbone then MTP)."""
    return tuple(init_layer_state(cfg, layer, batch, q_max) for layer in range(cfg.n_total_layers))


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES} (§10.1 stale index_k), got {policy!r}")
