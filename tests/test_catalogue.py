"""The contract an implementation must meet, written down once: the catalogue (`list --components
--json`), `show`, typed params, `supports:` patterns, the per-case `unsupported` answer, store
overrides, and two compiled programs driven from nothing but the catalogue and `show --dump`."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, make_project, results, run_cli, statuses
from v41_conformance.adapters.subprocess_adapter import param_tensors
from v41_conformance.catalogue import catalogue, render_markdown
from v41_conformance.config import load_config
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.known import components

CONFIG = load_config(ROOT / "conformance.yaml")
DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def dtype_ok(declared: str, tensor: torch.Tensor, others: dict[str, torch.Tensor]) -> bool:
    """A declared dtype ('bf16', 'bf16|f32', 'as x') against a tensor."""
    if declared.startswith("as "):
        ref = others.get(declared[3:])
        return ref is None or ref.dtype == tensor.dtype
    return DTYPES[tensor.dtype] in declared.split("|")


def rank_ok(shape: list[str], tensor: torch.Tensor) -> bool:
    """Symbolic shapes: '...' any leading dims, '[x]' an optional dim."""
    if "..." in shape:
        return tensor.dim() >= len(shape) - 1
    optional = sum(s.startswith("[") for s in shape)
    return len(shape) - optional <= tensor.dim() <= len(shape)


def test_the_catalogue_doc_is_the_registry():
    doc = catalogue(CONFIG, components())
    assert (ROOT / "docs" / "catalogue.md").read_text() == render_markdown(doc), (
        "docs/catalogue.md is stale: conformance list --components --markdown > docs/catalogue.md"
    )


def test_every_golden_agrees_with_the_catalogue():
    doc = catalogue(CONFIG, components())["components"]
    manifest = read_manifest(CONFIG.goldens)
    for case_id in sorted(manifest):
        golden = load_verified(CONFIG.goldens, case_id, manifest)
        spec = doc[golden.meta["component"]]
        inputs = {t["name"]: t for t in spec["inputs"]}
        held = set(golden.inputs) | set(golden.meta.get("regenerated_inputs") or {})
        assert {n for n, t in inputs.items() if "when" not in t} <= held <= set(inputs), case_id
        for name, tensor in golden.inputs.items():
            if name in inputs:  # regenerated inputs are rebuilt, not stored
                assert dtype_ok(inputs[name]["dtype"], tensor, golden.inputs), (case_id, name)
                assert rank_ok(inputs[name]["shape"], tensor), (case_id, name, tensor.shape)
        compared = {t["name"]: t for t in spec["compared"]}
        for name, tensor in golden.outputs.items():
            base = name.rsplit(".", 1)[-1]
            assert base in compared, (case_id, name)
            assert dtype_ok(compared[base]["dtype"], tensor, golden.inputs), (case_id, name)
            assert rank_ok(compared[base]["shape"], tensor), (case_id, name, tensor.shape)
        params = {p["name"]: p for p in spec["params"]}
        assert set(golden.meta["params"]) <= set(params), case_id


def test_list_components_json_and_text(tmp_path):
    proc = run_cli("list", "--components", "--json")
    doc = json.loads(proc.stdout)
    compressor = doc["components"]["compressor"]
    assert compressor["stepped"] and {t["name"] for t in compressor["returns"]} == {"rows", "row_positions", "ring"}
    ring_kept = next(t for t in compressor["compared"] if t["name"] == "ring_kept")
    assert ring_kept["derived"] and ring_kept["dtype"] == "f32" and ring_kept["shape"] == ["b", "Pn", "2", "hd"]
    select = doc["components"]["candidates.select"]
    assert [t["name"] for t in select["returns"]] == ["mask"] and "derived" in select["compared"][1]
    factor = next(p for p in doc["components"]["rope.yarn_table"]["params"] if p["name"] == "factor")
    assert factor["type"] == "float" and factor["encoding"] == "param.factor: F64 []"
    text = run_cli("list", "--components").stdout
    assert "  in v: f32 [...]" in text and "  returns ring: f32 [b, Sr, 2, hd]" in text


def test_show_prints_a_case_and_dumps_its_requests(tmp_path):
    proc = run_cli("show", "window.indices/decode-start5-win4-wrapped", "--dump", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "mode (str) = \"decode\"" in proc.stdout and "out.ids: int32 [1, 4] [2, 3, 0, 1]" in proc.stdout
    request = load_file(tmp_path / "request-000.safetensors")
    assert bytes(request["param.mode"].tolist()).decode() == "decode" and request["param.win"].dtype == torch.int64
    stepped = run_cli("show", "compressor/r2-tiny-chunks-1-3-3", "--dump", str(tmp_path / "c"))
    calls = json.loads((tmp_path / "c" / "calls.json").read_text())["calls"]
    assert [c["params"]["start"] for c in calls] == [0, 1, 4] and "wrote 3 request(s)" in stepped.stdout
    assert run_cli("show", "quant.e2m1/../../x").returncode == 2


def test_param_tensors_have_one_dtype_per_declared_type():
    tensors = param_tensors(
        {
            "k": 3,
            "scale": 0.5,
            "largest": True,
            "mode": "chunk",
            "main_kv": [-1, 0],
            "schedule": [[0, 5], [5, 6]],
            "config": {"dim": 128, "ratios": [0, 2]},
        }
    )
    assert (tensors["param.k"].dtype, tensors["param.scale"].dtype, tensors["param.largest"].dtype) == (
        torch.int64,
        torch.float64,
        torch.bool,
    )
    assert bytes(tensors["param.mode"].tolist()) == b"chunk" and tensors["param.schedule"].shape == (2, 2)
    assert tensors["param.config.dim"].item() == 128 and tensors["param.config.ratios"].tolist() == [0, 2]


def test_params_take_their_declared_type_whatever_the_yaml_spelling(tmp_path):
    project = make_project(tmp_path, ["rope.yarn_table", "topk.torch_cpu"])
    rope = project / "cases" / "rope.yaml"
    assert "factor: 16," in rope.read_text()  # written as an int ...
    gen = run_cli("generate", "--config", str(project / "conformance.yaml"), "--select", "rope.yarn_table/*", "--check")
    assert gen.returncode == 0, gen.stdout
    golden = load_verified(project / "goldens", "rope.yarn_table/tiny-a-d32", read_manifest(project / "goldens"))
    assert isinstance(golden.meta["params"]["factor"], float)  # ... arrives as the declared float
    topk = project / "cases" / "topk.yaml"
    topk.write_text(topk.read_text().replace("params: {k: 100", "params: {k: ten", 1))
    bad = run_cli("generate", "--config", str(project / "conformance.yaml"), "--select", "topk.torch_cpu/*")
    assert bad.returncode == 2 and "param 'k' must be int" in bad.stderr and "topk.yaml" in bad.stderr


def _config_with(tmp_path, entries: str):
    config = tmp_path / "elsewhere" / "conformance.yaml"
    config.parent.mkdir()
    text = (ROOT / "conformance.yaml").read_text().replace("impls:\n", "impls:\n" + entries, 1)
    config.write_text(text.replace("command: [examples/", f"command: [{ROOT}/examples/"))
    return config


def test_supports_patterns_limit_python_and_subprocess_implementations(tmp_path, c_binary):
    config = _config_with(
        tmp_path,
        "  only-quant:\n    python: v41_conformance.adapters.reference:ReferenceAdapter\n"
        "    supports: [quant.*]\n"
        f"  c-some:\n    command: [{c_binary}]\n    supports: [quant.e2m1]\n",
    )
    flags = [
        "--config",
        str(config),
        "--goldens",
        str(ROOT / "goldens"),
        "--cases",
        str(ROOT / "cases"),
        "--no-isolate",
    ]
    run = run_cli(
        "run", "--impl", "only-quant", "--select", "quant.e2m1,norm.rms", "--report-dir", str(tmp_path / "a"), *flags
    )
    got = statuses(results(tmp_path / "a"))
    assert {s for c, s in got.items() if c.startswith("quant.")} == {"pass"}
    assert {s for c, s in got.items() if c.startswith("norm.")} == {"unsupported"}, run.stdout
    run_cli(
        "run", "--impl", "c-some", "--select", "quant.e2m1,quant.fp4_e8m0", "--report-dir", str(tmp_path / "b"), *flags
    )
    got = statuses(results(tmp_path / "b"))
    assert {s for c, s in got.items() if c.startswith("quant.fp4")} == {"unsupported"}
    assert {s for c, s in got.items() if c.startswith("quant.e2m1")} == {"pass"}
    # patterns narrow the program's own `components` answer, never widen it (as for Python ones)
    (tmp_path / "w").mkdir()
    wide = _config_with(tmp_path / "w", f"  c-wide:\n    command: [{c_binary}]\n    supports: ['*']\n")
    run_cli(
        "run",
        "--impl",
        "c-wide",
        "--select",
        "quant.e2m1,norm.rms",
        "--report-dir",
        str(tmp_path / "c"),
        "--config",
        str(wide),
        *flags[2:],
    )
    got = statuses(results(tmp_path / "c"))
    assert {s for c, s in got.items() if c.startswith("norm.")} == {"unsupported"}
    assert {s for c, s in got.items() if c.startswith("quant.e2m1")} == {"pass"}
    (tmp_path / "x").mkdir()
    bad = _config_with(tmp_path / "x", "  nope:\n    python: a:b\n    supports: quant.*\n")
    proc = run_cli("run", "--impl", "nope", "--config", str(bad))
    assert proc.returncode == 2 and "supports must be a list" in proc.stderr


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "single"])
def test_a_program_declines_one_case_and_only_that_case_is_unsupported(tmp_path, rust_binary, batch):
    config = _config_with(tmp_path, f"  rs:\n    command: [{rust_binary}]\n    batch: {str(batch).lower()}\n")
    report = tmp_path / "rep"
    proc = run_cli(
        "run",
        "--impl",
        "rs",
        "--select",
        "window.indices",
        "--config",
        str(config),
        "--goldens",
        str(ROOT / "goldens"),
        "--cases",
        str(ROOT / "cases"),
        "--report-dir",
        str(report),
    )
    assert proc.returncode == 0, proc.stdout
    cases = {c["id"]: c for c in results(report)["cases"]}
    declined = {i for i, c in cases.items() if c["status"] == "unsupported"}
    assert declined == {i for i in cases if "/chunk-" in i}
    assert all("chunk generalisation" in cases[i]["message"] for i in declined)


def test_config_elsewhere_with_store_overrides(tmp_path):
    config = _config_with(tmp_path, "")
    proc = run_cli(
        "run",
        "--impl",
        "reference",
        "--select",
        "norm.rms",
        "--config",
        str(config),
        "--report-dir",
        str(tmp_path / "r"),
        "--no-isolate",
    )
    assert proc.returncode == 1  # goldens: and cases: are relative to the config file: nothing there
    proc = run_cli(
        "run",
        "--impl",
        "reference",
        "--select",
        "norm.rms",
        "--config",
        str(config),
        "--goldens",
        "goldens",
        "--cases",
        "cases",
        "--report-dir",
        str(tmp_path / "r"),
        "--no-isolate",
    )
    assert proc.returncode == 0, proc.stdout
    assert "--goldens" in results(tmp_path / "r")["cases"][0]["repro"]


@pytest.mark.parametrize("program", ["c", "rust"])
def test_programs_driven_from_the_catalogue_and_show_alone(tmp_path, program, c_binary, rust_binary):
    """No component name, tensor name or dtype below comes from anywhere but the catalogue, the
    program's own `components` answer and `show --dump`."""
    binary = {"c": c_binary, "rust": rust_binary}[program]
    doc = json.loads(run_cli("list", "--components", "--json").stdout)["components"]
    implemented = subprocess.run([str(binary), "components"], capture_output=True, text=True).stdout.split()
    declined = compared = 0
    for component in implemented:
        spec = doc[component]
        returned = {t["name"]: t for t in spec["returns"]}
        case_ids = run_cli("list", "--select", component).stdout.split()
        assert run_cli("show", *case_ids, "--dump", str(tmp_path)).returncode == 0
        for case_id in case_ids:
            folder = tmp_path / case_id.replace("/", "__")
            for call in json.loads((folder / "calls.json").read_text())["calls"]:
                got_path = folder / f"got-{call['response']}"
                proc = subprocess.run(
                    [str(binary), "run", call["component"], str(folder / call["request"]), str(got_path)],
                    capture_output=True,
                    text=True,
                )
                assert proc.returncode == 0, (case_id, proc.stderr)
                if proc.stdout.startswith("unsupported"):
                    declined += 1
                    continue
                got, want = load_file(got_path), load_file(folder / call["response"])
                request = load_file(folder / call["request"])
                assert set(got) == set(returned), case_id
                for name, tensor in got.items():
                    assert dtype_ok(returned[name]["dtype"], tensor, request), (case_id, name)
                    assert rank_ok(returned[name]["shape"], tensor), (case_id, name)
                    assert torch.equal(tensor, want[name]), (case_id, name)
                    compared += 1
    assert compared > 10
    assert declined > 0 if program == "rust" else declined == 0


