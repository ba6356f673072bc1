"""Attention-path configuration and the per-layer roles derived from it.

`AttnConfig` holds the ModelArgs fields the compressed-attention path reads (upstream
`inference/model.py` M:44-136, production values from `inference/config.json`;
docs/v41-reference.md §1.2). `layer_roles` derives, per layer, what upstream's flags
(M:653-661 for Attention, M:500-505 for the Indexer) and its last-publisher shared
runtime (M:1166-1180) make of it (§1.3 for production, §12 for tiny config A):

- ``Window``  ratio 0: window only, touches no shared slot.
- ``Full``    index source that owns its index keys (a kv source): own Compressor,
              own Indexer, own compressed cache and index keys.
- ``Reindex`` index source without keys: scores its own queries against the index
              keys of the latest key-owning source (and may consume candidates).
- ``Reuse``   compressed layer without an indexer: reads the latest kv source's cache
              and the latest index source's selection as is.

Each compressed layer reads the compressed cache of the latest kv source at or before
it, because upstream's ``shared_attn`` slot keeps only the last publication. The three
resulting source maps are checked with `topology.validate_topology`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from v41_conformance.reference.topology import validate_topology

MODES = ("Window", "Full", "Reindex", "Reuse")


@dataclass(frozen=True)
class AttnConfig:
    """ModelArgs fields on the attention path (M:44-136). Defaults: tiny config A (§12)."""

    dim: int = 128  # hidden size (production 5120)
    n_heads: int = 4  # attention heads (64)
    head_dim: int = 128  # q width = KV latent width, K = V (512)
    rope_head_dim: int = 32  # rotated LAST channels of q/k/v/o (64)
    q_lora_rank: int = 64  # qr width (1280)
    o_groups: int = 2  # grouped output projection (8)
    o_lora_rank: int = 32  # per-group output rank (1024)
    window_size: int = 8  # sliding-window ring (128)
    norm_eps: float = 1e-20  # every RMSNorm eps
    rope_theta: float = 10000.0  # ratio-0 layers, no YaRN
    compress_rope_theta: float = 160000.0  # ratio > 0 layers, with YaRN
    original_seq_len: int = 65536  # YaRN on when > 0 (ratio > 0 layers only)
    rope_factor: float = 16.0
    beta_fast: int = 32
    beta_slow: int = 1
    index_n_heads: int = 4  # (32)
    index_head_dim: int = 64  # (128)
    index_topk: int = 4  # compressed rows kept per query (512)
    candidate_block_size: int = 2  # compressed rows per candidate block (8)
    candidate_topk_blocks: int = 3  # blocks kept per query (2048)
    compress_ratios: tuple[int, ...] = (0, 2, 2, 2, 1, 1, 1, 1)
    kv_source_layers: tuple[int, ...] = (1, 3, 4)
    index_source_layers: tuple[int, ...] = (1, 3, 4, 6)
    candidate_source_layer: int = 4  # -1: no candidate blocks
    max_seq_len: int = 64  # caches and RoPE table length (4096)
    n_layers: int = 8  # backbone layers; later ratios are MTP layers
    max_batch_size: int = 2

    def __post_init__(self) -> None:
        _check_shapes(self)

    @classmethod
    def from_dict(cls, fields: dict) -> AttnConfig:
        """The config from its fields as a golden's JSON metadata holds them (lists back to tuples)."""
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        return cls(**values)

    @property
    def n_total_layers(self) -> int:
        """Backbone plus MTP layers (= len(compress_ratios))."""
        return len(self.compress_ratios)

    @property
    def softmax_scale(self) -> float:
        """Attention scale head_dim^-0.5 as a Python float (§5.1)."""
        return self.head_dim**-0.5

    @property
    def index_softmax_scale(self) -> float:
        """Indexer scale index_head_dim^-0.5 as a Python float (§4.1)."""
        return self.index_head_dim**-0.5


