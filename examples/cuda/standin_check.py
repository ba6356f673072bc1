"""gpu_check step: the CPU's stand-in for a CUDA device mixes tensors exactly where a real GPU does.

tests/device_standin.py plays the GPU in `make test` (a port's inputs on "the device", anything it
makes without `device=` on the CPU, and the same error where the two meet). Its rules are a table of
mixed-device patterns (MIXING), each marked accepted or refused; this runs every pattern on the real
GPU and on the stand-in and exits 0 when all three agree: the table, the GPU and the stand-in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from device_standin import MIXING, accepts, standin_accepts  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("standin_check: no CUDA device", file=sys.stderr)
        return 2
    disagree = 0
    for name, (expected, pattern) in MIXING.items():
        gpu = accepts(pattern, lambda v: torch.tensor(v, device="cuda"), lambda v: torch.tensor(v))
        standin = standin_accepts(pattern)
        ok = gpu == expected == standin
        disagree += not ok
        word = {True: "accepts", False: "refuses"}
        print(f"{'ok ' if ok else 'BAD'} {name}: table {word[expected]}, GPU {word[gpu]}, stand-in {word[standin]}")
    print(f"{len(MIXING) - disagree}/{len(MIXING)} patterns agree")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
