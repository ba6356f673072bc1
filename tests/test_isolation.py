"""Crash-, hang- and error-safe runs: each status arises from a real implementation, the run
finishes, the other cases keep their verdicts, and results.json has everything."""

from __future__ import annotations

from conftest import ROOT, make_project, results, run_cli, statuses

NUMERIC = "quant.*,linear.f32,norm.rms,rope.apply,rope.yarn_table"


def test_crash_hang_exit_raise_nan_and_unsupported_in_one_parallel_run(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong.py:Chaos",
        "--select",
        NUMERIC,
        "-n",
        "2",
        "--timeout",
        "6",
        "--report-dir",
        str(report),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = results(report)
    got = statuses(doc)
    assert got["norm.rms/latent-4x512"] == "crash"
    assert got["norm.rms/qr-3x1280-zero-row"] == "timeout"
    assert got["linear.f32/compressor-wide-3x1024x64"] == "crash"
    assert {got[c] for c in got if c.startswith("quant.fp8_ue8m0/")} == {"error"}
    assert got["rope.apply/production-b1-s4-h2-d512"] == "fail"
    assert {got[c] for c in got if c.startswith("quant.fp4_e4m3/")} == {"unsupported"}
    # everything else kept its verdict
    for case_id in (
        "norm.rms/latent-6x128",
        "norm.rms/fp32-input-4x64",
        "linear.f32/compressor-tiny-7x128x128",
        "quant.e2m1/midpoints",
        "rope.yarn_table/tiny-a-d32",
    ):
        assert got[case_id] == "pass", case_id
    messages = {c["id"]: c["message"] for c in doc["cases"]}
    assert "SIGSEGV" in messages["norm.rms/latent-4x512"]
    assert "exited with code 3" in messages["linear.f32/compressor-wide-3x1024x64"]
    assert "no result after 6 s" in messages["norm.rms/qr-3x1280-zero-row"]
    assert "unsupported block layout" in messages["quant.fp8_ue8m0/window-kv-4x512"]
    counts = doc["components"]["norm.rms"]
    assert (counts["crash"], counts["timeout"], counts["pass"]) == (1, 1, 3)
    assert "CRASH norm.rms/latent-4x512" in proc.stdout and "TIMEOUT" in proc.stdout


def test_expectations_turn_known_failures_into_xfail_and_report_xpass_and_stale_entries(tmp_path):
    project = make_project(tmp_path, ["norm.rms", "quant.e2m1", "quant.fp8_ue8m0"])
    config = project / "conformance.yaml"
    config.write_text(
        config.read_text()
        + f"""  buggy:
    python: {ROOT}/tests/impls/wrong.py:ManyBugs
    expectations:
      - {{pattern: "norm.rms/*", status: error, reason: "raises on purpose, tracked in #1"}}
      - {{pattern: "quant.fp8_ue8m0/*", status: error, reason: "drops scale_bytes"}}
      - {{pattern: "quant.e2m1/midpoints", status: fail, reason: "thought broken"}}
      - {{pattern: "attention/*", status: fail, reason: "matches nothing here"}}
"""
    )
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        "buggy",
        "--config",
        str(config),
        "--report-dir",
        str(report),
        "--select",
        "norm.rms,quant.e2m1,quant.fp8_ue8m0",
        "--no-isolate",
    )
    doc = results(report)
    got = statuses(doc)
    assert {got[c] for c in got if c.startswith("norm.rms/")} == {"xfail"}
    assert got["quant.e2m1/midpoints"] == "xpass"
    assert got["quant.e2m1/uniform-4096"] == "pass"
    assert doc["stale_expectations"] == ["attention/* (fail: matches nothing here)"]
    assert proc.returncode == 1  # the xpass: the stale expectation must be removed
    xfail = next(c for c in doc["cases"] if c["id"] == "norm.rms/latent-6x128")
    assert "tracked in #1" in xfail["expectation"]


def test_shards_partition_the_cases(tmp_path):
    seen = []
    for index in (1, 2, 3):
        report = tmp_path / f"s{index}"
        proc = run_cli(
            "run",
            "--impl",
            "reference",
            "--select",
            "quant.*",
            "--shard",
            f"{index}/3",
            "--report-dir",
            str(report),
            "--no-isolate",
        )
        assert proc.returncode in (0, 1), proc.stderr
        seen.append({c["id"] for c in results(report)["cases"]})
    everything = run_cli("list", "--select", "quant.*").stdout.split()
    assert set().union(*seen) == set(everything)
    assert sum(len(s) for s in seen) == len(everything)
    bad = run_cli("run", "--impl", "reference", "--shard", "4/3")
    assert bad.returncode == 2 and "--shard" in bad.stderr


def test_a_sticky_cuda_error_is_charged_to_its_case_and_the_worker_is_replaced(tmp_path):
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        f"{ROOT}/tests/impls/wrong.py:StickyCudaError",
        "--select",
        "norm.rms",
        "--report-dir",
        str(report),
    )
    assert proc.returncode == 1
    doc = results(report)
    got = statuses(doc)
    assert got["norm.rms/latent-4x512"] == "error"
    assert [s for c, s in got.items() if c != "norm.rms/latent-4x512"] == ["pass"] * 4
    message = next(c["message"] for c in doc["cases"] if c["id"] == "norm.rms/latent-4x512")
    assert "illegal memory access" in message and "worker was restarted" in message


def test_device_workers_take_one_gpu_each(monkeypatch):
    import torch

    from v41_conformance.adapters.device import pick_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert pick_device("cuda") == "cuda:1"
    assert pick_device("cuda:0") == "cuda:0"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert pick_device("cuda") == "cuda:0"
