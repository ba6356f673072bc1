"""conformance.yaml says what it does: a key that names nothing, at any level, is refused with the
allowed keys and the file named (the CLI exits 2), and every setting a configuration changes from the
packaged defaults is listed in the console, results.json, summary.md, report.html and junit.xml."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT, results, run_cli
from v41_conformance.config import load_config

REFERENCE = "v41_conformance.adapters.reference:ReferenceAdapter"


@pytest.mark.parametrize(
    "text, says",
    [
        (
            "tolerances: {sparse_attn: {o: {ulps: -3}}}\n",  # components: left out: a block that did nothing
            "tolerances.sparse_attn: unknown key; allowed: defaults, components",
        ),
        (
            "tolerances: {components: {sparse_attn: {oo: {ulps: 3}}}}\n",
            "tolerances.components.sparse_attn.oo: neither a tolerance field nor an output of sparse_attn",
        ),
        (
            "tolerances: {components: {sparse_attn: {o: {ulp: 3}}}}\n",
            "tolerances.components.sparse_attn.o: unknown key(s) ['ulp']; allowed: ulps, atol",
        ),
        (
            "tolerances: {components: {sparse_attn: {ulps: {o: 3}}}}\n",
            "tolerances.components.sparse_attn.ulps: a tolerance field takes a number",
        ),
        ("tolerances: {defaults: {bf61: {ulps: 3}}}\n", "tolerances.defaults.bf61: unknown kind; allowed: exact, bf16"),
        ("tolerances: {defaults: {bf16: {ulsp: 3}}}\n", "tolerances.defaults.bf16: unknown key(s) ['ulsp']"),
        (f"impls: {{k: {{python: '{REFERENCE}', accept_tie: true}}}}\n", "impls.k: unknown key(s) ['accept_tie']"),
        (
            f"impls: {{k: {{python: '{REFERENCE}', tolerances: {{sparse_attn: {{o: {{rel_l3: 2}}}}}}}}}}\n",
            "impls.k.tolerances.sparse_attn.o: unknown key(s) ['rel_l3']",
        ),
        (
            f"impls: {{k: {{python: '{REFERENCE}', tolerances: {{sparse_atn: {{rel_l2: 2}}}}}}}}\n",
            "impls.k.tolerances.sparse_atn: no such component",
        ),
        (
            f"impls: {{k: {{python: '{REFERENCE}', expectations: [{{pattern: 'x*', status: fail, reason: r, resaon: s}}]}}}}\n",
            "impls.k: expectations[0]: unknown key(s) ['resaon']; allowed: pattern, status, reason",
        ),
        ("floors: {quant.e2m2: 1}\n", "floors.quant.e2m2: no such component; allowed: default"),
        # YAML alone lets a second block for the same component replace the first without a word
        (
            "tolerances:\n  components:\n    kv.finish:\n      main_rope: {atol_rel: 0.001}\n"
            "    kv.finish:\n      index_norm: {ulps: 3}\n",
            "key 'kv.finish' appears twice (first at line 3); merge the two entries",
        ),
    ],
)
def test_a_key_that_names_nothing_is_refused_naming_the_file_and_the_allowed_keys(tmp_path, text, says):
    config = tmp_path / "conformance.yaml"
    config.write_text(text)
    proc = run_cli(
        "run",
        "--impl",
        "reference",
        "--select",
        "norm.rms",
        "--report-dir",
        str(tmp_path / "rep"),
        "--config",
        str(config),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and str(config) in proc.stderr, proc.stderr
    assert not (tmp_path / "rep" / "results.json").exists()


def test_the_packaged_and_the_example_team_configurations_load_and_change_nothing():
    for path, impl in (
        (ROOT / "conformance.yaml", "reference"),
        (ROOT / "examples" / "team" / "conformance.yaml", "kernels"),
    ):
        config = load_config(path)
        config.validate()
        assert config.overrides(impl) == [], path


TEAM = f"""
timeout: 60
floors: {{quant.e2m1: 2}}
tolerances:
  components:
    sparse_attn:
      o: {{rel_l2: 1.0, note: loosened for a test}}
impls:
  mine:
    python: {REFERENCE}
    accept_ties: true
    tolerances: {{indexer.select: {{ids: {{near_tie_ulps: 2}}}}}}
"""


def test_every_override_of_the_packaged_defaults_is_listed_in_every_report(tmp_path):
    config = tmp_path / "conformance.yaml"
    config.write_text(TEAM)
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        "mine",
        "--select",
        "quant.e2m1",
        "--report-dir",
        str(report),
        "--config",
        str(config),
        "--no-isolate",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    packaged = load_config(ROOT / "conformance.yaml")
    expected = {
        "timeout": (60, packaged.timeout),
        "floors.quant.e2m1": (2, None),
        "tolerances.components.sparse_attn.o.rel_l2": (
            1.0,
            packaged.tolerances["components"]["sparse_attn"]["o"]["rel_l2"],
        ),
        "impls.mine.accept_ties": (True, False),
        "impls.mine.tolerances.indexer.select.ids.near_tie_ulps": (2, None),
    }
    doc = results(report)
    assert {o["key"]: (o["value"], o["default"]) for o in doc["overrides"]} == expected
    junit = ET.fromstring((report / "junit.xml").read_text())
    listed = {p.get("value") for p in junit.iter("property") if p.get("name") == "override"}
    for key in expected:
        for where, text in (
            ("console", proc.stdout),
            ("summary.md", (report / "summary.md").read_text()),
            ("report.html", (report / "report.html").read_text()),
            ("junit.xml", " ".join(listed)),
        ):
            assert f"{key}: " in text, (where, key)
    assert "tolerances.components.sparse_attn.o.rel_l2: 1 (packaged: 0.0078125)" in proc.stdout
    assert "configuration changes 5 packaged default(s)" in proc.stdout
