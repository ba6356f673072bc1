"""Every component, handed back every kind of wrong value in place of one of its outputs, gives that
case an error that names the kind and the output, and the runner never raises: the run goes on.

The values a port really returns by mistake: a Python list or a numpy array (a `.tolist()` or a
`.numpy()` left in), None, a number, a tensor left on the device (`meta` stands for a GPU here), a
0-d tensor. A component driven step by step (attention, the compressor) names the step too.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.config import load_config
from v41_conformance.golden import golden_path, read_manifest
from v41_conformance.runner import run_case

CONFIG = load_config(ROOT / "conformance.yaml")
MANIFEST = read_manifest(CONFIG.goldens)


def _smallest_case_of_each_component() -> list[str]:
    smallest: dict[str, tuple[int, str]] = {}
    for case_id in sorted(MANIFEST):
        component = case_id.split("/")[0]
        size = golden_path(CONFIG.goldens, case_id).stat().st_size
        if component not in smallest or size < smallest[component][0]:
            smallest[component] = (size, case_id)
    return [case_id for _, case_id in sorted(smallest.values(), key=lambda sc: sc[1])]


CASES = _smallest_case_of_each_component()

# name: (what replaces the output, the kind of error, what the message says of it)
WRONG = {
    "list": (
        lambda t: t.reshape(-1).tolist(),
        "type error",
        "is a list, not a tensor|expected a torch.Tensor, got list",
    ),
    "numpy": (
        lambda t: t.float().numpy(),
        "type error",
        "is a ndarray, not a tensor|expected a torch.Tensor, got ndarray",
    ),
    "None": (lambda t: None, "type error", "is a NoneType, not a tensor|expected a torch.Tensor, got NoneType"),
    "number": (lambda t: 3, "type error", "is a int, not a tensor|expected a torch.Tensor, got int"),
    "device": (lambda t: torch.empty_like(t, device="meta"), "device error|exception", "meta"),
}


class ReturnsWrong(ReferenceAdapter):
    """The reference, with one output (`name`, by default its first by name) of `component` (by
    default every one) replaced by a wrong value."""

    def __init__(self, wrong, component: str | None = None, name: str | None = None):
        self.wrong, self.component, self.name = wrong, component, name

    def run(self, component, inputs, params):
        out = super().run(component, inputs, params)
        if self.component in (None, component):
            name = self.name or sorted(out)[0]
            out[name] = self.wrong(out[name])
        return out


@pytest.mark.parametrize("value", sorted(WRONG))
def test_every_component_answers_a_wrong_value_with_an_error_that_names_it(value):
    import re

    replace, kinds, said = WRONG[value]
    assert len(CASES) == len({c.split("/")[0] for c in MANIFEST})
    for case_id in CASES:
        result = run_case(case_id, CONFIG, ReturnsWrong(replace), "wrong", MANIFEST)  # never raises
        where = f"{case_id}: {result.status} {result.kind} {result.message[:300]}"
        assert result.status == "error" and re.fullmatch(kinds, result.kind or ""), where
        assert re.search(said, result.message), where


def test_a_step_driven_component_names_the_step_and_the_kind():
    attention = next(c for c in CASES if c.startswith("attention/"))
    result = run_case(attention, CONFIG, ReturnsWrong(lambda t: t.tolist()), "wrong", MANIFEST)
    assert (result.status, result.kind, result.first_divergent_step) == ("error", "type error", 0)
    assert result.message.startswith("implementation failed at step 0: layer 0")


def test_a_state_handed_back_in_another_layout_is_a_dtype_error_at_its_step():
    attention = next(c for c in CASES if c.startswith("attention/"))
    result = run_case(attention, CONFIG, ReturnsWrong(torch.Tensor.float, "attention", "window"), "wrong", MANIFEST)
    assert (result.status, result.kind, result.first_divergent_step) == ("error", "dtype error", 0), result.message
    assert "returned state 'window' as torch.float32" in result.message


def test_the_gpu_checks_left_on_device_step_holds_without_a_gpu(tmp_path):
    """examples/cuda/gpu_check.sh, step left-on-gpu, with `meta` standing for the GPU: a whole run
    (isolation children included) makes each case a device error and finishes."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples/cuda/left_on_device_check.py"),
            str(tmp_path / "rep"),
            "--device",
            "meta",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "left on meta: each a device error" in proc.stdout