def _check_shapes(cfg: AttnConfig) -> None:
    """The shape relations of §12 that the reference code relies on."""
    problems = []
    if cfg.head_dim % 32 or cfg.head_dim % 16:
        problems.append(f"head_dim {cfg.head_dim} must be a multiple of 32 (fp8 window block)")
    if not (0 < cfg.rope_head_dim < cfg.head_dim) or cfg.rope_head_dim % 2:
        problems.append(f"rope_head_dim {cfg.rope_head_dim} must be even and in (0, head_dim {cfg.head_dim})")
    if cfg.index_head_dim % 32 or cfg.index_head_dim < cfg.rope_head_dim:
        problems.append(
            f"index_head_dim {cfg.index_head_dim} must be a multiple of 32 and >= rope_head_dim {cfg.rope_head_dim}"
        )
    if cfg.n_heads % cfg.o_groups:
        problems.append(f"n_heads {cfg.n_heads} must be a multiple of o_groups {cfg.o_groups}")
    if cfg.n_layers > len(cfg.compress_ratios):
        problems.append(f"n_layers {cfg.n_layers} exceeds len(compress_ratios) {len(cfg.compress_ratios)}")
    bad = [r for r in cfg.compress_ratios if r not in (0, 1, 2)]
    if bad:
        problems.append(f"compress_ratios may hold only 0, 1, 2 in V4.1; got {bad}")
    if cfg.window_size <= 0 or cfg.index_topk <= 0:
        problems.append(f"window_size {cfg.window_size} and index_topk {cfg.index_topk} must be positive")
    if cfg.candidate_source_layer >= 0 and (cfg.candidate_block_size <= 0 or cfg.candidate_topk_blocks <= 0):
        problems.append(
            "candidate_block_size and candidate_topk_blocks must be positive when "
            f"candidate_source_layer = {cfg.candidate_source_layer}"
        )
    if problems:
        raise ValueError("AttnConfig: " + "; ".join(problems))


TINY_A = AttnConfig()
"""Tiny configuration A of docs/v41-reference.md §12 (one layer of every role)."""

PRODUCTION = AttnConfig(
    dim=5120,
    n_heads=64,
    head_dim=512,
    rope_head_dim=64,
    q_lora_rank=1280,
    o_groups=8,
    o_lora_rank=1024,
    window_size=128,
    norm_eps=1e-20,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    original_seq_len=65536,
    rope_factor=16.0,
    beta_fast=32,
    beta_slow=1,
    index_n_heads=32,
    index_head_dim=128,
    index_topk=512,
    candidate_block_size=8,
    candidate_topk_blocks=2048,
    compress_ratios=(0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0),
    kv_source_layers=(2, 8, 14, 20),
    index_source_layers=(2, 8, 14, 20, 24, 28, 32, 36),
    candidate_source_layer=20,
    max_seq_len=4096,
    n_layers=40,
    max_batch_size=4,
)
"""DeepSeek-V4.1-Flash `inference/config.json` (§1.2); max_seq_len/max_batch_size are the
ModelArgs defaults because config.json does not set them."""


@dataclass(frozen=True)
class LayerRole:
    """What one layer computes and which earlier layers' data it reads (§1.3).

    Source fields are layer numbers, or None where the layer reads no such data.
    `index_k_source` of a Reuse layer is the one of its index source (it reads no keys
    itself; the value keeps the topology maps segmented).
    """

    layer: int
    ratio: int
    mode: str  # one of MODES
    is_kv_source: bool  # owns Compressor + compressed cache
    is_index_source: bool  # owns an Indexer
    owns_k: bool  # Indexer projects and publishes its own index keys
    kv_source: int | None  # whose compressed cache it attends
    index_source: int | None  # whose selection it attends (itself for indexers)
    index_k_source: int | None  # whose index keys its indexer scores against
    is_candidate_source: bool  # publishes level-one candidate blocks
    candidate_source: int | None  # whose candidates its indexer consumes


def _latest(sources: list[int], layer: int) -> int | None:
    earlier = [s for s in sources if s <= layer]
    return max(earlier) if earlier else None


