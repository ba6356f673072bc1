"""Your own tests, parametrised over the harness's cases through its Python API."""

import pytest

from v41_conformance import api
from mykernels import Kernels

CASES = api.cases("quant.e2m1/*")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_e2m1_kernel(case):
    kernel = Kernels()
    outputs = kernel.run(case.component, case.inputs(), case.params)  # your own call of your kernel
    verdict = api.check_outputs(case, outputs)
    assert verdict.ok, verdict.message


def test_a_whole_case_through_the_harness():
    verdict = api.check("quant.e2m1/midpoints", Kernels())
    assert verdict.ok, verdict.message
