"""The harness's own cost on GPU-sized work: the production tier's attention and indexer cases judged with
an implementation that answers instantly, beside the reference's own run of the same case.

For every selected production case, in this process, one after another:
- load: the golden read and verified (its regenerated inputs from the cache, docs/tiers.md);
- reference: the reference run on the case's inputs (what a correct kernel replaces);
- replay: the golden's own outputs judged as an implementation's answer (bit for bit: the chain's fast
  path; an instant implementation, so what is timed is the harness's judgement alone);
- perturbed: the same with every float output moved as a 14-bit tensor-core accumulator moves it (one
  bf16 ulp at 1 element in 64, so the rows that hold one differ and the chain re-derives them from the
  implementation's values; a synthetic answer: it returns no intermediate, so what it is judged given
  is the reference's);
- with `--answer gate:NAME` (a GPU-arithmetic gate of tests/impls/gpu_gates.py: Fp8Tc14, AllGpu, ...):
  that gate's real answer (every output and intermediate, as a passing GPU-arithmetic implementation
  returns them), computed once outside the timed region and cached under /tmp (ANSWERS) by case and
  golden hash; its judgement is timed like the others'.
Prints the seconds of each and the ratio of the harness's own work (load + judging) to the reference's
run: for the perturbed answer, and for each gate's. Aim: at most 0.25 (issue 36). The production goldens
must be built first: `conformance generate --tier production --select 'attention/*,indexer/*'` (make
test-production does).

    python benchmarks/production_judging.py [--select 'attention/*,indexer/*'] [--answer gate:Fp8Tc14]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from v41_conformance import regenerated  # noqa: E402
from v41_conformance.config import load_config  # noqa: E402
from v41_conformance.golden import load_verified, read_manifest  # noqa: E402
from v41_conformance.ids import matches, parse_select  # noqa: E402
from v41_conformance.known import get  # noqa: E402
from v41_conformance.runner import CaseResult, _judge  # noqa: E402
from v41_conformance.ulps import ulp_of  # noqa: E402

AIM = 0.25
EVERY = 64  # one element in EVERY moved by one ulp
ANSWERS = Path("/tmp/production_judging")  # the gates' answers, by case, golden hash and gate


def perturbed(outputs: dict[str, torch.Tensor], tolerant) -> dict[str, torch.Tensor]:
    """Every bf16 output judged by a tolerance (`tolerant(name)`) with one element in EVERY moved up by one
    ulp; ids, codes and quantised cache rows as they are (a GPU moves those only across a boundary)."""
    out = {}
    for name, value in outputs.items():
        if value.dtype != torch.bfloat16 or not tolerant(name):
            out[name] = value
            continue
        flat = value.clone().reshape(-1)
        chosen = flat[::EVERY]
        moved = (chosen.double() + ulp_of(chosen, torch.bfloat16).double()).to(torch.bfloat16)
        flat[::EVERY] = torch.where(torch.isfinite(chosen), moved, chosen)
        out[name] = flat.reshape(value.shape)
    return out


def gate_answer(component, golden, params, case_id: str, gate: str) -> dict[str, torch.Tensor]:
    """The answer of the GPU-arithmetic gate `gate` (tests/impls/gpu_gates.py) on the golden's case: from
    the cache when an earlier run computed it, else run (minutes at production) and cached."""
    impls = str(ROOT / "tests" / "impls")
    if impls not in sys.path:
        sys.path.insert(0, impls)
    import gpu_gates  # noqa: PLC0415  (tests/impls: only with --answer)

    return cached_answer(component, golden, params, case_id, gate, gpu_gates.GATES[gate])


def cached_answer(component, golden, params, case_id: str, label: str, make) -> dict[str, torch.Tensor]:
    """The answer of the implementation `make()` (labelled `label`) on the golden's case: from the cache
    (ANSWERS) when an earlier run computed it, else run (minutes at production) and cached."""
    cached = ANSWERS / f"{case_id.replace('/', '__')}.{golden.sha256[:16]}.{label}.pt"
    if cached.exists():
        return torch.load(cached)
    from v41_conformance.runner import _execute  # noqa: PLC0415

    result = CaseResult(case_id, component.name, "error")
    start = time.perf_counter()
    answer = _execute(component, make(), golden, params, result)
    if answer is None:
        sys.exit(f"{label} on {case_id}: {result.status} {result.message}")
    print(f"  ({label}'s answer to {case_id} computed in {time.perf_counter() - start:.0f} s)", flush=True)
    ANSWERS.mkdir(parents=True, exist_ok=True)
    torch.save(answer, cached.with_suffix(".tmp"))
    cached.with_suffix(".tmp").replace(cached)
    return answer


def seconds(work) -> tuple[float, object]:
    start = time.perf_counter()
    value = work()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--select", default="attention/*,indexer/*")
    parser.add_argument("--tier", default="production", help="production (default); small to try the script")
    parser.add_argument(
        "--answer",
        action="append",
        default=[],
        metavar="gate:NAME",
        help="also judge a GPU-arithmetic gate's real answer (tests/impls/gpu_gates.py GATES; repeatable)",
    )
    parser.add_argument("--prepare", action="store_true", help="only compute and cache the gates' answers")
    args = parser.parse_args()
    gates = []
    for spec in args.answer:
        kind, _, name = spec.partition(":")
        if kind != "gate" or not name:
            parser.error(f"--answer takes gate:NAME, got {spec!r}")
        gates.append(name)
    config = load_config(ROOT / "conformance.yaml").for_tier(args.tier)
    manifest = read_manifest(config.goldens)
    chosen = [c for c in sorted(manifest) if matches(c, parse_select(args.select))]
    if not chosen:
        sys.exit(
            f"no production golden matches {args.select!r}: build them first (make test-production, or "
            "conformance generate --tier production --select ...)"
        )
    head = f"{'case':48s} {'load':>6s} {'ref':>7s} {'replay':>7s} {'perturb':>8s} {'own/ref':>8s}"
    for gate in gates:
        head += f" {gate[:12]:>12s} {'own/ref':>8s}"
    if not args.prepare:
        print(head + "  verdicts")
    for case_id in chosen:

        def load():
            golden = load_verified(config.goldens, case_id, manifest, config.generate_command)
            regenerated.restore(golden, get(golden.meta["component"]))  # the inputs the golden does not store
            return golden

        load_s, golden = seconds(load)
        component = get(golden.meta["component"])
        params = component.with_defaults(golden.meta["params"])
        answers = {gate: gate_answer(component, golden, params, case_id, gate) for gate in gates}
        if args.prepare:
            continue
        ref_s, _ = seconds(lambda: component.reference_golden({k: v.clone() for k, v in golden.inputs.items()}, params))
        verdicts = []
        times = []
        tolerant = lambda name: config.policy(component, name, {}, dtype=golden.outputs[name].dtype).tolerant  # noqa: E731
        for answer in (golden.outputs, perturbed(golden.outputs, tolerant), *answers.values()):
            result = CaseResult(case_id, component.name, "error")
            spent, _ = seconds(lambda: _judge(component, golden, dict(answer), params, config, {}, result))
            times.append(spent)
            verdicts.append(result.status)
        ratios = [(load_s + t) / ref_s for t in times[1:]]
        line = f"{case_id:48s} {load_s:6.2f} {ref_s:7.2f} {times[0]:7.2f} {times[1]:8.2f} {ratios[0]:8.3f}"
        for spent, ratio in zip(times[2:], ratios[1:]):
            line += f" {spent:12.2f} {ratio:8.3f}"
        over = max(ratios) > AIM
        print(f"{line}  {'/'.join(verdicts)}" + (f"  (over the aim {AIM})" if over else ""), flush=True)


if __name__ == "__main__":
    main()