def layer_roles(cfg: AttnConfig) -> tuple[LayerRole, ...]:
    """Per-layer roles of every layer (backbone then MTP), validated as a topology.

    Raises ValueError when a compressed layer has no usable source, when a source's
    ratio differs from its reader's (the shared slices would have the wrong length),
    when a kv source has no indexer (no V4.1 layer does that), or when the derived
    maps fail `validate_topology`.
    """
    n_bb = cfg.n_layers
    kv_src = sorted(l for l in cfg.kv_source_layers if l < n_bb)
    idx_src = sorted(l for l in cfg.index_source_layers if l < n_bb)
    keyed = [l for l in idx_src if l in cfg.kv_source_layers]
    cand = cfg.candidate_source_layer
    roles = []
    for layer, ratio in enumerate(cfg.compress_ratios):
        is_kv, is_idx = layer in kv_src, layer in idx_src
        if ratio == 0:
            if is_kv or is_idx or layer == cand:
                raise ValueError(
                    f"layer {layer} has compress ratio 0 but is listed as a kv, "
                    "index or candidate source; sources must compress"
                )
            roles.append(LayerRole(layer, 0, "Window", False, False, False, None, None, None, False, None))
            continue
        if is_kv and not is_idx:
            raise ValueError(
                f"layer {layer} is a kv source without an indexer; V4.1 kv "
                "sources are always index sources (add it to index_source_layers)"
            )
        kv = _latest(kv_src, layer)
        idx = layer if is_idx else _latest(idx_src, layer)
        key = _latest(keyed, idx) if idx is not None else None
        for what, src in (("kv", kv), ("index", idx), ("index-K", key)):
            if src is None:
                raise ValueError(
                    f"layer {layer} (ratio {ratio}) has no {what} source at or before it; list an earlier source layer"
                )
            if cfg.compress_ratios[src] != ratio:
                raise ValueError(
                    f"layer {layer} has ratio {ratio} but its {what} source "
                    f"{src} has ratio {cfg.compress_ratios[src]}; shared slots "
                    "need equal ratios"
                )
        uses_cand = is_idx and 0 <= cand < layer
        if uses_cand and cfg.compress_ratios[cand] != ratio:
            raise ValueError(
                f"layer {layer} (ratio {ratio}) consumes candidates of layer "
                f"{cand} (ratio {cfg.compress_ratios[cand]}); ratios must match"
            )
        if layer == cand and not is_idx:
            raise ValueError(f"candidate source {cand} must be an index source")
        mode = ("Full" if layer in keyed else "Reindex") if is_idx else "Reuse"
        roles.append(
            LayerRole(
                layer,
                ratio,
                mode,
                is_kv,
                is_idx,
                layer in keyed,
                kv,
                idx,
                key,
                layer == cand,
                cand if uses_cand else None,
            )
        )
    roles_t = tuple(roles)
    maps = topology_maps(roles_t)
    verdict = validate_topology(*maps)
    if not verdict.accepted:
        raise ValueError(f"derived sharing topology rejected: {verdict.message}")
    return roles_t


def topology_maps(roles: tuple[LayerRole, ...]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(main_kv, index_k, index, candidate) source maps, -1 where a layer takes no part.

    Candidate map: the source publishes to itself, consumers name the source, -1 elsewhere.
    """
    main_kv = [r.kv_source if r.kv_source is not None else -1 for r in roles]
    index_k = [r.index_k_source if r.index_k_source is not None else -1 for r in roles]
    index = [r.index_source if r.index_source is not None else -1 for r in roles]
    cand = [
        r.layer if r.is_candidate_source else (r.candidate_source if r.candidate_source is not None else -1)
        for r in roles
    ]
    return main_kv, index_k, index, cand


def rope_params(cfg: AttnConfig, ratio: int) -> dict:
    """Keyword arguments of `rope.freqs_table` for a layer of this ratio (M:680-698, §2.2).

    Ratio > 0: compress_rope_theta with YaRN; ratio 0: rope_theta, YaRN off.
    """
    if ratio > 0:
        return dict(
            dim=cfg.rope_head_dim,
            seqlen=cfg.max_seq_len,
            base=cfg.compress_rope_theta,
            original_seq_len=cfg.original_seq_len,
            factor=cfg.rope_factor,
            beta_fast=cfg.beta_fast,
            beta_slow=cfg.beta_slow,
        )
    return dict(
        dim=cfg.rope_head_dim,
        seqlen=cfg.max_seq_len,
        base=cfg.rope_theta,
        original_seq_len=0,
        factor=cfg.rope_factor,
        beta_fast=cfg.beta_fast,
        beta_slow=cfg.beta_slow,
    )


PRODUCTION_TIER = AttnConfig(
    dim=5120,
    n_heads=64,
    head_dim=512,
    rope_head_dim=64,
    q_lora_rank=1280,
    o_groups=8,
    o_lora_rank=1024,
    window_size=128,
    norm_eps=1e-20,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    original_seq_len=65536,
    rope_factor=16.0,
    beta_fast=32,
    beta_slow=1,
    index_n_heads=32,
    index_head_dim=128,
    index_topk=512,
    candidate_block_size=8,
    candidate_topk_blocks=96,
    compress_ratios=(2, 1, 1),
    kv_source_layers=(0, 1),
    index_source_layers=(0, 1, 2),
    candidate_source_layer=1,
    max_seq_len=1088,
    n_layers=3,
    max_batch_size=1,
)
"""The production tier's attention config: every production dimension (§1.2), three layers (a
ratio-2 Full layer, the ratio-1 Full candidate source, a ratio-1 Reindex consumer). Production's
2048 candidate blocks would need 16,384 compressed rows; with 96 blocks of 8 candidate selection
is active from 768 rows on, and the kept pool (95 * 8 + 1 = 761 rows) still exceeds top-512, so
there is no §4.4 leak. max_seq_len 1088 holds a 1,030-token prefill and decode steps."""
