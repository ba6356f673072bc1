"""How many fresh cases per second `conformance fuzz` builds and judges with the reference, per
component, measured in one run (the reference's time bounds what fits in a budget).

    .venv/bin/python benchmarks/fuzz_rate.py [--cases 120] [--seed 0] [--budget SECONDS]

With --budget it instead runs `fuzz --budget` and reports whether every component was reached.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from v41_conformance.config import load_config  # noqa: E402
from v41_conformance.fuzz import FuzzOptions, fuzz  # noqa: E402
from v41_conformance.known import components  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=None)
    args = parser.parse_args()
    config = load_config(ROOT / "conformance.yaml")
    with tempfile.TemporaryDirectory() as folder:
        options = FuzzOptions(
            impl="reference",
            select=[],
            report_dir=Path(folder) / "fuzz",
            seed=args.seed,
            budget_s=args.budget,
            cases=None if args.budget else args.cases,
        )
        doc = fuzz(config, options)
    stats = doc["fuzz"]["components"]
    print(
        f"fuzz --impl reference, seed {args.seed}, "
        + (f"budget {args.budget:g} s" if args.budget else f"{args.cases} cases")
        + f": {doc['duration_s']:.1f} s wall"
    )
    print(f"{'component':<22} {'tried':>6} {'failed':>6} {'cases/s':>8}")
    for name, c in stats.items():
        print(f"{name:<22} {c['tried']:>6} {c['failed']:>6} {c['cases_per_s'] or 0:>8.1f}")
    reached = {n for n, c in stats.items() if c["tried"]}
    missing = sorted(set(components()) - reached)
    print(f"components reached: {len(reached)}/{len(components())}" + (f"; missing {missing}" if missing else ""))
    print(f"failures: {len(doc['fuzz']['failures'])}; exit code {doc['exit_code']}")


if __name__ == "__main__":
    main()
