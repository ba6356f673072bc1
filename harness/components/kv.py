"""What happens to a compressed row before it is cached (`kv.finish`) and what the caches cost
(`cache.bytes`).

Upstream: `Attention._compress_kv` (M:746-761) and the indexer's key branch (M:537-548); see
docs/v41-reference.md §3.4, §4.2 step 1, §2.4 and seed 000 §A.3, §A.5. The arithmetic is
`harness/reference/kv_finish.py` and `harness/reference/cache_layout.py`.

- `kv.finish`: for G compressor rows (pre-RoPE latents) and their group numbers j, the main row
  (RoPE on the last rope_dim channels at the group's FIRST position j*r with the compressed
  layers' YaRN table, then fp4 QDQ with e4m3 scales, block 16) and the index key (wk in bf16,
  k_norm, RoPE at the same position, fp4 QDQ with power-of-two scales, block 32), each as the
  reference stores it (bf16 values) and as a kernel would store it (packed e2m1 nibbles and
  scale bytes). The implementation receives the table for positions 0..P-1 and derives the
  position j*r itself.
- `cache.bytes`: payload bytes per row and per allocator block, and the C2 state payload.
"""

from __future__ import annotations

import torch

from ..errors import CaseSpecError
from ..reference import cache_layout as cl
from ..reference import kv_finish as kf
from ..reference import rope as rp
from ..reference.numerics import rms_norm
from ..registry import Component, OutputSpec, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from .build import need, normal, tile_to

# The compressed layers' RoPE table (§2.2): compress_rope_theta with YaRN, production constants.
COMPRESSED_TABLE = {"base": 160000.0, "original_seq_len": 65536, "factor": 16.0, "beta_fast": 32.0, "beta_slow": 1.0}


# --- kv.finish ----------------------------------------------------------------------------------


def _finish_inputs(params, build, gen):
    ratio, rope_dim = int(params.get("ratio", 2)), int(params["rope_dim"])
    hd, ihd, b = (int(need(build, k, "kv.finish")) for k in ("head_dim", "index_head_dim", "batch"))
    groups = [int(j) for j in need(build, "groups", "kv.finish")]
    if any(j < 0 for j in groups) or groups != sorted(set(groups)):
        raise CaseSpecError(f"kv.finish: groups must be distinct, ascending and >= 0, got {groups}")
    g = len(groups)
    # A compressor row: the RMSNorm of bf16 pooled values. `row_scales` then scales whole rows so
    # the quantisers see block maxima from e4m3-subnormal scales upwards.
    norm_w = normal(gen, [hd], 0.1, torch.float32).add(1.0).to(torch.bfloat16)
    latent = rms_norm(normal(gen, [b, g, hd], 1.0), norm_w)  # bf16 [b, G, hd]
    scales = tile_to([float(s) for s in build.get("row_scales", [1.0])], [b * g, 1]).reshape(b, g, 1)
    positions = (max(groups) + 1) * ratio if groups else ratio  # covers every group's last position too
    return {
        "latent": (latent.float() * scales).to(torch.bfloat16),  # [b, G, hd]
        "groups": torch.tensor(groups, dtype=torch.int64),  # [G]
        "table": rp.freqs_table(rope_dim, positions, **COMPRESSED_TABLE),  # [P, rope_dim/2, 2]
        "wk": normal(gen, [ihd, hd], hd**-0.5),  # bf16 [ihd, hd]
        "k_norm_w": normal(gen, [ihd], 0.1, torch.float32).add(1.0).to(torch.bfloat16),
    }


