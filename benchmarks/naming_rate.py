"""What the diagnosis names on ports written apart from its catalogue (docs/diagnosis.md, "Naming rate"):
each port of tests/impls/ports.py and tests/impls/library_ports.py, with the bugs it is known to carry,
run through the CLI as a user runs it (default policy and budget, the components it changes), and per
port: the failing cases, those named with bugs the port has (at the case or at the run level), those
named with a bug it does not have, and those left unnamed.

The aim (issue 37): every failing case of every port named, and no name a port does not have. A port
whose bug no variant computes (`ScalesPerRow`, a layout no library writes) must stay unnamed.

    python benchmarks/naming_rate.py [--ports NormBeforeWeight,SglangCompressedKvBlocks32] [-n 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ROOT / "tests" / "impls"
STRICT = "strict_signed_zeros"

# label -> (file:class under tests/impls, the cases it runs, the variants it carries, impl config flags).
# Each port's docstring says what it does; the names here are the catalogue's for the same behaviour.
PORTS: dict[str, tuple[str, str, frozenset[str], tuple[str, ...]]] = {
    "HfLogitsBf16": (
        "ports.py:HfLogitsBf16",
        "sparse_attn/*,attention/*",
        frozenset({"attention-logits-bf16", "attention-eager-bf16-with-sinks"}),
        (),
    ),
    "NormOutputBf16": ("ports.py:NormOutputBf16", "norm.rms/*", frozenset({"rmsnorm-output-bf16"}), ()),
    "NormAllBf16": ("ports.py:NormAllBf16", "norm.rms/*", frozenset({"rmsnorm-bf16-throughout"}), ()),
    "SignTimesTableE2M1": (
        "ports.py:SignTimesTableE2M1",
        "quant.*",
        frozenset({"e2m1-zero-input-sign-lost"}),
        (STRICT,),
    ),
    "Fp8NoFloor": ("ports.py:Fp8NoFloor", "quant.fp8_ue8m0/*", frozenset({"fp8-no-amax-floor-at-all"}), ()),
    "YarnWithoutRamp": ("ports.py:YarnWithoutRamp", "rope.*", frozenset({"yarn-no-ramp"}), ()),
    "NormBeforeWeight": (
        "ports.py:NormBeforeWeight",
        "norm.rms/*,attention/*",
        frozenset({"rmsnorm-bf16-before-weight"}),
        (),
    ),
    "RopeTableBf16": ("ports.py:RopeTableBf16", "rope.apply/*,kv.finish/*", frozenset({"rope-bf16-table"}), ()),
    "NormAndRopeTable": (
        "ports.py:NormAndRopeTable",
        "attention/a-p21-*",
        frozenset({"rmsnorm-bf16-before-weight", "rope-bf16-table"}),
        (),
    ),
    "ScoresRaw": (
        "ports.py:ScoresRaw",
        "indexer.scores/*",
        frozenset({"index-scores-without-relu", "index-scores-without-head-weights"}),
        (),
    ),
    "CompressorNormBeforeWeight": (
        "ports.py:CompressorNormBeforeWeight",
        "compressor/*",
        frozenset({"rmsnorm-bf16-before-weight"}),
        (),
    ),
    "PolicyAndTies": (
        "ports.py:PolicyAndTies",
        "attention/*",
        frozenset({"stale-index-keys-other-policy", "candidate-leak-other-policy", "topk-lowest-index-ties"}),
        (),
    ),
    "RefNormAndSink": (
        "ports.py:RefNormAndSink",
        "attention/a-p21-*",
        frozenset({"rmsnorm-bf16-before-weight", "sink-left-out"}),
        (),
    ),
    "DeepGemmTiesTowardZero": (
        "library_ports.py:DeepGemmTiesTowardZero",
        "quant.*",
        frozenset({"e2m1-ties-toward-zero"}),
        (),
    ),
    "DeepGemmDequantTable": (
        "library_ports.py:DeepGemmDequantTable",
        "quant.*",
        frozenset({"e2m1-dequant-minus-zero-as-plus-zero"}),
        (STRICT,),
    ),
    "DeepGemmAmaxFloor": ("library_ports.py:DeepGemmAmaxFloor", "quant.*", frozenset({"fp4-amax-floor-1e-4"}), ()),
    "TrtllmAmaxFloor": ("library_ports.py:TrtllmAmaxFloor", "quant.*", frozenset({"fp4-amax-floor-1e-12"}), ()),
    "FlashMlaScaleFloor": ("library_ports.py:FlashMlaScaleFloor", "quant.*", frozenset({"fp8-scale-floor-1e-4"}), ()),
    "SglangCompressedKvBlocks32": (
        "library_ports.py:SglangCompressedKvBlocks32",
        "quant.fp4_e4m3/*,kv.finish/*",
        frozenset({"fp4-e4m3-as-pow2-blocks-32"}),
        (),
    ),
    "ScalesPerRow": ("library_ports.py:ScalesPerRow", "quant.fp4_e4m3/*,kv.finish/*", frozenset(), ()),
}


def names_of(case: dict) -> set[str]:
    """Every variant a case is named with: its matches (and what they cannot be told from), and the run's."""
    diagnosis = case.get("diagnosis") or {}
    names = {v for m in diagnosis.get("matches", []) for v in (*m["variants"], *m.get("indistinguishable", ()))}
    run_level = diagnosis.get("run_level")
    if run_level:
        names.add(run_level["variant"])
    return names


