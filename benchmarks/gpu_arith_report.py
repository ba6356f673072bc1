"""The harness as it stands against GPU arithmetic: every gate and mutant of tests/impls/gpu_arith.py over a tier.

For each implementation and case (in this process, `run_case`, as tests/test_chain.py does) it prints
the verdict per component, and for every failing output the metrics an allowance designer needs:
max ulps, bound used, rel L2 against its bound, the share of elements that differ against its bound,
mismatched elements. Outputs of one stage in several (step, layer) calls of a case make one line
(the worst of each metric, the number of calls that failed, the first failing name). Then, per
component and stage, the worst use of each bound over every output, passing ones included.

It also records every fp8 GEMM and every index-logit computation the models make, and relates each
output's error to the magnitude of the terms it sums (ulps: bf16 ulps of the larger of the two
values, as a rounding flip across a power of two moves by the larger one):

- fp8 GEMM, u = 2^-13 (a 14-bit accumulator): T = Σ_blocks sa·sw Σ_k |qa_k qw_k|, y_ref the
  reference's exact GEMM of the same operands. `r` = max |y - y_ref| / (u T) over the bf16 outputs,
  `r>1ulp` = max (|y - y_ref| - 1 ulp)+ / (u T), `r_f32` = max |acc - acc_ref| / (u T) on the fp32
  accumulators before the bf16 rounding, `>1ulp` how many outputs are more than one ulp off. For
  wq_a and wkv in attention also the value after RMSNorm (upstream's norm of the gate's GEMM output
  against the reference's norm of the exact one), the allowance carried through the norm by
  c = |weight| / rms(y_ref): there `r>1ulp` = max (|diff| - 1 ulp - c · 1 ulp of y)+ / (c u T).
- index logits, u = 2^-24 (an fp32 accumulator): T = Σ_h |w_h| Σ_d |q_hd k_d|; `r`, `r>1ulp` as
  above against the reference's logits of the same operands (upstream's rounding points, exact sums;
  the query fp4-round-tripped where the component does it), and `rH>1ulp` = max (|diff| - 1 ulp)+ /
  (2^-8 Σ_h |w_h relu(s_h)|): the excess in bf16 unit roundoffs of the head terms.

    python benchmarks/gpu_arith_report.py [--tier small|production] [--impl NAME ...] [--select PATTERN]
                                          [--threads N] [--diagnosis-budget S]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "impls")]

import gpu_arith as ga  # noqa: E402
import upstream_ops as up  # noqa: E402
from v41_conformance.components.attention_steps import config_of  # noqa: E402
from v41_conformance.config import load_config  # noqa: E402
from v41_conformance.golden import read_manifest  # noqa: E402
from v41_conformance.ids import matches, parse_select  # noqa: E402
from v41_conformance.reference.indexer import index_scores as reference_index_scores  # noqa: E402
from v41_conformance.reference.numerics import rms_norm as reference_rms_norm  # noqa: E402
from v41_conformance.runner import run_case  # noqa: E402
from v41_conformance.ulps import ulp_of  # noqa: E402

U_FP8, U_FP32 = 2.0**-13, 2.0**-24
UPSTREAM_RMS_NORM = up.rms_norm
NORMED = {"wq_a": ("q_norm", "qr"), "wkv": ("kv_norm", "kv (pre-RoPE)")}


# --- the term-scale log ------------------------------------------------------------------------


def ratio_stats(
    diff: torch.Tensor, allowance: torch.Tensor, scale: torch.Tensor, ulp: torch.Tensor | None = None
) -> dict:
    """max |diff| / scale, max (|diff| - allowance)+ / scale, and how many elements exceed the
    allowance (default: one ulp); the worst excess element's |diff|, its ulps, its scale. An element
    with scale 0 and a difference counts as infinite."""
    ulp = allowance if ulp is None else ulp

    def ratio(num):
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.where(scale > 0, num / safe, torch.where(num > 0, math.inf, 0.0))

    if not diff.numel():
        return {"r": 0.0, "rx": 0.0, "over1": 0, "n": 0}
    r, rx = ratio(diff), ratio((diff - allowance).clamp_min(0))
    worst = int(rx.flatten().argmax()) if float(rx.max()) > 0 else int(r.flatten().argmax())
    return {
        "r": float(r.max()),
        "rx": float(rx.max()),
        "over1": int((diff > allowance).sum()),
        "n": diff.numel(),
        "worst": (float(diff.flatten()[worst]), float((diff / ulp).flatten()[worst]), float(scale.flatten()[worst])),
    }


def larger_ulp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp of the larger magnitude of two values: a rounding flip where the two straddle a
    power of two is up to an ulp of the larger binade."""
    return ulp_of(torch.maximum(a.double().abs(), b.double().abs()), torch.bfloat16)


