"""The kernel examples: Triton (interpreter on the CPU) and CUDA C++ (built with nvcc).

- examples/triton_impl.py passes quant.e2m1, quant.fp4_e4m3, quant.fp4_e8m0 and
  indexer.scores through the real CLI with TRITON_INTERPRET=1, boundary cases included;
  its bf16 rounding points are checked against a plain formulation where fp32 sums are exact.
- examples/cuda/fp4_quant.cu compiles with nvcc (skipped only when nvcc is absent), exports
  its launchers, and its host emulation (the same per-element code) matches the goldens.
- `conformance run --device cuda` without a GPU is a usage error (exit 2) with a clear message.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, results, run_cli

TRITON_COMPONENTS = ("quant.e2m1", "quant.fp4_e4m3", "quant.fp4_e8m0", "indexer.scores")
CUDA_COMPONENTS = ("quant.e2m1", "quant.fp4_e4m3", "quant.fp4_e8m0")
BOUNDARY_CASES = (
    "quant.e2m1/midpoints",
    "quant.fp4_e4m3/midpoints-2x64",
    "quant.fp4_e4m3/subnormal-scales-4x32",
    "quant.fp4_e4m3/saturating-scale-2x32",
    "quant.fp4_e4m3/zero-blocks-3x64",
    "quant.fp4_e8m0/midpoints-2x64",
    "quant.fp4_e8m0/pow2-edges-4x32",
    "quant.fp4_e8m0/zero-blocks-3x128",
)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def triton_impl(monkeypatch):
    """examples/triton_impl.py loaded with the interpreter on (it is read when kernels are defined)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return _load(ROOT / "examples" / "triton_impl.py", "triton_impl_under_test")


# --- Triton through the CLI ----------------------------------------------------------------------


def test_triton_impl_passes_its_components_under_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        "examples/triton_impl.py:TritonImpl",
        "--report-dir",
        str(report),
        "--select",
        ",".join((*TRITON_COMPONENTS, "quant.fp8_ue8m0")),
        "--no-isolate",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = results(report)
    for name in TRITON_COMPONENTS:
        entry = doc["components"][name]
        assert entry["verdict"] == "pass" and entry["pass"] == entry["cases"] >= 3, (name, entry)
    assert doc["components"]["quant.fp8_ue8m0"]["verdict"] == "unsupported"
    passed = {c["id"] for c in doc["cases"] if c["status"] == "pass"}
    assert set(BOUNDARY_CASES) <= passed
    # bit-exact even where only bf16 tolerance is asked: every rounding point is reproduced
    scores = [c for c in doc["cases"] if c["component"] == "indexer.scores"]
    assert all(c["outputs"]["scores"]["max_ulps"] == 0 for c in scores)


def test_triton_impl_without_gpu_or_interpreter_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    report = tmp_path / "rep"
    # a process of its own: triton imported here without the interpreter would stay so for the
    # in-process kernel tests below (its standard library's jit functions are made at import)
    proc = run_cli(
        "run",
        "--impl",
        "examples/triton_impl.py:TritonImpl",
        "--report-dir",
        str(report),
        "--select",
        "quant.e2m1/midpoints",
        "--no-isolate",
        fresh=True,
    )
    assert proc.returncode == 1
    case = results(report)["cases"][0]
    assert case["status"] == "error" and "TRITON_INTERPRET=1" in case["message"] and "--device cuda" in case["message"]


# --- Triton kernels in process ---------------------------------------------------------------------


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.float().to(torch.bfloat16).float()


def test_triton_scores_reproduce_each_bf16_rounding_point(triton_impl):
    # Values on a 1/8 grid with small magnitudes keep every fp32 sum exact, so the only roundings
    # are the three bf16 ones and the kernel must match this formulation bit for bit.
    gen = torch.Generator().manual_seed(7)
    b, S, H, D, T = 2, 5, 4, 64, 40
    q = (torch.randint(-24, 25, (b, S, H, D), generator=gen) / 8).to(torch.bfloat16)
    k = (torch.randint(-24, 25, (b, T, D), generator=gen) / 8).to(torch.bfloat16)
    w = (torch.randint(-7, 8, (b, S, H), generator=gen) / 4 + 1 / 64).to(torch.bfloat16)
    dots = torch.einsum("bshd,btd->bsht", q.double(), k.double())  # exact
    s = _bf16(dots).relu()
    p = _bf16(s * w.double()[..., None])
    expected = _bf16(p.sum(dim=2)) + 0.0  # [b, S, T]
    got = triton_impl.index_scores(q, k, w)
    assert got.dtype == torch.bfloat16 and got.shape == (b, S, T)
    assert torch.equal(got.float(), expected.float())
    assert not (torch.signbit(got) & (got == 0)).any()  # zeros come out as +0
    # the rounding points matter here: one rounding at the end gives other values
    once = _bf16(torch.einsum("bshd,btd->bsht", q.double(), k.double()).relu().mul(w.double()[..., None]).sum(dim=2))
    assert not torch.equal(once, expected)


