"""The harness's own cost on GPU-sized work: the production tier's attention and indexer cases judged with
an implementation that answers instantly, beside the reference's own run of the same case.

For every selected production case, in this process, one after another:
- load: the golden read and verified (its regenerated inputs from the cache, docs/tiers.md);
- reference: the reference run on the case's inputs (what a correct kernel replaces);
- replay: the golden's own outputs judged as an implementation's answer (bit for bit: the chain's fast
  path; an instant implementation, so what is timed is the harness's judgement alone);
- perturbed: the same with every float output moved as a 14-bit tensor-core accumulator moves it (one
  bf16 ulp at 1 element in 64, so the rows that hold one differ and the chain re-derives them from the
  implementation's values, as it does for a passing GPU-arithmetic answer).
Prints the seconds of each and the ratio of the harness's own work (load + perturbed judging) to the
reference's run. Aim: at most 0.25 (issue 36). The production goldens must be built first:
`conformance generate --tier production --select 'attention/*,indexer/*'` (make test-production does).

    python benchmarks/production_judging.py [--select 'attention/*,indexer/*']
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from v41_conformance.config import load_config  # noqa: E402
from v41_conformance.golden import load_verified, read_manifest  # noqa: E402
from v41_conformance.ids import matches, parse_select  # noqa: E402
from v41_conformance.known import get  # noqa: E402
from v41_conformance.runner import CaseResult, _judge  # noqa: E402
from v41_conformance.ulps import ulp_of  # noqa: E402

AIM = 0.25
EVERY = 64  # one element in EVERY moved by one ulp


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


def seconds(work) -> tuple[float, object]:
    start = time.perf_counter()
    value = work()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--select", default="attention/*,indexer/*")
    parser.add_argument("--tier", default="production", help="production (default); small to try the script")
    args = parser.parse_args()
    config = load_config(ROOT / "conformance.yaml").for_tier(args.tier)
    manifest = read_manifest(config.goldens)
    chosen = [c for c in sorted(manifest) if matches(c, parse_select(args.select))]
    if not chosen:
        sys.exit(
            f"no production golden matches {args.select!r}: build them first (make test-production, or "
            "conformance generate --tier production --select ...)"
        )
    print(f"{'case':48s} {'load':>6s} {'ref':>7s} {'replay':>7s} {'perturb':>8s} {'own/ref':>8s}  verdicts")
    for case_id in chosen:
        load_s, golden = seconds(lambda: load_verified(config.goldens, case_id, manifest, config.generate_command))
        component = get(golden.meta["component"])
        params = component.with_defaults(golden.meta["params"])
        ref_s, _ = seconds(lambda: component.reference_golden({k: v.clone() for k, v in golden.inputs.items()}, params))
        verdicts = []
        times = []
        tolerant = lambda name: config.policy(component, name, {}, dtype=golden.outputs[name].dtype).tolerant  # noqa: E731
        for answer in (golden.outputs, perturbed(golden.outputs, tolerant)):
            result = CaseResult(case_id, component.name, "error")
            spent, _ = seconds(lambda: _judge(component, golden, dict(answer), params, config, {}, result))
            times.append(spent)
            verdicts.append(result.status)
        own = load_s + times[1]
        print(
            f"{case_id:48s} {load_s:6.2f} {ref_s:7.2f} {times[0]:7.2f} {times[1]:8.2f} {own / ref_s:8.3f}  "
            f"{'/'.join(verdicts)}" + ("" if own / ref_s <= AIM else f"  (over the aim {AIM})"),
            flush=True,
        )


if __name__ == "__main__":
    main()