def merge(into: dict, new: dict) -> None:
    if not into:
        into.update(new, calls=1)
        return
    into["calls"] += 1
    into["over1"] += new["over1"]
    into["n"] += new["n"]
    for key in [k for k in new if k.startswith("r")]:
        if new[key] > into.get(key, -1.0):
            into[key] = new[key]
            if key == "rx" and "worst" in new:
                into["worst"] = new["worst"]


class TermLog:
    """Per (case, label): the merged ratio stats of every call with that label."""

    def __init__(self):
        self.entries: dict[tuple[str, str, str], dict] = defaultdict(dict)
        self.case = ""

    def add(self, kind: str, name: str, where: str, stats: dict) -> None:
        if "worst" in stats:
            stats["worst"] = stats["worst"] + (where,)
        merge(self.entries[(self.case, kind, name)], stats)


def fp8_stats(ops: ga.Fp8Operands, acc: torch.Tensor) -> dict:
    exact = ga.fp8_exact(ops)
    scale = ga.fp8_term_scale(ops) * U_FP8
    y, y_ref = acc.to(torch.bfloat16), exact.to(torch.bfloat16)
    diff = (y.double() - y_ref.double()).abs()
    stats = ratio_stats(diff, larger_ulp(y, y_ref), scale, ulp_of(y_ref, torch.bfloat16))
    acc_diff = (acc.double() - exact.double()).abs()
    stats["r_f32"] = float((acc_diff / scale.clamp_min(1e-300)).max()) if acc.numel() else 0.0
    return stats, y, y_ref, scale


def normed_stats(y: torch.Tensor, y_ref: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, eps: float) -> dict:
    """The ratio after RMSNorm, the GEMM's allowance carried through it: c = |weight| / rms(y_ref), and
    the excess is |diff| - 1 ulp of the normed value - c * 1 ulp of y_ref, over c * u * T."""
    mine, ref = UPSTREAM_RMS_NORM(y, weight, eps), reference_rms_norm(y_ref, weight, eps)
    carry = weight.double().abs() / torch.sqrt(y_ref.double().square().mean(-1, keepdim=True) + eps)
    allowance = larger_ulp(mine, ref) + carry * larger_ulp(y, y_ref)
    return ratio_stats((mine.double() - ref.double()).abs(), allowance, scale * carry, ulp_of(ref, torch.bfloat16))


def logit_stats(component: str, q, k, w, out) -> dict:
    qq = ga.ORIGINAL_FP4_E8M0(q).y if component in ("indexer", "attention") else q
    ref = reference_index_scores(qq, k, w)
    scale = ga.index_logit_terms(qq, k, w) * U_FP32
    diff, ulp = (out.double() - ref.double()).abs(), ulp_of(ref, torch.bfloat16)
    stats = ratio_stats(diff, larger_ulp(out, ref), scale, ulp)
    heads = torch.einsum("bshd,btd->bsht", qq.double(), k.double()).relu().mul(w.double().abs().unsqueeze(-1)).sum(2)
    rh = ratio_stats(diff, larger_ulp(out, ref), heads * 2.0**-8, ulp)
    stats["rH"] = rh["rx"]
    return stats