def test_triton_scores_hand_computed_example(triton_impl):
    # heads (1, 0), (0, 1), weights 1, 2; key (0, 3): 0 + 3 * 2 = 6; key (1, -1): relu -> 1 * 1 = 1
    q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]], dtype=torch.bfloat16)
    k = torch.tensor([[[0.0, 3.0], [1.0, -1.0], [-1.0, -1.0]]], dtype=torch.bfloat16)
    w = torch.tensor([[[1.0, 2.0]]], dtype=torch.bfloat16)
    got = triton_impl.index_scores(q, k, w)
    assert got.tolist() == [[[6.0, 1.0, 0.0]]] and not torch.signbit(got).any()


def test_triton_fp4_hand_computed_blocks(triton_impl):
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    x[0, 0] = -0.0  # an all-zero block with a -0
    x[1, 0], x[1, 1], x[1, 2] = 6.0, 5.0, -0.25  # amax 6: 6 * fp32(1/6) rounds to 1.0, scale 1
    y, codes, scale_bytes = triton_impl.fp4_qdq(x, 32, False)
    # zero block: the amax floor 6*2^-126 times fp32(1/6) rounds to exactly 2^-126 -> byte 1
    assert scale_bytes.tolist() == [[1], [127]]
    assert codes[0, 0].item() == 8 and torch.signbit(y[0, 0]) and codes[0, 1:].eq(0).all()
    assert codes[1, :3].tolist() == [7, 6, 8]  # 6 -> code 7; 5 (a midpoint) -> 4, code 6; -0.25 -> -0
    assert y[1, :3].float().tolist() == [6.0, 4.0, 0.0] and torch.signbit(y[1, 2])
    # e4m3 scales, block 16: the zero block's scale is the smallest e4m3 subnormal 2^-9 (byte 0x01);
    # amax 6 gives e4m3(1.0) = 0x38
    _, _, e4 = triton_impl.fp4_qdq(x, 16, True)
    assert e4[0].tolist() == [1, 1] and e4[1].tolist() == [0x38, 1]


def test_triton_e2m1_ties_go_to_the_even_code(triton_impl):
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.0001, -0.0, -0.1, 6.0])
    codes, y = triton_impl.e2m1(v)
    assert y.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -0.0, 6.0]
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 8, 7]


# --- CUDA C++ --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory):
    build = _load(ROOT / "examples" / "cuda" / "build.py", "cuda_example_build_under_test")
    if build.find_nvcc() is None:
        pytest.skip("nvcc not found")
    library = build.build(build_root=tmp_path_factory.mktemp("cuda-build"), force=True)
    return build, library


def test_cuda_source_compiles_and_exports_its_launchers(cuda_build):
    build, library = cuda_build
    assert library.is_file() and library.name == build.LIBRARY
    if shutil.which("nm"):
        symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
        assert all(name in symbols for name in build.LAUNCHERS), symbols
    # the CUDA runtime is linked statically: loading needs no driver, and a launch without one
    # returns an error code instead of crashing
    lib = _load(ROOT / "examples" / "cuda" / "cuda_impl.py", "cuda_impl_under_test").load_library(library)
    assert lib.conformance_cuda_error_string(0) == b"no error"
    if not torch.cuda.is_available():
        assert lib.conformance_e2m1(0, None, None, None, 0, None) != 0


def _golden(case_id: str) -> dict[str, torch.Tensor]:
    component, case = case_id.split("/")
    return load_file(str(ROOT / "goldens" / component / f"{case}.safetensors"))


@pytest.mark.parametrize(
    "case_id",
    [c for c in BOUNDARY_CASES if not c.startswith("quant.e2m1")]
    + ["quant.fp4_e4m3/log-uniform-8x128", "quant.fp4_e8m0/log-uniform-8x256"],
)
def test_cuda_host_emulation_matches_the_goldens(cuda_build, case_id):
    _, library = cuda_build
    lib = _load(ROOT / "examples" / "cuda" / "cuda_impl.py", "cuda_impl_under_test").load_library(library)
    golden = _golden(case_id)
    x = golden["in.x"].contiguous()
    e4m3 = case_id.startswith("quant.fp4_e4m3")
    y = torch.empty_like(x)
    codes = torch.empty(x.shape, dtype=torch.uint8)
    scale_bytes = torch.empty(golden["out.scale_bytes"].shape, dtype=torch.uint8)
    assert (
        lib.conformance_fp4_host(
            int(e4m3), x.data_ptr(), y.data_ptr(), codes.data_ptr(), scale_bytes.data_ptr(), x.numel()
        )
        == 0
    )
    assert torch.equal(y.view(torch.int16), golden["out.y"].view(torch.int16))
    assert torch.equal(codes, golden["out.codes"]) and torch.equal(scale_bytes, golden["out.scale_bytes"])


