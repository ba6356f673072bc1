"""The garbage collector of processes that judge cases (v41_conformance.collector): settled in an
isolation child once its implementation is loaded, never in a host that runs cases itself, and
cycles made afterwards are still collected."""

from __future__ import annotations

import gc
import re
import subprocess
import sys

from conftest import ROOT, results, run_cli

from v41_conformance.collector import YOUNG_COLLECTION

CI = f"{ROOT}/tests/impls/ci_conditions.py"

SETTLED = """
import gc, weakref
from v41_conformance.collector import settle
settle()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = []
ref = weakref.ref(a, lambda _: gone.append(True))
del a, b
gc.collect()
print(gc.get_freeze_count() > 1000, gc.get_threshold()[0], gone == [True])
"""


def test_settle_freezes_start_up_and_spaces_young_collections_out_and_cycles_are_still_collected():
    out = subprocess.run([sys.executable, "-c", SETTLED], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", str(YOUNG_COLLECTION), "True"]


def _collector_lines(tmp_path, *options: str) -> list[tuple[int, int]]:
    report = tmp_path / "rep"
    proc = run_cli(
        "run", "--impl", f"{CI}:CollectorState", "--select", "quant.e2m1", "--report-dir", str(report), *options
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outputs = "".join(c["output"] for c in results(report)["cases"])
    return [(int(f), int(y)) for f, y in re.findall(r"collector: frozen (\d+) young (\d+)", outputs)]


def test_an_isolation_child_judges_its_cases_with_the_collector_settled(tmp_path):
    lines = _collector_lines(tmp_path)
    assert lines and all(frozen > 1000 and young == YOUNG_COLLECTION for frozen, young in lines), lines


def test_a_host_that_judges_cases_itself_keeps_its_collector_as_it_was(tmp_path):
    before = (gc.get_freeze_count(), gc.get_threshold())
    lines = _collector_lines(tmp_path, "--no-isolate")
    assert lines and all(young == before[1][0] for _, young in lines), lines
    assert (gc.get_freeze_count(), gc.get_threshold()) == before
