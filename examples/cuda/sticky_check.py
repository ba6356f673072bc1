"""gpu_check step: a sticky CUDA error is charged to its case and its child replaced by a fork.

Runs `conformance run --device cuda -n 2` with tests/impls/wrong.py:StickyCudaError on norm.rms
into the report dir given; exit 0 when exactly the faulting case did not pass and the others did.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(report_dir: str) -> int:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "v41_conformance",
            "run",
            "--device",
            "cuda",
            "-n",
            "2",
            "--impl",
            "tests/impls/wrong.py:StickyCudaError",
            "--select",
            "norm.rms",
            "--report-dir",
            report_dir,
        ],
        cwd=ROOT,
    )
    cases = {c["id"]: c for c in json.loads((Path(report_dir) / "results.json").read_text())["cases"]}
    bad = {i: c for i, c in cases.items() if c["status"] != "pass"}
    for case_id, case in sorted(cases.items()):
        print(f"{case_id}: {case['status']}")
    ok = (
        proc.returncode == 1
        and len(cases) > 1
        and len(bad) == 1
        and "restarted after this CUDA error" in next(iter(bad.values()))["message"]
    )
    print("sticky CUDA error charged to its case, child replaced" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
