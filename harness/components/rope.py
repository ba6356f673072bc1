"""RoPE components: the YaRN table and the interleaved rotation of the last rope dims.

Upstream: `precompute_freqs_cis` (M:368-389) and `apply_rotary_emb` (M:392-406); see
docs/v41-reference.md §2 and Appendix B.
"""

from __future__ import annotations

import torch

from ..reference import rope as rp
from ..registry import Component, OutputSpec, Rederived, register
from ..registry import ParamSpec as P
from ..registry import TensorSpec as T
from .build import need, normal

TABLE_PARAMS = ("dim", "base", "original_seq_len", "factor", "beta_fast", "beta_slow")


def _table_args(params: dict) -> dict:
    return {
        "dim": int(params["dim"]),
        "base": float(params["base"]),
        "original_seq_len": int(params.get("original_seq_len", 0)),
        "factor": float(params.get("factor", 16.0)),
        "beta_fast": float(params.get("beta_fast", 32.0)),
        "beta_slow": float(params.get("beta_slow", 1.0)),
    }


def _table_inputs(params, build, gen):
    positions = [int(p) for p in need(build, "positions", "rope.yarn_table")]
    return {"positions": torch.tensor(positions, dtype=torch.int64)}


def _table_reference(inputs, params):
    args = _table_args(params)
    positions = inputs["positions"]
    inv = rp.yarn_inv_freq(
        args["dim"], args["base"], args["original_seq_len"], args["factor"], args["beta_fast"], args["beta_slow"]
    )
    # Rows at the requested positions of the table upstream builds (angle = fp32(p) * inv).
    return {"inv_freq": inv, "table": rp.table_rows(inv, positions)}


def _table_aux(inputs, params, outputs):
    """The fp32 angle of every (position, pair) the table holds cos and sin of: [P, dim/2, 1]."""
    return {"angle": torch.outer(inputs["positions"], outputs["inv_freq"]).unsqueeze(-1).contiguous()}


# An implementation's inv_freq within this relative distance of the golden's is a rounding of the
# same frequencies (conformance.yaml allows 24 fp32 ulps, about 2^-18); anything further is a
# wrong base, ramp or factor, and its table is judged against the golden's.
NEAR_INV_FREQ = 2.0**-14


def _table_rederive(inputs, expected, aux, actual, params, boundary) -> Rederived | None:
    """The table as the reference computes it from the implementation's own inv_freq, when that
    differs from the golden's by a rounding (`NEAR_INV_FREQ`): inv_freq is judged on its own, and
    the table then on what those frequencies give, so an inv_freq a few ulps off does not fail
    every row at large positions (one fp32 ulp of inv_freq is p of them in the angle)."""
    inv = actual.get("inv_freq")
    golden = expected["inv_freq"]
    if (
        not isinstance(inv, torch.Tensor)
        or inv.dtype != golden.dtype
        or inv.shape != golden.shape
        or inv.device.type != "cpu"
        or not bool(torch.isfinite(inv).all())
        or torch.equal(inv, golden)
    ):
        return None
    if bool(((inv.double() - golden.double()).abs() > NEAR_INV_FREQ * golden.double().abs()).any()):
        return None  # a wrong inv_freq: the table is judged against the golden's, and fails too
    positions = inputs["positions"]
    differ = int((inv != golden).sum())
    return Rederived(
        outputs={"table": rp.table_rows(inv, positions)},
        aux=_table_aux(inputs, params, {"inv_freq": inv}),
        flips=0,
        example=f"the implementation's own inv_freq ({differ} of {inv.numel()} frequencies differ "
        "from the golden's; inv_freq itself is judged against the golden)",
    )


register(
    Component(
        name="rope.yarn_table",
        summary="YaRN inverse frequencies and the (cos, sin) rows at given positions",
        upstream="M:368-389",
        inputs=(T("positions", "int64", "P", "the table rows wanted"),),
        outputs=(
            OutputSpec("inv_freq", "f32", "1/base^(2i/dim), YaRN-blended; judged in fp32 ulps", "f32", "dim/2"),
            OutputSpec(
                "table",
                "f32",
                "(cos, sin) of fp32(p) * inv_freq; judged in fp32 ulps plus an allowance in "
                "ulps of the angle (aux.angle)",
                "f32",
                "P dim/2 2",
                argument="angle",
            ),
        ),
        params=(
            P("dim", "int", "rope_head_dim: channels rotated (pairs dim/2)"),
            P("base", "float", "rope base (compress_rope_theta 160000 or rope_theta 10000)"),
            P(
                "original_seq_len",
                "int",
                "YaRN's original context; 0 turns YaRN off",
                "positions",
                required=False,
                default=0,
            ),
            P("factor", "float", "YaRN factor", required=False, default=16.0),
            P("beta_fast", "float", "YaRN ramp start", "rotations", required=False, default=32.0),
            P("beta_slow", "float", "YaRN ramp end", "rotations", required=False, default=1.0),
        ),
        dims={"P": "positions", "dim/2": "rotated pairs", "2": "(cos, sin)"},
        build=_table_inputs,
        reference=_table_reference,
        aux=_table_aux,
        rederive=_table_rederive,
        floor=3,
        notes="Transcendental outputs: no two libms agree to the last bit (cosf, sincosf, Sleef, numpy), so both "
        "are compared in fp32 ulps (conformance.yaml). Components that take a table as input get it exactly.",
    )
)


def _apply_inputs(params, build, gen):
    shape = list(need(build, "shape", "rope.apply"))  # [b, s, d] or [b, s, h, d]
    rope_dim = int(params["rope_dim"])
    start = int(build.get("start", 0))
    table = rp.freqs_table(
        rope_dim, start + shape[1], **{k: v for k, v in _table_args({**build, "dim": rope_dim}).items() if k != "dim"}
    )
    x = normal(gen, shape, float(build.get("scale", 1.0)))
    return {"x": x, "table": table[start : start + shape[1]].contiguous()}


register(
    Component(
        name="rope.apply",
        summary="rotate the last rope_dim channels as interleaved complex pairs (inverse: the conjugate)",
        upstream="M:392-406",
        inputs=(
            T("x", "bf16", "b S [h] d", "token axis 1; heads (4-D) share a table row"),
            T("table", "f32", "S rope_dim/2 2", "(cos, sin) rows of the tokens' positions"),
        ),
        outputs=(
            OutputSpec(
                "y",
                "bf16",
                "x with its last rope_dim channels rotated (interleaved pairs), the rest untouched",
                "bf16",
                "b S [h] d",
            ),
        ),
        params=(
            P("rope_dim", "int", "rotated trailing channels"),
            P("inverse", "bool", "rotate by the conjugate (the output's un-rotation)", required=False, default=False),
        ),
        dims={
            "b": "batch",
            "S": "tokens",
            "[h]": "heads (4-D input only)",
            "d": "channels",
            "rope_dim/2": "pairs",
            "2": "(cos, sin)",
        },
        build=_apply_inputs,
        reference=lambda inputs, params: {
            "y": rp.apply_rotary(
                inputs["x"], inputs["table"], int(params["rope_dim"]), bool(params.get("inverse", False))
            )
        },
        floor=3,
    )
)
