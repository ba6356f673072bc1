"""The production tier (docs/tiers.md): goldens built locally, pinned by SHA-256 in git.

A fresh clone has the production manifest but none of its golden files. These tests build such a
checkout and check that the cheap production cases rebuild to their pinned hashes (on every ATen
CPU capability), that a run names the command that builds a missing golden, and that the tier's
flag reaches everything. `make test-production` builds and runs the whole tier.
"""

from __future__ import annotations

import shutil

import pytest

from conftest import ROOT, results, run_cli, statuses

CHEAP = "indexer/*,compressor/*"  # seconds; the attention case takes about a minute (benchmarks/production_tier.py)


@pytest.fixture
def fresh_clone(tmp_path):
    """conformance.yaml, cases/production and goldens/production/MANIFEST.json only."""
    shutil.copy(ROOT / "conformance.yaml", tmp_path / "conformance.yaml")
    shutil.copytree(ROOT / "cases" / "production", tmp_path / "cases" / "production")
    (tmp_path / "goldens" / "production").mkdir(parents=True)
    shutil.copy(ROOT / "goldens" / "production" / "MANIFEST.json", tmp_path / "goldens" / "production")
    return tmp_path


@pytest.mark.parametrize("capability", ["", "default"])
def test_the_cheap_production_cases_rebuild_to_their_pinned_hashes(fresh_clone, capability, monkeypatch):
    if capability:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    proc = run_cli(
        "generate",
        "--tier",
        "production",
        "--check",
        "--select",
        CHEAP,
        "--config",
        str(fresh_clone / "conformance.yaml"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 identical, 0 drifted" in proc.stdout
    assert not list((fresh_clone / "goldens" / "production").glob("*/*.safetensors"))  # --check writes nothing


def test_a_run_names_the_command_that_builds_a_missing_production_golden(fresh_clone, tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        "reference",
        "--tier",
        "production",
        "--select",
        "indexer/r2-*",
        "--config",
        str(fresh_clone / "conformance.yaml"),
        "--report-dir",
        str(report),
        "--no-isolate",
    )
    assert proc.returncode == 1
    case = results(report)["cases"][0]
    assert case["status"] == "error"
    assert "conformance generate --tier production --select 'indexer/r2-decode-start1026-production'" in case["message"]
    assert "--tier production" in case["repro"]


def test_built_production_goldens_are_checked_against_the_pinned_hashes(fresh_clone, tmp_path):
    config = str(fresh_clone / "conformance.yaml")
    built = run_cli("generate", "--tier", "production", "--select", "indexer/*", "--config", config)
    assert built.returncode == 0 and "wrote 3" in built.stdout, built.stdout + built.stderr
    manifest = (fresh_clone / "goldens" / "production" / "MANIFEST.json").read_text()
    assert manifest == (ROOT / "goldens" / "production" / "MANIFEST.json").read_text()  # nothing moved
    report = tmp_path / "rep"
    run = run_cli(
        "run",
        "--impl",
        "reference",
        "--tier",
        "production",
        "--select",
        "indexer/*",
        "--config",
        config,
        "--report-dir",
        str(report),
        "--no-isolate",
    )
    assert run.returncode == 0, run.stdout
    assert set(statuses(results(report)).values()) == {"pass"}
    golden = next((fresh_clone / "goldens" / "production" / "indexer").glob("*.safetensors"))
    data = bytearray(golden.read_bytes())
    data[-1] ^= 0xFF
    golden.write_bytes(bytes(data))
    run = run_cli(
        "run",
        "--impl",
        "reference",
        "--tier",
        "production",
        "--select",
        "indexer/*",
        "--config",
        config,
        "--report-dir",
        str(report),
        "--no-isolate",
    )
    assert run.returncode == 1 and "does not match MANIFEST.json" in run.stdout


def test_the_tier_is_a_listed_choice():
    listed = run_cli("list", "--tier", "production")
    assert listed.returncode == 0 and "attention/production-p1030-d1x4-upstream" in listed.stdout
    bad = run_cli("run", "--impl", "reference", "--tier", "huge")
    assert bad.returncode == 2 and "--tier 'huge'" in bad.stderr