def judged(label: str, workers: str) -> tuple[list[dict], float]:
    """The port's run through the CLI: its failing and erroring cases' records, and the run's seconds."""
    spec, select, _, flags = PORTS[label]
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "v41_conformance", "run", "--select", select, "-n", workers]
        command += ["--report-dir", str(Path(tmp) / "rep")]
        if flags:  # a team's conformance.yaml over the store's, naming the port with its flags
            config = Path(tmp) / "conformance.yaml"
            entry = "".join(f"    {flag}: true\n" for flag in flags)
            config.write_text(f"extends: default\nimpls:\n  port:\n    python: {IMPLS / spec}\n{entry}")
            command += ["--config", str(config), "--impl", "port"]
        else:
            command += ["--impl", str(IMPLS / spec)]
        env = {**os.environ, "PYTHONPATH": f"{IMPLS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.pop("CONFORMANCE_DIAGNOSIS_BUDGET", None)  # the default budget, as a user runs it
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        report = Path(tmp) / "rep" / "results.json"
        if not report.exists():
            sys.exit(f"{label}: no results ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        cases = json.loads(report.read_text())["cases"]
    return [c for c in cases if c["status"] in ("fail", "error") and c.get("outputs")], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ports", default="", help="comma-separated labels (default: every port)")
    parser.add_argument("-n", default="2", help="the CLI's isolation children (default 2)")
    args = parser.parse_args()
    chosen = [p for p in args.ports.split(",") if p] or list(PORTS)
    unknown = sorted(set(chosen) - set(PORTS))
    if unknown:
        parser.error(f"unknown port(s) {unknown}; known: {', '.join(PORTS)}")
    print(f"{'port':28s} {'failing':>7s} {'named':>6s} {'wrong':>6s} {'unnamed':>7s} {'rate':>6s} {'s':>6s}  names")
    totals = [0, 0, 0, 0]
    expected_total = 0
    for label in chosen:
        truth = PORTS[label][2]
        cases, seconds = judged(label, args.n)
        right = wrong = unnamed = 0
        seen: set[str] = set()
        for case in cases:
            names = names_of(case)
            seen |= names
            if names - truth:
                wrong += 1
            elif names:
                right += 1
            else:
                unnamed += 1
        expected = len(cases) if truth else 0  # a port with no known bug: every case rightly unnamed
        rate = f"{right / expected:6.0%}" if expected else "   n/a"
        print(
            f"{label:28s} {len(cases):7d} {right:6d} {wrong:6d} {unnamed:7d} {rate} {seconds:6.0f}  "
            f"{', '.join(sorted(seen)) or '-'}",
            flush=True,
        )
        for i, value in enumerate((len(cases), right, wrong, unnamed if truth else 0)):
            totals[i] += value
        expected_total += expected
    print(
        f"{'all':28s} {totals[0]:7d} {totals[1]:6d} {totals[2]:6d} {totals[3]:7d} "
        f"{totals[1] / max(expected_total, 1):6.0%}  (unnamed: of ports with a known bug)"
    )


if __name__ == "__main__":
    main()
