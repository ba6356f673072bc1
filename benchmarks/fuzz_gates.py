"""The gates on fresh cases: do correct implementations that round differently pass what `fuzz` samples?

`conformance fuzz` judges fresh cases with the tolerances calibrated on the frozen goldens. A
tolerance that only holds on those shapes would make fuzz report a correct kernel as failing. This
script samples cases from every component's space (as fuzz does, deterministic per seed), builds
each golden in memory, runs the gate implementations of the test suite on it (upstream's own
torch arithmetic, float64 with upstream's rounding points, and the GPU-arithmetic gates of
tests/impls/gpu_gates.py: --gpu; every attention core and GEMM order: --forms; all: --all; or --gates
to choose; the registry is tests/impls/correct_forms.py) and prints, per component and gate:
cases judged, failures, the accepted differences they needed (boundary flips, tie and near-tie
rows) and the worst `bound_used` per output (the worst element's |diff| over its bound: 1.0 is
the edge). Failures are listed with the command that re-creates them.

    python benchmarks/fuzz_gates.py [--cases 40] [--seed 0] [--select 'indexer.*'] [--gpu] [--forms] [--all]
                                    [--gates AllGpu,Fp8Tc14]

--forms adds every attention core (PlainSoftmax, TiledFp32P, Tiles128, OnePassBf16P, the float64 sink
column and sink factor), the GEMM orders (Fp8K128, BlasBf16) and the forms that drop one internal
rounding (ExactHeadDots, ExactHeadProducts, ExactPooledRow, ExactZ), each on the components it changes.
--progress N prints the tally every N cases of a component (long runs). --indices 46,47,84 judges those
draws instead of a contiguous range (re-checking the draws a new check reaches). Where an output carries
the logit-scale check (sparse_attn's o), the table adds the worst |z| in spreads (the limit is 6).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "impls")]

import correct_forms as forms  # noqa: E402

from v41_conformance.config import load_config  # noqa: E402
from v41_conformance.differences import DIFFERENCES  # noqa: E402
from v41_conformance.fuzz_sample import draw, selected_spaces  # noqa: E402
from v41_conformance.generate import build_golden  # noqa: E402
from v41_conformance.known import get  # noqa: E402
from v41_conformance.runner import CaseResult, judge_golden  # noqa: E402

GATES, MAKERS = forms.SPECS, forms.MAKERS
CPU_GATES = tuple(forms.CPU)
STATUSES = ("pass", "fail", "error", "crash", "timeout")
FORMS = (*forms.CORES, *forms.ORDERS, *forms.PRECISE)


def _progress(name: str, seconds: float, tally: dict) -> None:
    judged = {g: t for (c, g), t in tally.items() if c == name and g != "-"}
    print(
        f"# {name}: {seconds:.0f} s, "
        + ", ".join(f"{g} {t['pass']}/{sum(t[k] for k in STATUSES)}" for g, t in sorted(judged.items())),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=40, help="cases per component (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first draw index (shards: --start 0 and --start N)")
    parser.add_argument(
        "--indices", default="", help="comma-separated draw indices instead of --start/--cases (re-checking draws)"
    )
    parser.add_argument("--progress", type=int, default=0, help="a tally line every N cases of a component")
    parser.add_argument("--select", action="append", default=[], help="component patterns (default: all)")
    parser.add_argument("--gpu", action="store_true", help="the GPU-arithmetic gates too (tests/impls/gpu_gates.py)")
    parser.add_argument("--forms", action="store_true", help="the attention cores and GEMM orders too")
    parser.add_argument("--all", action="store_true", help="every correct form: --gpu and --forms")
    parser.add_argument("--gates", default="", help="comma-separated gate names (default: upstream, float64)")
    args = parser.parse_args()
    config = load_config(ROOT / "conformance.yaml")
    chosen = [g for g in args.gates.split(",") if g] or [
        *CPU_GATES,
        *(forms.GPU if args.gpu or args.all else ()),
        *(FORMS if args.forms or args.all else ()),
    ]
    unknown = sorted(set(chosen) - set(MAKERS))
    if unknown:
        parser.error(f"unknown gate(s) {unknown}; known: {', '.join(MAKERS)}")
    gates = {name: MAKERS[name]() for name in chosen}
    tally: dict[tuple[str, str], Counter] = defaultdict(Counter)
    worst: dict[tuple[str, str, str], float] = defaultdict(float)
    share: dict[tuple[str, str, str], float] = defaultdict(float)
    scale_z: dict[tuple[str, str], float] = defaultdict(float)
    failures: list[str] = []
    started = time.perf_counter()
    seconds: Counter = Counter()
    patterns = [p for item in args.select for p in item.split(",") if p]
    indices = [int(i) for i in args.indices.split(",") if i] or list(range(args.start, args.start + args.cases))
    for name, space in selected_spaces(patterns).items():
        component = get(name)
        began = time.perf_counter()
        for done, index in enumerate(indices, 1):
            case = draw(space, args.seed, index)
            try:
                golden = build_golden(case.spec, config)
            except Exception:  # noqa: BLE001  (a draw the reference refuses is not judged, as in fuzz)
                tally[(name, "-")]["refused"] += 1
                continue
            for gate_name, gate in gates.items():
                if not forms.reaches(gate_name, name):
                    continue
                result = CaseResult(case.spec.id, name, "error")
                judge_golden(component, golden, gate, config, {}, result)
                t = tally[(name, gate_name)]
                t[result.status] += 1
                for d in DIFFERENCES:
                    t[d.column] += getattr(result, d.count)
                for output, verdict in (result.outputs or {}).items():
                    key = (name, gate_name, output.split(".", 1)[-1] if output[:1] == "s" and "." in output else output)
                    if verdict.get("bound_used") is not None:
                        worst[key] = max(worst[key], float(verdict["bound_used"]))
                    if verdict.get("diff_fraction") is not None:
                        share[key] = max(share[key], float(verdict["diff_fraction"]))
                    if verdict.get("logit_scale_z") is not None:  # the logit-scale check's spreads
                        scale_z[(name, gate_name)] = max(scale_z[(name, gate_name)], abs(verdict["logit_scale_z"]))
                if result.status not in ("pass", "unsupported"):
                    first = (result.message or "").splitlines()[:2]
                    print(f"# FAILED {gate_name} {case.spec.id} (index {index}): {result.status}", flush=True)
                    failures.append(
                        f"{gate_name} {case.spec.id}: {result.status}: {' / '.join(first)}\n"
                        f"    conformance fuzz --impl {GATES[gate_name]} --seed {args.seed} "
                        f"--index {index} --select {name}"
                    )
            if args.progress and done % args.progress == 0:
                _progress(name, time.perf_counter() - began, tally)
        seconds[name] += time.perf_counter() - began
        _progress(name, seconds[name], tally)
    elapsed = time.perf_counter() - started
    print(
        f"{len(indices)} fresh case(s) per component (draws {_span(indices)}), seed {args.seed}, "
        f"{elapsed:.0f} s; seconds per component: " + ", ".join(f"{n} {t:.0f}" for n, t in seconds.most_common())
    )
    print(
        f"{'component':20s} {'gate':15s} {'pass':>5s} {'fail':>5s} {'other':>5s} "
        + " ".join(f"{d.column:>6s}" for d in DIFFERENCES)
        + "  worst bound_used (share of elements differing) per output"
    )
    for (name, gate_name), t in sorted(tally.items()):
        if gate_name == "-":
            continue
        other = sum(
            v for k, v in t.items() if k not in ("pass", "fail") and k in ("error", "crash", "timeout", "unsupported")
        )
        used = ", ".join(
            f"{o} {u:.2f} ({share[(c, g, o)]:.1%})"
            for (c, g, o), u in sorted(worst.items())
            if c == name and g == gate_name
        )
        print(
            f"{name:20s} {gate_name:15s} {t['pass']:5d} {t['fail']:5d} {other:5d} "
            + " ".join(f"{t[d.column]:6d}" for d in DIFFERENCES)
            + f"  {used}"
            + (f"; worst |logit-scale z| {scale_z[(name, gate_name)]:.2f}" if (name, gate_name) in scale_z else "")
        )
    for failure in failures:
        print(f"\nFAILED {failure}")


def _span(indices: list[int]) -> str:
    contiguous = indices == list(range(indices[0], indices[0] + len(indices))) if indices else True
    return f"{indices[0]}-{indices[-1]}" if indices and contiguous else ",".join(map(str, indices))


if __name__ == "__main__":
    main()
