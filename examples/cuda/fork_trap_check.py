"""gpu_check step: isolation children use CUDA whoever initialised the driver first (the fork trap).

1. The pytest plugin from a folder whose conftest.py calls `torch.cuda.is_available()` (which
   initialises the driver in pytest's process, as a team's GPU-skip line does), with the Triton
   example on the GPU (--conformance-device cuda).
2. `conformance run --device cuda -n 2` from a `python -c` that called `torch.cuda.is_available()`
   first in the same process (the driver initialised, torch's own flag still unset).
Exit 0 when every case of both passed and results.json says the fork server was a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPL = f"{ROOT}/examples/triton_impl.py:TritonImpl"
SELECT = "quant.e2m1,quant.fp4_e8m0,indexer.scores"
CONFTEST = """import torch

if not torch.cuda.is_available():  # the most common line in a GPU project's conftest
    raise SystemExit("gpu_check: no CUDA device in the conftest")
"""
CLI = """import sys, torch
assert torch.cuda.is_available() and not torch.cuda.is_initialized()  # the driver is initialised, torch's flag is not
from v41_conformance.cli import entry
sys.argv = ["conformance", "run", "--device", "cuda", "-n", "2", "--impl", sys.argv[1], "--select", sys.argv[2],
            "--report-dir", sys.argv[3]]
entry()
"""


def judged(name: str, report_dir: Path, returncode: int) -> bool:
    doc = json.loads((report_dir / "results.json").read_text())
    bad = [f"{c['id']}: {c['status']}: {c['message'][:200]}" for c in doc["cases"] if c["status"] != "pass"]
    children = doc.get("children") or {}
    print(
        f"{name}: exit {returncode}, {len(doc['cases']) - len(bad)}/{len(doc['cases'])} passed; children: "
        f"{children.get('start')}, the server {children.get('server')}: {children.get('why')}"
    )
    for line in bad:
        print(f"  {line}")
    return returncode == 0 and not bad and len(doc["cases"]) > 0 and children.get("server") == "a fresh interpreter"


def main(out: str) -> int:
    out_dir = Path(out).resolve()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "conftest.py").write_text(CONFTEST)
        plugin = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "--conformance-impl",
                IMPL,
                "--conformance-device",
                "cuda",
                "--conformance-select",
                SELECT,
                "--conformance-report-dir",
                str(out_dir / "plugin"),
            ],
            cwd=folder,
        )
    ok = judged("plugin after a conftest's torch.cuda.is_available()", out_dir / "plugin", plugin.returncode)
    cli = subprocess.run([sys.executable, "-c", CLI, IMPL, SELECT, str(out_dir / "cli")], cwd=ROOT)
    ok = (
        judged("conformance run -n 2 after torch.cuda.is_available() in its process", out_dir / "cli", cli.returncode)
        and ok
    )
    print("children used CUDA after the driver was initialised first" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
