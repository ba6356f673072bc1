"""The pytest plugin from the checkout (the installed wheel's run is tests/test_package.py): a hang is
the case's `timeout` under the plugin's isolation, -k deselects cases like tests, the reports are
written; and the Python API's own errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, results, statuses
from v41_conformance import api
from v41_conformance.errors import UsageError

HANGS = """
import time
from v41_conformance.adapters.reference import ReferenceAdapter


class HangsOnMidpoints(ReferenceAdapter):
    def run(self, component, inputs, params):
        if inputs["v"].dim() == 1 and inputs["v"].numel() < 100:  # quant.e2m1/midpoints
            time.sleep(600)
        return super().run(component, inputs, params)
"""


def test_the_plugin_times_out_a_hang_deselects_with_k_and_writes_the_reports(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--conformance-impl", "hangs.py:HangsOnMidpoints", "--conformance-select", "quant.e2m1",
                           "--conformance-timeout", "5", "--conformance-report-dir", "rep", "-k", "not uniform"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 passed, 1 deselected" in proc.stdout, proc.stdout[-2000:]
    assert "quant.e2m1/midpoints: timeout:" in proc.stdout
    got = statuses(results(tmp_path / "rep"))
    assert got == {"quant.e2m1/bf16-valued-64x32": "pass", "quant.e2m1/midpoints": "timeout",
                   "quant.e2m1/uniform-4096": "not_run"}


def test_the_api_judges_outputs_and_says_what_it_cannot_judge():
    case = api.case("quant.fp4_e8m0/midpoints-2x64")
    assert not case.stepped and case.params == {} and set(case.inputs()) == {"x"}
    good = api.check_outputs(case, case.expected())
    assert good.ok and good.status == "pass" and good.outputs["y"]["ok"]
    wrong = {**case.expected(), "y": case.expected()["y"] * 2}
    bad = api.check_outputs(case, wrong)
    assert not bad.ok and bad.status == "fail" and "output 'y'" in bad.message
    stepped = api.case("compressor/r2-q6-p5-d4-rb2-d3")
    assert stepped.stepped and stepped.params["ratio"] == 2
    with pytest.raises(UsageError, match="a stepped case is several calls"):
        api.check_outputs(stepped, {})
    from v41_conformance.adapters.reference import ReferenceAdapter

    assert api.check(stepped, ReferenceAdapter()).ok
    assert api.check("norm.rms/latent-4x512", lambda c, i, p: ReferenceAdapter().run(c, i, p)).ok
    with pytest.raises(UsageError, match="no case"):
        api.case("quant.e2m1/no-such-case")
    with pytest.raises(UsageError, match="must have supports"):
        api.check(case, object())
