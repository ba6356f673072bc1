"""gpu_check step: outputs left on the GPU are each case's `device error`, and the run goes on.

Runs `conformance run` (no `--device`: the harness moves nothing back) with
tests/impls/wrong.py:LeftOnDevice, which leaves every output on the device, over components judged
one by one (quant.e2m1, linear.fp8, indexer.scores) and along a chain (indexer), into the report dir
given; exit 0 when the run finished with exit 1 and every case is a device error naming the device.
`--device meta` runs the same check without a GPU (tests/test_wrong_values.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SELECT = "quant.e2m1,linear.fp8,indexer.scores,indexer"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_dir")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    env = {**os.environ, "CONFORMANCE_TEST_DEVICE": args.device}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "v41_conformance",
            "run",
            "--impl",
            "tests/impls/wrong.py:LeftOnDevice",
            "--select",
            SELECT,
            "--report-dir",
            args.report_dir,
        ],
        cwd=ROOT,
        env=env,
    )
    cases = json.loads((Path(args.report_dir) / "results.json").read_text())["cases"]
    wrong = [
        c
        for c in cases
        if not (
            c["status"] == "error" and c["kind"] == "device error" and f"tensor is on {args.device}" in c["message"]
        )
    ]
    for case in wrong:
        print(f"{case['id']}: {case['status']} {case['kind']} {case['message'][:200]}")
    components = {c["id"].split("/")[0] for c in cases}
    ok = proc.returncode == 1 and components == set(SELECT.split(",")) and not wrong
    print(f"{len(cases)} cases left on {args.device}: each a device error" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