def test_every_optional_param_states_its_default_and_reaches_the_implementation_with_it():
    doc = catalogue(CONFIG, components())
    for name, c in doc["components"].items():
        for p in c["params"]:
            if not p["required"] and p["set_by"] == "case":
                assert p["default_doc"], f"{name}: optional param {p['name']} states no default"
    from v41_conformance.adapters.reference import ReferenceAdapter
    from v41_conformance.runner import run_case

    class Recording(ReferenceAdapter):
        seen: list[dict] = []

        def run(self, component, inputs, params):
            self.seen.append(dict(params))
            return super().run(component, inputs, params)

    manifest = read_manifest(CONFIG.goldens)
    checked = set()
    for case_id in sorted(manifest):
        component = components()[case_id.split("/")[0]]
        absent = [
            p
            for p in component.params
            if p.has_default and p.name not in load_verified(CONFIG.goldens, case_id, manifest).meta["params"]
        ]
        absent = [p for p in absent if p.name not in checked]
        if not absent or component.name == "attention":
            continue
        impl = Recording()
        impl.seen = []
        result = run_case(case_id, CONFIG, impl, "recording", manifest)
        assert result.status == "pass", (case_id, result.message)
        for p in absent:
            filled = [s for s in impl.seen if p.name in s]
            if p.default is not None or p.derive is not None and filled:
                assert filled and filled[0][p.name] == p.default_for(filled[0]), (case_id, p.name)
                checked.add(p.name)
    assert {"eps", "largest", "candidate_leak", "decode_from", "request_offset"} <= checked, checked
    # a case that leaves out a param set to its default judges the same (compressor ratio, topk's bools)
    from v41_conformance.runner import CaseResult, judge_golden

    for component_name, name in (("compressor", "ratio"), ("topk.torch_cpu", "sorted"), ("indexer.select", "offset")):
        component = components()[component_name]
        spec = next(p for p in component.params if p.name == name)
        for case_id in sorted(c for c in manifest if c.startswith(component_name + "/")):
            golden = load_verified(CONFIG.goldens, case_id, manifest)
            if golden.meta["params"].get(name) == spec.default:
                break
        else:
            raise AssertionError(f"no {component_name} case sets {name} to its default {spec.default!r}")
        golden.meta["params"] = {k: v for k, v in golden.meta["params"].items() if k != name}
        impl, result = Recording(), CaseResult(case_id, component_name, "error")
        impl.seen = []
        judge_golden(component, golden, impl, CONFIG, {}, result)
        assert result.status == "pass", (case_id, name, result.message)
        assert impl.seen and all(s[name] == spec.default for s in impl.seen), (case_id, name)
