"""Calibration of the accepted-difference verdicts on fresh data (docs/verdicts.md, the numbers).

Builds attention, indexer and kv.finish goldens in memory from the case files with fresh data
seeds (nothing is written), runs the three gate implementations of the test suite on them
(upstream arithmetic, float64, plain-softmax attention) and reports, per component and gate:
cases, how many pass with the configured tolerances, the boundary flips and near-tie rows they
needed, and how many would fail with tighter settings (boundary_ulps 0.5 / 1, near_tie_ulps 0).

    python benchmarks/calibrate_verdicts.py [--seeds 8]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "impls")]

from gate_float64 import Float64  # noqa: E402
from gate_upstream import UpstreamTorch  # noqa: E402
from wrong_attention import PlainSoftmax  # noqa: E402

from v41_conformance.cases import load_cases, seed_for  # noqa: E402
from v41_conformance.config import load_config  # noqa: E402
from v41_conformance.generate import build_golden  # noqa: E402
from v41_conformance.known import get  # noqa: E402
from v41_conformance.runner import CaseResult, judge_golden  # noqa: E402

GATES = {"upstream": UpstreamTorch, "float64": Float64, "plain-softmax": PlainSoftmax}
ONLY = {"plain-softmax": ("attention",)}  # the plain softmax is the reference elsewhere
SELECT = ["attention/*", "indexer/*", "kv.finish/*"]
VARIANTS = {  # label -> tolerance overrides applied on top of conformance.yaml
    "configured": {},
    "boundary_ulps 1": {"quantised": {"boundary_ulps": 1}},
    "boundary_ulps 0.5": {"quantised": {"boundary_ulps": 0.5}},
    "near_tie_ulps 0": {"indexer.ids": {"near_tie_ulps": 0}, "attention.compressed_ids": {"near_tie_ulps": 0}},
}


def fresh(spec, seed: int):
    """The case with other random data: a new data seed (shared data) or a new case name."""
    build = dict(spec.build)
    if "data_seed" in build:
        build["data_seed"] = seed_for(f"{spec.id}/calibration-{seed}")
        return dataclasses.replace(spec, build=build)
    return dataclasses.replace(spec, name=f"{spec.name}-calibration-{seed}")


def config_variant(config, overrides: dict):
    variant = copy.deepcopy(config)
    variant._policies = {}
    tol = variant.tolerances
    for key, values in overrides.items():
        if key == "quantised":
            tol.setdefault("defaults", {}).setdefault("quantised", {}).update(values)
        else:
            component, output = key.split(".", 1) if key.count(".") == 1 else key.rsplit(".", 1)
            tol.setdefault("components", {}).setdefault(component, {}).setdefault(output, {}).update(values)
    return variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    config = load_config(ROOT / "conformance.yaml")
    configs = {label: config_variant(config, o) for label, o in VARIANTS.items()}
    specs = load_cases(config.cases, SELECT)
    tally: dict[tuple[str, str], Counter] = {}
    failures: list[str] = []
    for seed in range(args.seeds):
        for spec in specs:
            golden = build_golden(fresh(spec, seed), config)
            component = get(spec.component)
            for gate_name, gate in GATES.items():
                if spec.component not in ONLY.get(gate_name, (spec.component,)):
                    continue
                for label, cfg in configs.items():
                    result = CaseResult(spec.id, spec.component, "error")
                    judge_golden(component, golden, gate(), cfg, {}, result)
                    t = tally.setdefault((spec.component, gate_name), Counter())
                    if result.status == "unsupported":
                        t["unsupported"] += label == "configured"
                        continue
                    t[f"cases ({label})"] += 1
                    t[f"pass ({label})"] += result.status == "pass"
                    if label == "configured" and result.status != "pass":
                        failures.append(f"{gate_name} {spec.id} seed {seed}: {result.status}: {result.message}")
                    if label == "configured":
                        t["boundary flips"] += result.boundary_flips
                        t["near-tie rows"] += result.near_tie_rows
                        t["tie rows"] += result.tie_rows
    print(f"{args.seeds} fresh seed(s) of {len(specs)} case(s): {', '.join(SELECT)}")
    for (component, gate_name), t in sorted(tally.items()):
        runs = t["cases (configured)"]
        line = [f"{component:10s} {gate_name:13s} cases {runs:3d} (unsupported {t['unsupported']})"]
        line += [f"pass {label}: {t[f'pass ({label})']}" for label in VARIANTS]
        line += [f"flips {t['boundary flips']}", f"near-tie rows {t['near-tie rows']}", f"tie rows {t['tie rows']}"]
        print("  ".join(line))
    for failure in failures:
        print(f"\nFAILED {failure}")


if __name__ == "__main__":
    main()