def _finish_reference(inputs, params):
    ratio, rope_dim = _ratio(params), int(params["rope_dim"])
    positions = inputs["groups"] * ratio  # the group's first position (§2.4)
    out = kf.kv_finish(
        inputs["latent"],
        positions,
        inputs["table"],
        rope_dim,
        inputs["wk"],
        inputs["k_norm_w"],
        float(params.get("eps", 1e-20)),
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


def _finish_aux(inputs, params, outputs):
    """The index key after RoPE, before its quantisation: what the boundary verdict judges
    index_k, index_packed and index_scale_bytes against (main* use out.main_rope)."""
    rope = rp.apply_rotary(
        outputs["index_norm"], kf.rope_rows(inputs["table"], inputs["groups"] * _ratio(params)), int(params["rope_dim"])
    )
    return {"index_rope": rope}


def _ratio(params) -> int:
    return int(params.get("ratio", 2))


def _quantised(name: str, fmt: str, encoding: str, pre: str, doc: str, dtype: str, shape: str) -> OutputSpec:
    """A quantiser output judged exactly, with boundary flips against `pre` (docs/verdicts.md)."""
    return OutputSpec(name, "quantised", doc, dtype, shape, quant=fmt, encoding=encoding, pre=pre, pre_tail="rope_dim")


register(
    Component(
        name="kv.finish",
        summary="compressor row -> RoPE at j*r -> fp4/e4m3 main row; index key wk -> k_norm -> RoPE -> fp4/e8m0",
        upstream="M:746-761 (main row), M:537-548 (index key); §3.4, §4.2",
        inputs=(
            T("latent", "bf16", "b G hd", "compressor rows (pre-RoPE)"),
            T("groups", "int64", "G", "each row's compressed index j; RoPE uses position j * ratio"),
            T("table", "f32", "P rope/2 2", "(cos, sin) of positions 0..P-1 (the compressed layers' YaRN table)"),
            T("wk", "bf16", "ihd hd"),
            T("k_norm_w", "bf16", "ihd"),
        ),
        outputs=(
            _quantised(
                "main",
                "fp4_e4m3",
                "values",
                "out.main_rope",
                "post-RoPE row after fp4 QDQ (block 16, e4m3 scales)",
                "bf16",
                "b G hd",
            ),
            OutputSpec("main_rope", "bf16", "post-RoPE row before quantisation", "bf16", "b G hd"),
            _quantised(
                "main_packed",
                "fp4_e4m3",
                "packed",
                "out.main_rope",
                "e2m1 codes, element 2i in the low nibble",
                "uint8",
                "b G hd/2",
            ),
            _quantised(
                "main_scale_bytes",
                "fp4_e4m3",
                "scale_bytes",
                "out.main_rope",
                "float8_e4m3fn scale bits",
                "uint8",
                "b G hd/16",
            ),
            _quantised(
                "index_k",
                "fp4_e8m0",
                "values",
                "index_rope",
                "index key after fp4 QDQ (block 32, power-of-two scales)",
                "bf16",
                "b G ihd",
            ),
            OutputSpec("index_norm", "bf16", "k_norm(wk(latent)), before RoPE", "bf16", "b G ihd"),
            _quantised(
                "index_packed",
                "fp4_e8m0",
                "packed",
                "index_rope",
                "e2m1 codes, element 2i in the low nibble",
                "uint8",
                "b G ihd/2",
            ),
            _quantised(
                "index_scale_bytes",
                "fp4_e8m0",
                "scale_bytes",
                "index_rope",
                "e8m0 biased exponents",
                "uint8",
                "b G ihd/32",
            ),
        ),
        params=(
            P("ratio", "int", "compress ratio: row j sits at position j * ratio", choices=(1, 2)),
            P("rope_dim", "int", "rotated trailing channels"),
            P("eps", "float", "RMSNorm eps", required=False, default=1e-20),
        ),
        dims={
            "b": "batch",
            "G": "rows finished",
            "hd": "head_dim",
            "ihd": "index_head_dim",
            "P": "table positions",
            "rope/2": "rotated pairs",
            "2": "(cos, sin)",
            "hd/2": "two codes per byte",
            "hd/16": "blocks of 16",
            "ihd/2": "two codes per byte",
            "ihd/32": "blocks of 32",
        },
        build=_finish_inputs,
        reference=_finish_reference,
        aux=_finish_aux,
        floor=3,
        notes="groups holds each row's compressed index j; RoPE uses table row j*r (params.ratio), the group's "
        "first position. The table is the compressed layers' YaRN table for positions 0..P-1.",
    )
)


# --- cache.bytes --------------------------------------------------------------------------------

BYTE_KEYS = (
    "fp8_main_row",
    "fp4_main_row",
    "fp4_index_row",
    "rows_per_block",
    "fp8_main_block",
    "fp4_main_block",
    "fp4_index_block",
    "state",
)
BYTE_DOCS = {
    "fp8_main_row": "hd e4m3 bytes + hd/32 ue8m0 scale bytes (528 at hd 512)",
    "fp4_main_row": "hd/2 e2m1 bytes + hd/16 e4m3 scale bytes (288 at hd 512)",
    "fp4_index_row": "ihd/2 e2m1 bytes + ihd/32 ue8m0 scale bytes (68 at ihd 128)",
    "rows_per_block": "completed rows in an allocator block of B positions: B / r",
    "fp8_main_block": "rows_per_block * fp8_main_row (33,792 for a 128-position C2 block)",
    "fp4_main_block": "rows_per_block * fp4_main_row (18,432)",
    "fp4_index_block": "rows_per_block * fp4_index_row (4,352)",
    "state": "C2 state payload S * 2 * hd * 4 (28,672 at S = 7, hd 512); 0 at ratio 1",
}


def _bytes_reference(inputs, params):
    table = cl.cache_bytes(
        int(params["head_dim"]),
        int(params["index_head_dim"]),
        int(params["ratio"]),
        int(params["block_positions"]),
        int(params["state_slots"]),
    )
    return {k: torch.tensor(table[k], dtype=torch.int64) for k in BYTE_KEYS}


register(
    Component(
        name="cache.bytes",
        summary="payload bytes per row and per block (FP8 main, FP4 main, FP4 index) and the C2 state, exact ints",
        upstream="seed 000 §A.2, §A.5; §3.4 (bytes per row); M:760 (block 16), M:23-30 (blocks 32)",
        inputs=(),
        outputs=tuple(OutputSpec(k, "exact", BYTE_DOCS[k], "int64", "") for k in BYTE_KEYS),
        params=(
            P("head_dim", "int", "hd", "channels"),
            P("index_head_dim", "int", "ihd", "channels"),
            P("ratio", "int", "compress ratio", choices=(1, 2)),
            P("block_positions", "int", "token positions per allocator block", "positions"),
            P("state_slots", "int", "ratio-2 ring slots S (r + q_max - 1)", "slots"),
        ),
        build=lambda params, build, gen: {},
        reference=_bytes_reference,
        floor=3,
        notes="params head_dim, index_head_dim, ratio, block_positions, state_slots; no tensor inputs.",
    )
)