def test_cuda_host_e2m1_matches_the_midpoints_golden(cuda_build):
    _, library = cuda_build
    lib = _load(ROOT / "examples" / "cuda" / "cuda_impl.py", "cuda_impl_under_test").load_library(library)
    golden = _golden("quant.e2m1/midpoints")
    v = golden["in.v"].contiguous()
    codes, y = torch.empty(v.shape, dtype=torch.uint8), torch.empty_like(v)
    lib.conformance_e2m1_host(v.data_ptr(), codes.data_ptr(), y.data_ptr(), v.numel())
    assert torch.equal(codes, golden["out.codes"]) and torch.equal(
        y.view(torch.int32), golden["out.y"].view(torch.int32)
    )


def test_cuda_impl_refuses_cpu_tensors():
    impl = _load(ROOT / "examples" / "cuda" / "cuda_impl.py", "cuda_impl_under_test").CudaImpl()
    assert impl.supports("quant.fp4_e8m0") and not impl.supports("indexer.scores")
    with pytest.raises(RuntimeError, match="--device cuda"):
        impl.run("quant.e2m1", {"v": torch.zeros(4)}, {})


# --- --device cuda ---------------------------------------------------------------------------------


def test_device_cuda_without_a_gpu_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    report = tmp_path / "rep"
    if torch.cuda.is_available():  # a GPU machine: the examples run natively instead
        proc = run_cli(
            "run",
            "--device",
            "cuda",
            "--impl",
            "examples/triton_impl.py:TritonImpl",
            "--select",
            ",".join(TRITON_COMPONENTS),
            "--report-dir",
            str(report),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    for impl in ("examples/cuda/cuda_impl.py:CudaImpl", "examples/triton_impl.py:TritonImpl"):
        proc = run_cli("run", "--device", "cuda", "--impl", impl, "--select", "quant.e2m1", "--report-dir", str(report))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "--device cuda: no CUDA device is available" in proc.stderr and "--device cpu" in proc.stderr
        assert not (report / "results.json").exists()  # refused before anything ran


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for a CUDA-enabled python in gpu_check.sh: every step's command is logged and succeeds, except
# the sticky check (fails) and the goldens build (slow), so the script's own bookkeeping shows.
case "$1" in
  -c) case "$2" in *executable*) echo "$0";; esac; exit 0;;
  -) cat >/dev/null; echo "fake GPU"; exit 0;;
esac
echo "$*" >> "$FAKE_LOG"
case "$*" in *"generate --tier production"*) sleep 2;; *sticky_check*) exit 1;; esac
exit 0
"""


def _gpu_check(tmp_path: Path, steps: str | None) -> tuple[subprocess.CompletedProcess, list[str]]:
    fake, log = tmp_path / "python", tmp_path / "calls.log"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "FAKE_LOG": str(log), "GPU_CHECK_DIR": str(tmp_path / "out")}
    if steps is not None:
        env["GPU_CHECK_STEPS"] = steps
    proc = subprocess.run(
        ["bash", str(ROOT / "examples" / "cuda" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    return proc, log.read_text().splitlines() if log.exists() else []


def test_gpu_check_runs_every_step_builds_the_goldens_beside_them_and_reports_a_failed_one(tmp_path):
    proc, calls = _gpu_check(tmp_path, None)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the sticky step failed
    summary = proc.stdout[proc.stdout.index("gpu_check summary") :]
    for step in (
        "build",
        "cuda",
        "triton",
        "fp8",
        "forked",
        "sticky",
        "goldens",
        "production",
        "plugin",
        "tensorcores",
        "left-on-gpu",
        "fork-trap",
        "standin",
        "small-tier",
        "accumulation",
    ):
        assert f"  {step} " in summary, (step, summary)
    assert "sticky       FAILED (exit 1)" in summary and "--- sticky: last lines" in proc.stdout
    generates = [c for c in calls if "generate --tier production" in c]
    assert len(generates) == 1 and calls.index(generates[0]) < 3  # once, from the start
    assert any("--impl upstream-gpu" in c and "--tier production" in c for c in calls)
    assert any("--impl scaled-mm-gpu" in c for c in calls)


def test_gpu_check_reruns_the_steps_it_is_given(tmp_path):
    proc, calls = _gpu_check(tmp_path, "production standin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout[proc.stdout.index("gpu_check summary") :]
    ran = [line.split()[0] for line in summary.splitlines()[1:] if " ok, " in line or "FAILED" in line]
    assert ran == ["goldens", "production", "standin"], summary
    assert not any("build.py" in c or "sticky_check" in c for c in calls)
