"""What the diagnosis of failing cases costs (docs/diagnosis.md): a run of wrong implementations over
small-tier cases, judged with the diagnosis on and off, side by side in one process.

Prints, per implementation and in total, the failing cases, the CPU seconds with and without the
diagnosis, the extra per failing case, the re-runs of the reference it made, and what 100 failing
cases of this mix pay for it. The bound is work, not time: at most --budget re-runs per case
(default the harness's), each about one run of the reference on that case, so the worst a case can
cost is its budget times its reference run (printed per implementation). One thread, CPU time: the
figures do not move with the machine's load.

    python benchmarks/diagnosis_cost.py [--budget RERUNS] [--repeats 2]

With --production: a failing production attention case instead (issue 37's aim: judged and diagnosed
within 2x the reference's own run of it). Each wrong kernel's answer is computed once outside the timed
region (cached under /tmp, as benchmarks/production_judging.py caches its gates'), then the case is
judged with the diagnosis on (the production budget) beside the reference's run; prints both (CPU
seconds of the one thread: a neighbour's load moves neither), their ratio, the re-runs, stage screens
and confirmations along the chain the diagnosis made, and what it named. Needs the production goldens (`conformance generate --tier production --select 'attention/*'`).

    python benchmarks/diagnosis_cost.py --production [--select 'attention/*'] [--kernels NormBf16BeforeWeight]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "impls"), str(ROOT / "benchmarks")]

from v41_conformance.config import DIAGNOSIS_BUDGET, load_config  # noqa: E402
from v41_conformance.golden import read_manifest  # noqa: E402
from v41_conformance.ids import matches, parse_select  # noqa: E402
from v41_conformance.runner import run_case  # noqa: E402


def mix() -> list[tuple[str, object, str]]:
    """(label, implementation, cases): a spread of components, from quantisers to attention."""
    import wrong
    import wrong_compressor
    import wrong_fp8
    import wrong_indexer
    import wrong_kernels

    return [
        ("TiesAwayE2M1", wrong.TiesAwayE2M1(), "quant.*"),
        ("ScoresWithoutRelu", wrong_indexer.ScoresWithoutRelu(), "indexer.scores/*"),
        ("LowestIndexTies", wrong_indexer.LowestIndexTies(), "indexer.select/*"),
        ("Unquantised", wrong_fp8.Unquantised(), "linear.fp8/*-4x256x64,linear.fp8/saturating-*"),
        ("ChannelSoftmax", wrong_compressor.ChannelSoftmax(), "compressor/r2-tiny-*"),
        ("NormBf16BeforeWeight", wrong_kernels.NormBf16BeforeWeight(), "attention/a-p21-d1x11-upstream"),
    ]


def production_mix() -> list[tuple[str, object]]:
    """(label, make): wrong attention kernels whose first divergent stage is early (qr) and late (o)."""
    import wrong_kernels

    return [("NormBf16BeforeWeight", wrong_kernels.NormBf16BeforeWeight), ("SinkLeftOut", wrong_kernels.SinkLeftOut)]


def cpu_seconds(work) -> float:
    """CPU seconds of `work()` on this thread (one thread: what a neighbour's load does not move)."""
    start = time.process_time()
    work()
    return time.process_time() - start


def production(select: str, kernels: str = "") -> None:
    """The failing production cases judged and diagnosed, beside the reference's run (module docstring)."""
    import torch

    from production_judging import cached_answer

    from v41_conformance import regenerated
    from v41_conformance.golden import load_verified
    from v41_conformance.known import get
    from v41_conformance.runner import CaseResult, judged_and_diagnosed

    config = load_config(ROOT / "conformance.yaml").for_tier("production")
    manifest = read_manifest(config.goldens)
    chosen = [c for c in sorted(manifest) if matches(c, parse_select(select))]
    if not chosen:
        sys.exit(f"no production golden matches {select!r}: conformance generate --tier production --select ...")
    torch.set_num_threads(1)
    print(
        f"{'case':40s} {'implementation':22s} {'ref s':>7s} {'judged s':>9s} {'ratio':>6s} re-runs screens confirmed  named"
    )
    for case_id in chosen:
        golden = load_verified(config.goldens, case_id, manifest, config.generate_command)
        component = get(golden.meta["component"])
        regenerated.restore(golden, component)
        params = component.with_defaults(golden.meta["params"])
        for label, make in production_mix():
            if kernels and label not in kernels.split(","):
                continue
            answer = cached_answer(component, golden, params, case_id, label, make)
            ref_s = cpu_seconds(
                lambda: component.reference_golden({k: v.clone() for k, v in golden.inputs.items()}, params)
            )
            result = CaseResult(case_id, component.name, "error")

            judged_s = cpu_seconds(
                lambda: judged_and_diagnosed(component, golden, dict(answer), params, config, {}, result)
            )
            d = result.diagnosis or {}
            named = sorted({v for m in d.get("matches", []) for v in m["variants"]})
            print(
                f"{case_id:40s} {label:22s} {ref_s:7.1f} {judged_s:9.1f} {judged_s / ref_s:6.2f} "
                f"{d.get('tried', 0):7d} {d.get('screened', 0):7d} {d.get('confirmed', 0):9d}  "
                f"{result.status}: {', '.join(named) or '-'}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=DIAGNOSIS_BUDGET)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--production", action="store_true", help="a failing production attention case")
    parser.add_argument("--select", default="attention/*", help="with --production: the production cases")
    parser.add_argument("--kernels", default="", help="with --production: the wrong kernels (default both)")
    args = parser.parse_args()
    if args.production:
        return production(args.select, args.kernels)
    config = load_config(ROOT / "conformance.yaml")
    manifest = read_manifest(config.goldens)
    import torch

    torch.set_num_threads(1)
    on, off = replace(config, diagnosis_budget=args.budget), replace(config, diagnosis_budget=0)
    total_on = total_off = 0.0
    total_failing = 0
    print(
        f"{'implementation':22s} {'failing':>7s} {'off s':>8s} {'on s':>8s} {'extra/case s':>12s} "
        f"{'re-runs/case':>12s} {'worst case s':>12s}  named"
    )
    total_reruns = 0
    for label, impl, pattern in mix():
        ids = [c for c in sorted(manifest) if matches(c, parse_select(pattern))]

        def timed(cfg):
            start = time.process_time()
            results = [run_case(c, cfg, impl, label, manifest) for c in ids]
            return time.process_time() - start, results

        t_off = min(timed(off)[0] for _ in range(args.repeats))
        runs = [timed(on) for _ in range(args.repeats)]
        t_on, results = min(runs, key=lambda r: r[0])
        failing = [r for r in results if r.status in ("fail", "error")]
        named = sorted({v for r in failing for m in (r.diagnosis or {}).get("matches", []) for v in m["variants"]})
        extra = (t_on - t_off) / max(len(failing), 1)
        reruns = [r.diagnosis["tried"] for r in failing if r.diagnosis]
        worst = args.budget * t_off / max(len(ids), 1)  # a re-run costs about one run of the case
        total_reruns += sum(reruns)
        print(
            f"{label:22s} {len(failing):7d} {t_off:8.2f} {t_on:8.2f} {extra:12.3f} "
            f"{sum(reruns) / max(len(reruns), 1):12.1f} {worst:12.2f}  {', '.join(named) or '-'}"
        )
        total_on, total_off, total_failing = total_on + t_on, total_off + t_off, total_failing + len(failing)
    per_case = (total_on - total_off) / max(total_failing, 1)
    print(f"{'all':22s} {total_failing:7d} {total_off:8.2f} {total_on:8.2f} {per_case:12.3f}")
    print(
        f"100 failing cases of this mix pay {100 * per_case:.0f} CPU s for their diagnosis "
        f"({total_reruns / max(total_failing, 1):.1f} re-runs per case, at most {args.budget} each); "
        f"with the diagnosis on, this run took {total_on / max(total_off, 1e-9):.2f}x its time without"
    )


if __name__ == "__main__":
    main()
