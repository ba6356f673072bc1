"""Calibration of the chain's allowances: how far correct implementations' values move at each stage.

For each implementation and attention case (small or production tier), runs the case once and
prints, per stage, the worst headroom used over every call (`bound_used`: the worst element's
|diff| over its bound; `rel_l2_headroom`) and how many rows differ from the reference's; and for
the three quantised caches, how far the implementation's value before quantisation moved from
the reference's beyond `boundary_ulps` bf16 ulps, as a fraction of its block's amax: the
`boundary_atol_rel` a judgement without intermediates needs (conformance.yaml; docs/verdicts.md).

    python benchmarks/calibrate_chain.py [--tier small|production] [--impl NAME ...] [--select PATTERN]

Implementations: the gates of tests/test_chain.py (upstream, float64, plain, tiled-fp32p, tiles128,
one-pass, fp8-k128, blas-bf16).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "impls")]

from v41_conformance import regenerated  # noqa: E402
from v41_conformance.boundary import FORMATS  # noqa: E402
from v41_conformance.config import load_config  # noqa: E402
from v41_conformance.golden import load_verified, read_manifest  # noqa: E402
from v41_conformance.ids import matches, parse_select  # noqa: E402
from v41_conformance.known import get  # noqa: E402
from v41_conformance.runner import CaseResult, _execute, _judge  # noqa: E402
from v41_conformance.ulps import rope_magnitude, ulp_of  # noqa: E402


def implementations() -> dict:
    import attention_cores
    import gemm_orders
    from gate_float64 import Float64
    from gate_upstream import UpstreamTorch
    from wrong_attention import PlainSoftmax

    return {
        "upstream": UpstreamTorch,
        "float64": Float64,
        "plain": PlainSoftmax,
        "tiled-fp32p": attention_cores.TiledFp32P,
        "tiles128": attention_cores.Tiles128,
        "one-pass": attention_cores.OnePassBf16P,
        "fp8-k128": gemm_orders.Fp8K128,
        "blas-bf16": gemm_orders.BlasBf16,
    }


CACHES = {
    "window_rows": ("kv", "window_pre", "fp8_ue8m0"),
    "compress_rows": ("compress_pre", "compress_pre", "fp4_e4m3"),
    "index_k_rows": ("index_k_pre", "index_k_pre", "fp4_e8m0"),
}


def needed_atol_rel(mine: torch.Tensor, ref: torch.Tensor, block: int, ulps: float, tail: int) -> float:
    """max over elements of (|mine - ref| - ulps bf16 ulps of ref's magnitude) / its block's amax."""
    if not ref.numel():
        return 0.0
    diff = (mine.double() - ref.double()).abs()
    beyond = (diff - ulps * ulp_of(rope_magnitude(ref, tail), torch.bfloat16)).clamp_min(0)
    amax = ref.double().abs().unflatten(-1, (-1, block)).amax(-1, keepdim=True).expand(*ref.shape[:-1], -1, block)
    return float((beyond / amax.flatten(-2).clamp_min(1e-30)).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="small")
    parser.add_argument("--impl", nargs="*", default=None)
    parser.add_argument("--select", default="attention/*")
    args = parser.parse_args()
    config = load_config(ROOT / "conformance.yaml").for_tier(args.tier)
    manifest = read_manifest(config.goldens)
    cases = [c for c in sorted(manifest) if c.startswith("attention/") and matches(c, parse_select(args.select))]
    component = get("attention")
    boundary = config.boundary_policy(component)
    impls = implementations()
    for name in args.impl or list(impls):
        for case_id in cases:
            golden = load_verified(config.goldens, case_id, manifest, config.generate_command)
            regenerated.restore(golden, component)
            params = golden.meta["params"]
            result = CaseResult(case_id, "attention", "error")
            start = time.perf_counter()
            actual = _execute(component, impls[name](), golden, params, result)
            if actual is None:
                print(f"{name:12s} {case_id}: {result.status} {result.message.splitlines()[0][:100]}")
                continue
            _judge(component, golden, actual, params, config, {}, result)
            print(f"{name:12s} {case_id}: {result.status} ({time.perf_counter() - start:.0f} s)")
            worst: dict[str, list] = {}
            for out, m in result.outputs.items():
                stage = out.rsplit(".", 1)[-1]
                w = worst.setdefault(stage, [0.0, 0.0, 0])
                w[0] = max(w[0], m.get("bound_used") or 0.0)
                w[1] = max(w[1], m.get("rel_l2_headroom") or 0.0)
                w[2] += m.get("rederived_rows", 0)
            for stage, (bound, rel, rows) in sorted(worst.items()):
                if bound or rel or rows:
                    print(f"    {stage:15s} bound_used {bound:6.3f}  rel_l2_headroom {rel:6.3f}  rows rederived {rows}")
            tail = int(params["config"]["rope_head_dim"])
            for out, (pre, aux, fmt) in CACHES.items():
                need = 0.0
                for rec in (n for n in actual if n.endswith("." + pre)):
                    step_layer = rec[: -len(pre) - 1]
                    if out == "window_rows":
                        step, layer = step_layer.split(".")
                        ref = golden.aux[f"{step}.window_pre"][int(layer[1:])]
                        mine = actual[rec][:, actual[rec].shape[1] - ref.shape[1] :]
                    else:
                        ref, mine = golden.aux[f"{step_layer}.{aux}"], actual[rec]
                    need = max(need, needed_atol_rel(mine, ref, FORMATS[fmt].block, boundary.boundary_ulps, tail))
                print(f"    {out:15s} boundary_atol_rel needed without intermediates: {need:.3g} (2^{_log2(need)})")


def _log2(x: float) -> str:
    import math

    return f"{math.log2(x):.1f}" if x > 0 else "-inf"


if __name__ == "__main__":
    main()
