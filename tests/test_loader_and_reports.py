"""`--impl` resolution in every accepted form, expectation files, and report escaping."""

from __future__ import annotations

import sys
import textwrap

import pytest

from v41_conformance.adapters.loader import ENTRY_POINT_GROUP, instantiate, resolve
from v41_conformance.config import load_config
from v41_conformance.errors import UsageError
from v41_conformance.expectations import apply_expectations, load_expectations
from v41_conformance.report import render_html, render_junit, render_summary, render_table

MODULE = textwrap.dedent('''
    class Impl:
        def supports(self, component):
            return component == "quant.e2m1"

        def run(self, component, inputs, params):
            return {}

    instance = Impl()

    def factory():
        return Impl()

    not_an_impl = object()
''')


@pytest.fixture
def impl_module(tmp_path, monkeypatch):
    (tmp_path / "my_port.py").write_text(MODULE)
    dist = tmp_path / "my_port-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-port\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmy-port = my_port:Impl\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_port", None)


@pytest.mark.parametrize("target", ["my_port:Impl", "my_port:instance", "my_port:factory", "my-port"])
def test_module_class_instance_factory_and_entry_point_forms(impl_module, target):
    impl = instantiate(resolve(target))
    assert impl.supports("quant.e2m1") and not impl.supports("norm.rms")


def test_file_path_form(impl_module):
    impl = instantiate(resolve(f"{impl_module}/my_port.py:factory"))
    assert impl.supports("quant.e2m1")


@pytest.mark.parametrize(
    "target, message",
    [
        ("my_port:missing", "has no attribute 'missing'"),
        ("my_port:not_an_impl", "lacks supports, run()"),
        ("no_such_module_xyz:Impl", "cannot import no_such_module_xyz"),
        ("nowhere/file.py:Impl", "file nowhere/file.py not found"),
        ("plainname", "unknown --impl 'plainname'"),
    ],
)
def test_bad_targets_are_usage_errors_that_say_what_to_do(impl_module, target, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        instantiate(resolve(target))


def test_expectations_from_a_named_file(tmp_path):
    (tmp_path / "expect.yaml").write_text("- {pattern: 'norm.rms/*', status: fail, reason: known}\n")
    loaded = load_expectations({"expectations": "expect.yaml"}, tmp_path, "conformance.yaml: impls.x")
    rows = [{"id": "norm.rms/a", "status": "fail"}, {"id": "norm.rms/b", "status": "pass"}]
    assert apply_expectations(rows, loaded) == []
    assert [r["status"] for r in rows] == ["xfail", "xpass"]
    (tmp_path / "bad.yaml").write_text("- {pattern: 'x', status: maybe, reason: r}\n")
    with pytest.raises(UsageError, match="status 'maybe' must be one of"):
        load_expectations({"expectations": "bad.yaml"}, tmp_path, "here")


def test_config_names_unknown_components_and_fields(tmp_path):
    (tmp_path / "conformance.yaml").write_text("tolerances:\n  components:\n    no.such: {ulps: 1}\n")
    with pytest.raises(UsageError, match="tolerances.components.no.such: no such component"):
        load_config(tmp_path / "conformance.yaml").validate()
    (tmp_path / "conformance.yaml").write_text("colour: blue\n")
    with pytest.raises(UsageError, match="unknown top-level key"):
        load_config(tmp_path / "conformance.yaml")


def _doc(message: str) -> dict:
    case = {
        "id": "norm.rms/x",
        "component": "norm.rms",
        "status": "error",
        "message": message,
        "outputs": {},
        "repro": "conformance run --impl <x> --select 'norm.rms/x'",
        "params": {"eps": 1e-20},
    }
    return {
        "impl": "<b>evil</b>",
        "impl_kind": "python",
        "device": "cpu",
        "exit_code": 1,
        "duration_s": 0.1,
        "versions": {"torch": "2.13.0", "harness": "0.1.0"},
        "problems": ["<i>p</i>"],
        "stale_expectations": [],
        "components": {"norm.rms": {"cases": 1, "verdict": "fail", "error": 1, "tie_rows": 0}},
        "cases": [case],
    }


def test_every_renderer_escapes_text_from_implementations():
    doc = _doc("raised <script>alert(1)</script> & more")
    html = render_html(doc)
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;evil" in html
    assert "<script>" not in render_summary(doc)
    junit = render_junit(doc)
    assert "<script>" not in junit and "&lt;script&gt;" in junit
    assert "ERROR norm.rms/x" in render_table(doc)
