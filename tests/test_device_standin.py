"""The CPU's stand-in for a GPU (tests/device_standin.py): it refuses what CUDA refuses, and the ports
the GPU check runs with `--device cuda` pass every golden on it.

The first GPU run (examples/cuda/gpu_check.sh on an H200) found upstream's arithmetic mixing devices:
a CPU RoPE table multiplied into GPU rows, and the e2m1 grid's midpoints, a module-level CPU tensor,
compared with GPU values. Each case raised "Expected all tensors to be on the same device". On the
stand-in both fail the same way, so such a bug now fails `make test` rather than a team's first GPU run.
The stand-in's rules are checked against a real GPU by examples/cuda/standin_check.py (26 of 26
patterns agreed on an H200).
"""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import ROOT
from device_standin import MIXING, StandinDeviceAdapter, on_device, on_standin_device, standin_accepts, to_device
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.config import load_config
from v41_conformance.golden import read_manifest
from v41_conformance.runner import run_case

import upstream_ops as up
from gate_upstream import UpstreamTorch
from patching import patched

CONFIG = load_config(ROOT / "conformance.yaml")
MANIFEST = read_manifest(CONFIG.goldens)
MIXED = "Expected all tensors to be on the same device"


def _run(impl, case_id: str, standin: bool):
    impl = StandinDeviceAdapter(impl) if standin else impl
    return run_case(case_id, CONFIG, impl, type(impl).__name__, MANIFEST)


@pytest.mark.parametrize("name", sorted(MIXING))
def test_the_standin_accepts_and_refuses_as_a_gpu_does(name):
    expected, pattern = MIXING[name]
    assert standin_accepts(pattern) is expected


def test_device_tensors_say_cuda_and_what_follows_them_stays_on_the_device():
    with on_standin_device():
        x = to_device(torch.arange(6.0))
        assert x.device == torch.device("cuda", 0) and x.is_cuda and not x.is_cpu
        made = [torch.zeros(2, device=x.device), x.new_ones(2), x[:2] * 2, torch.topk(x, 2).indices, x.to(torch.int64)]
        assert all(on_device(t) for t in made)
        assert not on_device(x.cpu()) and on_device(x)  # .cpu() copies; x stays where it is
        assert not on_device(torch.arange(3))  # no device given: the CPU, as on a GPU machine


def test_upstream_arithmetic_passes_every_golden_on_the_standin_as_on_the_cpu():
    """tests/impls/gate_upstream.py is what gpu_check.sh runs with --device cuda (steps 4, 7, 13)."""
    impl, statuses = UpstreamTorch(), {}
    for case_id in sorted(MANIFEST):
        result = _run(impl, case_id, standin=True)
        statuses[case_id] = result.status
        assert result.status in ("pass", "unsupported"), f"{case_id}: {result.message[:2000]}"
    assert sum(s == "pass" for s in statuses.values()) > 200


def test_the_tensor_core_example_passes_its_cases_on_the_standin():
    sys.path.insert(0, str(ROOT / "examples" / "cuda"))
    from scaled_mm_impl import ScaledMmFp8

    cases = [c for c in MANIFEST if c.startswith("indexer/") or c.startswith("linear.fp8/ragged")]
    for case_id in cases:
        result = _run(ScaledMmFp8(), case_id, standin=True)
        assert result.status in ("pass", "unsupported"), f"{case_id}: {result.message[:2000]}"


def test_the_reference_takes_device_inputs_and_hands_its_outputs_back_on_the_device():
    """A port that delegates a component to the reference while running with --device cuda."""
    by_component: dict[str, str] = {}
    for case_id in sorted(MANIFEST):
        by_component.setdefault(case_id.split("/")[0], case_id)
    for case_id in by_component.values():
        result = _run(ReferenceAdapter(), case_id, standin=True)
        assert result.status == "pass", f"{case_id}: {result.message[:2000]}"
    with on_standin_device():
        x = to_device(torch.randn(4, 32))
        outputs = ReferenceAdapter().run("quant.e2m1", {"v": x}, {})
    assert outputs and all(on_device(v) for v in outputs.values())


def _e2m1_code_with_a_cpu_grid(v: torch.Tensor) -> torch.Tensor:
    """e2m1_code as it was before the first GPU run: the grid's midpoints a module-level CPU tensor."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    odd = torch.arange(7) % 2 == 1
    mag = v.abs().unsqueeze(-1)
    index = (mag > mids).sum(-1) + ((mag == mids) & odd).sum(-1)
    return index.to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3)


def _freqs_on_the_cpu(*args, device="cpu", **kwargs):
    """precompute_freqs_cis as it was before the first GPU run: the table on the CPU, whatever x's device."""
    return ORIGINAL_FREQS(*args, **kwargs)


ORIGINAL_FREQS = up.precompute_freqs_cis


@pytest.mark.parametrize(
    ("name", "bug", "case_id"),
    [
        ("e2m1_code", _e2m1_code_with_a_cpu_grid, "quant.e2m1/midpoints"),
        ("precompute_freqs_cis", _freqs_on_the_cpu, "attention/a-p21-d1x11-upstream"),
    ],
)
def test_the_bugs_the_first_gpu_run_found_pass_on_the_cpu_and_fail_on_the_standin(name, bug, case_id):
    with patched(up, name, bug):
        on_cpu = _run(UpstreamTorch(), case_id, standin=False)
        on_device_ = _run(UpstreamTorch(), case_id, standin=True)
    assert on_cpu.status == "pass", on_cpu.message
    assert on_device_.status == "error" and MIXED in on_device_.message, on_device_.message