def recording(cls: type, log: TermLog) -> type:
    """`cls` that logs the term-scale ratios of its fp8 GEMMs and index logits (module docstring)."""

    class Recording(cls):
        def run(self, component, inputs, params):
            self._component, self._params, self._inputs = component, params, inputs
            self._names = {id(v): k for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            return super().run(component, inputs, params)

        def _where(self) -> str:
            if self._component != "attention":
                return ""
            starts = [int(a) for a, _ in self._params["schedule"]]
            step = starts.index(int(self._params["start"]))
            return f"s{step:02d}.l{int(self._params['role']['layer'])}"

        def _fp8_linear(self, x, w_codes, w_scale_bytes, promote=up.FP8_BLOCK):
            q = up.act_quant(x)
            ops = ga.fp8_operands(q, w_codes, w_scale_bytes)
            acc = self.fp8_accumulate(ops)
            name = self._names.get(id(w_codes), "?")
            stats, y, y_ref, scale = fp8_stats(ops, acc)
            log.add("fp8", name, self._where(), stats)
            if name in NORMED and self._component == "attention":
                norm, stage = NORMED[name]
                eps = config_of(self._params).norm_eps
                log.add("fp8-normed", stage, self._where(), normed_stats(y, y_ref, scale, self._inputs[norm], eps))
            return acc.reshape(*x.shape[:-1], w_codes.shape[0]).to(torch.bfloat16), q

    if cls.index_logits is not None:
        base = cls.index_logits

        def index_logits(self, q, k, w):
            out = base(q, k, w)
            log.add("logits", "index_scores", self._where(), logit_stats(self._component, q, k, w, out))
            return out

        Recording.index_logits = index_logits
    Recording.__name__ = Recording.__qualname__ = cls.__name__
    return Recording


# --- the run -------------------------------------------------------------------------------------


def implementations() -> dict[str, tuple[type, str]]:
    """name -> (class, what it is: 'gate' or the stage a mutant must fail at)."""
    out = {name: (cls, "gate") for name, cls in ga.GATES.items()}
    out.update({name: (spec.cls, f"mutant (must fail at {spec.stage})") for name, spec in ga.MUTANTS.items()})
    return out


def stage_of(output: str) -> str:
    return output.rsplit(".", 1)[-1]


def fmt(value, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def failing_lines(results: list) -> list[str]:
    """One line per (case, stage) with failing outputs: the worst of each metric over its calls."""
    lines = []
    for r in results:
        if r.status not in ("fail", "error", "crash", "timeout"):
            continue
        diagnosis = ""
        if r.diagnosis and r.diagnosis.get("matches"):
            diagnosis = " diagnosis: " + ", ".join(
                f"{m['variant']} ({m['identical']}/{m['outputs']} identical, {m['explained']} explained)"
                for m in r.diagnosis["matches"]
            )
        lines.append(f"  {r.id}: {r.status}, first divergent {r.first_divergent_stage or '-'}{diagnosis}")
        if r.status != "fail":
            lines.append("    " + r.message.splitlines()[0] if r.message else "")
            continue
        by_stage: dict[str, list] = defaultdict(list)
        for name, m in r.outputs.items():
            if not m.get("ok", True):
                by_stage[stage_of(name)].append((name, m))
        for stage, items in by_stage.items():

            def worst(key, items=items):
                return max((m.get(key) for _, m in items if m.get(key) is not None), default=None)

            m0 = items[0][1]
            headroom = m0.get("rel_l2_headroom")
            allowed_l2 = m0["rel_l2"] / headroom if headroom else None
            policy = m0.get("policy", "")
            share = policy.split("<= ")[-1].split(" of elements")[0] if "of elements" in policy else "1"
            mism = sum(m.get("mismatched", 0) for _, m in items)
            numel = sum(m.get("numel", 0) for _, m in items)
            calls = f" x{len(items)} calls (first {items[0][0]})" if len(items) > 1 else f" ({items[0][0]})"
            if "max_ulps" not in m0:  # index / exact / quantised outputs: their own metrics
                keys = {
                    k: v
                    for k, v in m0.items()
                    if k not in ("ok", "policy", "message", "ulps_histogram", "note")
                    and not isinstance(v, (dict, list))
                }
                lines.append(f"    {stage}{calls}: {keys}")
                continue
            lines.append(
                f"    {stage}{calls}: max_ulps {fmt(worst('max_ulps'))}, bound_used {fmt(worst('bound_used'))}, "
                f"rel_l2 {fmt(worst('rel_l2'))} (allowed {fmt(allowed_l2)}), "
                f"diff_fraction {fmt(worst('diff_fraction'))} "
                f"(allowed {share}), mismatched {mism} / {numel}, max_abs {fmt(worst('max_abs_err'))}"
            )
    return lines


def headroom_lines(results: list) -> list[str]:
    """Per (component, stage) over every case: how much of each bound the worst output used (passing
    outputs included), and how many outputs differ from the golden at all."""
    worst: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(float))
    for r in results:
        for name, m in r.outputs.items():
            if "bound_used" not in m:
                continue
            w = worst[(r.component, stage_of(name))]
            w["outputs"] += 1
            w["differ"] += 1 if (m.get("diff_fraction") or 0) > 0 else 0
            for key in ("bound_used", "rel_l2_headroom", "diff_fraction", "max_ulps"):
                value = m.get(key)
                if value is not None and value > w[key]:
                    w[key] = value
    lines = [
        f"    {c} {stage}: {int(w['differ'])}/{int(w['outputs'])} outputs differ; worst bound_used "
        f"{fmt(w['bound_used'])}, rel_l2/allowed {fmt(w['rel_l2_headroom'])}, diff_fraction "
        f"{fmt(w['diff_fraction'])}, max_ulps {fmt(w['max_ulps'])}"
        for (c, stage), w in sorted(worst.items())
        if w["differ"]
    ]
    if not lines:
        return []
    return ["  bounds used (every output, passing ones included; only stages that differ anywhere):"] + lines


def term_lines(log: TermLog, results: list) -> list[str]:
    status = {r.id: r.status for r in results}
    lines = []
    for kind, title in (
        ("fp8", "fp8 GEMM outputs, u = 2^-13"),
        ("fp8-normed", "after RMSNorm (wq_a -> qr, wkv -> kv before RoPE), u = 2^-13 carried"),
        ("logits", "index logits, u = 2^-24"),
    ):
        rows = [(case, label, s) for (case, k, label), s in log.entries.items() if k == kind]
        if not rows:
            continue
        lines.append(f"  term scales, {title}:")
        per_label = {(case, label): s for case, label, s in rows}
        for (case, label), s in sorted(per_label.items()):
            worst = s.get("worst")
            extra = f", r_f32 {fmt(s['r_f32'])}" if "r_f32" in s else ""
            extra += f", rH>1ulp {fmt(s['rH'])}" if "rH" in s else ""
            at = f" at {worst[3]}" if worst and worst[3] else ""
            detail = f"; worst{at}: |d| {worst[0]:.3g} = {worst[1]:.3g} ulp, u*T {worst[2]:.3g}" if worst else ""
            lines.append(
                f"    {case} [{status.get(case, '?')}] {label}: r {fmt(s['r'])}, "
                f"r>1ulp {fmt(s['rx'])}{extra}, "
                f">1ulp {s['over1']} / {s['n']}{detail}"
            )
        overall: dict[str, dict] = defaultdict(dict)
        for (case, label), s in per_label.items():
            merge(overall[label], {k: v for k, v in s.items() if k != "calls"})
        summary = "; ".join(
            f"{label} r {fmt(s['r'])} r>1ulp {fmt(s['rx'])}"
            + (f" r_f32 {fmt(s['r_f32'])}" if "r_f32" in s else "")
            + (f" rH>1ulp {fmt(s['rH'])}" if "rH" in s else "")
            for label, s in sorted(overall.items())
        )
        lines.append(f"    max over cases: {summary}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="small", choices=("small", "production"))
    parser.add_argument("--impl", action="append", help="gate or mutant names (default: all)")
    parser.add_argument("--select", action="append", help="case id patterns (default: every case)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default torch's; 1 is faster on a busy machine: the models run small ops)",
    )
    parser.add_argument(
        "--diagnosis-budget",
        type=float,
        default=None,
        help="seconds per failing case for the harness's diagnosis (default 5 small, 0 production)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_config(ROOT / "conformance.yaml").for_tier(args.tier)
    budget = args.diagnosis_budget if args.diagnosis_budget is not None else (5.0 if args.tier == "small" else 0.0)
    config = dataclasses.replace(config, diagnosis_budget=budget)
    manifest = read_manifest(config.goldens)
    patterns = parse_select(args.select)
    cases = [c for c in manifest if matches(c, patterns)]
    impls = implementations()
    names = args.impl or list(impls)
    unknown = [n for n in names if n not in impls]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; known: {', '.join(impls)}")
    print(
        f"# GPU arithmetic against the harness as it is: tier {args.tier}, {len(cases)} case(s), "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )
    summary = []
    for name in names:
        cls, what = impls[name]
        log = TermLog()
        impl = recording(cls, log)()
        results, t0 = [], time.perf_counter()
        for case_id in cases:
            log.case = case_id
            results.append(run_case(case_id, config, impl, name, manifest))
        elapsed = time.perf_counter() - t0
        by_component: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for r in results:
            by_component[r.component][r.status] += 1
        counts = defaultdict(int)
        for r in results:
            counts[r.status] += 1
        failing = {c: s for c, s in by_component.items() if any(k not in ("pass", "unsupported", "partial") for k in s)}
        bad = {
            c: sum(v for k, v in s.items() if k not in ("pass", "unsupported", "partial")) for c, s in failing.items()
        }
        summary.append((name, what, dict(counts), {c: f"{bad[c]}/{sum(s.values())}" for c, s in failing.items()}))
        print(f"\n## {name}: {what} ({cls.__doc__.strip().splitlines()[0]}) [{elapsed:.0f} s]")
        print("  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print(
            "  per component: "
            + (
                "; ".join(
                    f"{c} " + " ".join(f"{k} {v}" for k, v in sorted(s.items()))
                    for c, s in sorted(by_component.items())
                    if set(s) != {"pass"} or c in failing
                )
                or "every case passes"
            )
        )
        for line in failing_lines(results):
            print(line)
        for line in headroom_lines(results) + term_lines(log, results):
            print(line)
        sys.stdout.flush()
    print("\n## Summary: which components fail (failed / cases)")
    for name, what, counts, failing in summary:
        fails = ", ".join(f"{c} {v}" for c, v in sorted(failing.items())) or "none"
        print(
            f"  {name:24s} {what:40s} pass {counts.get('pass', 0):3d}, fail {counts.get('fail', 0):3d}, "
            f"other {sum(v for k, v in counts.items() if k not in ('pass', 'fail')):3d} | failing: {fails}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
