"""Fast by default, with nothing given up: forked isolation children, the in-process pool behind
`-n`, the worker-count rule, heaviest-first order, the rebuilt-input cache, the YAML loader.

No test here measures time (benchmarks/fast_by_default.py does, side by side); they check the
mechanisms that make runs fast, and that verdicts do not depend on them.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch
import yaml

from conftest import ROOT, results, run_cli, statuses
from v41_conformance import cache, forkserver, regenerated, workers
from v41_conformance.config import load_config
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.known import get
from v41_conformance.session import RunOptions, case_costs
from v41_conformance.session import run as run_session
from v41_conformance.yamlio import LOADER

INTROSPECT = f"{ROOT}/tests/impls/introspect.py:Introspect"
NORM = ["norm.rms/*"]


def _run(report_dir: Path, impl: str, select: list[str], **kw) -> dict:
    options = RunOptions(impl=impl, select=select, report_dir=report_dir, **kw)
    return run_session(load_config(ROOT / "conformance.yaml"), options)


def _facts(doc: dict) -> list[dict[str, str]]:
    return [
        dict(re.findall(r"(\w+)=(\S+)", c["message"].splitlines()[0]))
        for c in doc["cases"]
        if c["component"] == "norm.rms"
    ]


def test_children_are_forked_from_the_preloaded_server_with_the_parents_environment(tmp_path, monkeypatch):
    import os

    assert forkserver.method() == "forkserver"  # Linux
    monkeypatch.setenv("INTROSPECT_MARKER", "set-after-the-server-started")
    forkserver.warm_up()
    monkeypatch.chdir(tmp_path)
    doc = _run(tmp_path / "rep", INTROSPECT, NORM, workers="2")
    facts = _facts(doc)
    assert len(facts) == 5
    for fact in facts:
        assert fact["ppid"] != str(os.getpid())  # the fork server's child, not this process's
        assert fact["parent"] == "forkserver"  # torch and the harness came with the fork
        assert fact["marker"] == "set-after-the-server-started"  # the environment of now
        assert fact["cwd"] == str(tmp_path)
    assert {f["slot"] for f in facts} == {"0", "1"}  # -n 2: two children, one per slot


def test_the_conformance_command_forks_its_fork_server_from_itself(tmp_path):
    """`conformance run` imports torch once: its fork server is a fork of the command (named
    v41-forkserver), not a second interpreter importing torch beside it; a host process that calls
    the CLI (this test process) keeps a fresh-interpreter server."""
    proc = run_cli(
        "run",
        "--impl",
        INTROSPECT,
        "--select",
        "norm.rms/*",
        "-n",
        "2",
        "--report-dir",
        str(tmp_path / "rep"),
        fresh=True,
    )
    assert proc.returncode == 1, proc.stderr
    facts = _facts(results(tmp_path / "rep"))
    assert (
        len(facts) == 5 and {f["parent"] for f in facts} == {"forkserver"} and {f["server"] for f in facts} == {"fork"}
    )
    assert not list(tmp_path.glob("rep/.run/*"))
    run_cli("run", "--impl", INTROSPECT, "--select", "norm.rms/*", "--report-dir", str(tmp_path / "host"))
    assert {f["server"] for f in _facts(results(tmp_path / "host"))} == {"exec"}


def test_spawn_is_the_fallback_and_judges_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("CONFORMANCE_START_METHOD", "spawn")
    assert forkserver.method() == "spawn"
    doc = _run(tmp_path / "rep", INTROSPECT, NORM)
    assert {f["parent"] for f in _facts(doc)} == {"other"}  # spawned by this process
    assert set(statuses(doc).values()) == {"error"}


def test_the_pool_gives_the_verdicts_of_a_serial_run_whatever_the_order(tmp_path):
    select = ["quant.*", "norm.rms/*", "linear.fp8/*", "sparse_attn/*"]
    wrong = f"{ROOT}/tests/impls/wrong.py:Segfaults"
    serial = _run(tmp_path / "serial", wrong, select, workers="0")
    pooled = _run(tmp_path / "pooled", wrong, select, workers="3")
    assert statuses(serial) == statuses(pooled)
    assert set(statuses(pooled).values()) == {"crash", "pass"}
    assert [c["id"] for c in pooled["cases"]] == sorted(statuses(pooled))  # reports keep id order


def test_workers_rule(monkeypatch):
    monkeypatch.setattr(workers, "cores", lambda: 8)
    light = {f"quant.e2m1/c{i}": 0.005 for i in range(6)}
    heavy = {f"attention/c{i}": 0.4 for i in range(40)}
    assert workers.resolve("auto", light, isolate=True) == 1  # a handful of light cases: serial
    assert workers.resolve("auto", heavy, isolate=True) == 8
    assert workers.resolve("auto", dict(list(heavy.items())[:4]), isolate=True) == 3
    assert workers.resolve("auto", heavy, isolate=False) == 2  # pytest-xdist workers cost an interpreter each
    assert workers.resolve("auto", light, isolate=False) == 0
    assert workers.resolve("5", light, isolate=True) == 5  # as given
    assert workers.resolve("0", heavy, isolate=True) == 0


def test_heaviest_cases_start_first():
    config = load_config(ROOT / "conformance.yaml")
    ids = sorted(read_manifest(config.goldens))
    costs = case_costs(config, ids)
    order = workers.heaviest_first(ids, costs)
    assert order[0].startswith("linear.fp8/") and "production" in order[0]  # it rebuilds a 42 MB weight
    assert costs[order[0]] > costs["attention/a-p21-d1x11-fixed"] > costs["quant.e2m1/midpoints"]
    assert [costs[i] for i in order] == sorted(costs.values(), reverse=True)


def test_rebuilt_inputs_come_from_the_cache_verified_and_a_damaged_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "cache"))
    config = load_config(ROOT / "conformance.yaml")
    manifest = read_manifest(config.goldens)
    case_id = "linear.fp8/indexer-wq_b-production-3x1280x4096"
    component = get("linear.fp8")

    def golden():
        return load_verified(config.goldens, case_id, manifest, config.generate_command)

    first = golden()
    recorded = first.meta["regenerated_inputs"]
    regenerated.restore(first, component)  # builds, checks, stores
    entries = sorted((tmp_path / "cache" / "inputs").rglob("*"))
    stored = [p for p in entries if p.is_file()]
    assert sorted(p.name for p in stored) == sorted(w["sha256"] for w in recorded.values())

    class NoBuilder:
        name = component.name

        def build(self, *args):
            raise AssertionError("rebuilt although the cache holds the inputs")

    second = golden()
    regenerated.restore(second, NoBuilder())
    for name in recorded:
        assert regenerated.tensor_sha256(second.inputs[name]) == recorded[name]["sha256"]

    victim = stored[0]
    victim.write_bytes(b"\0" + victim.read_bytes()[1:])  # one byte damaged
    third = golden()
    regenerated.restore(third, component)  # rebuilt, not read
    for name in recorded:
        assert regenerated.tensor_sha256(third.inputs[name]) == recorded[name]["sha256"]
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == victim.name  # and stored again


def test_the_cache_lives_in_the_users_cache_dir_and_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.delenv("CONFORMANCE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "v41-conformance"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "v41-conformance"
    assert ROOT not in cache.cache_dir().parents
    monkeypatch.setenv("CONFORMANCE_CACHE", "off")
    assert cache.cache_dir() is None
    data = b"weights"
    digest = hashlib.sha256(data).hexdigest()
    assert not cache.write("inputs", digest, data) and cache.read("inputs", digest) is None
    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "c"))
    assert not cache.write("inputs", "0" * 64, data)  # bytes that are not what the key says
    assert cache.write("inputs", digest, data) and bytes(cache.read("inputs", digest)) == data


def test_a_built_golden_is_reused_only_by_the_same_code_for_the_same_pin(tmp_path, monkeypatch):
    from v41_conformance import generate

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "cache"))
    config = load_config(ROOT / "conformance.yaml")
    store = tmp_path / "store"
    config = config.__class__(**{**config.__dict__, "goldens": store})
    data = b"a production golden"
    entry = {"sha256": hashlib.sha256(data).hexdigest()}
    case_id = "attention/a-production"
    assert not generate._from_cache(config, case_id, entry, "code-1")  # nothing cached yet
    cache.write(generate.CACHE_KIND, entry["sha256"], data, cache.keyed(case_id, "code-1"))
    assert not generate._from_cache(config, case_id, entry, "code-2")  # other code: rebuild
    assert not generate._from_cache(config, case_id, {"sha256": "f" * 64}, "code-1")  # another pin
    assert generate._from_cache(config, case_id, entry, "code-1")
    assert (store / "attention" / "a-production.safetensors").read_bytes() == data


def test_case_files_read_with_the_c_loader_give_the_same_data():
    assert issubclass(LOADER, getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for path in sorted((ROOT / "cases").rglob("*.yaml")):
        text = path.read_text()
        assert yaml.load(text, Loader=LOADER) == yaml.safe_load(text), path


def test_a_run_lends_cached_inputs_unverified_and_verifies_them_unless_the_answer_is_the_goldens(tmp_path, monkeypatch):
    """A passing case pays neither for hashing nor for copying its largest inputs: an answer
    bit-identical to the golden's could only come from the recorded inputs. Any other answer (or an
    exception) has them verified first; a damaged cache entry is then rebuilt, and the case is a
    golden error naming it, never a verdict on an answer computed from damaged inputs."""
    from v41_conformance.adapters.reference import ReferenceAdapter
    from v41_conformance.runner import run_case

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "cache"))
    config = load_config(ROOT / "conformance.yaml")
    manifest = read_manifest(config.goldens)
    case_id = "linear.fp8/indexer-wq_b-production-3x1280x4096"
    assert run_case(case_id, config, ReferenceAdapter(), "reference", manifest).status == "pass"  # builds the cache

    class Mutates(ReferenceAdapter):
        """The reference, then it scribbles over its input weights (and, if asked, its answer)."""

        def __init__(self, wrong: bool = False):
            self.wrong = wrong

        def run(self, component, inputs, params):
            out = super().run(component, inputs, params)
            inputs["weight"].view(torch.uint8).zero_()
            return {k: v.neg() for k, v in out.items()} if self.wrong else out

    verified = []
    original = cache.read
    monkeypatch.setattr(cache, "read", lambda *a, **k: verified.append(k.get("verify", True)) or original(*a, **k))
    assert run_case(case_id, config, Mutates(), "mutates", manifest).status == "pass"
    assert verified and not any(verified)  # taken unverified, lent without a copy, the answer the golden's
    verified.clear()
    failed = run_case(case_id, config, Mutates(wrong=True), "wrong", manifest)
    assert failed.status == "fail" and any(verified)  # verified before the difference was judged
    stored = sorted(p for p in (tmp_path / "cache" / "inputs").rglob("*") if p.is_file())
    for victim in stored:
        victim.write_bytes(b"\1" + victim.read_bytes()[1:])
    damaged = run_case(case_id, config, ReferenceAdapter(), "reference", manifest)
    assert (
        damaged.status == "error"
        and "did not match the SHA-256" in damaged.message
        and "run the case again" in damaged.message
    )
    assert run_case(case_id, config, ReferenceAdapter(), "reference", manifest).status == "pass"  # rebuilt
