"""Sparse attention's query inside `attention` (`q`, docs/verdicts.md "The chain" and "The logit scale"):
judged as `index_q` is, given your `qr`; `o` judged given it, and given it the logit-scale check of
sparse attention applies to a step of `logit_scale.MIN_ROWS` (query, head) rows or more."""

from __future__ import annotations

from conftest import ROOT
import v41_conformance.chain.attention as chain_attention
import v41_conformance.reference.attention as ref_attention
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.config import load_config
from v41_conformance.golden import load_verified, read_manifest
from v41_conformance.runner import run_case
from impls.patching import patched
from impls.wrong_attention import ScaleBf16

CONFIG = load_config(ROOT / "conformance.yaml")
MANIFEST = read_manifest(CONFIG.goldens)
CASE = "attention/a-p21-d1x11-upstream"


class QueryWithoutRope(ReferenceAdapter):
    """BUG: sparse attention's query left unrotated (the key rows and the output keep theirs)."""

    def run(self, component, inputs, params):
        rotate = ref_attention.apply_rotary

        def rotary(x, table, rope_dim, inverse=False):
            return x.clone() if x.ndim == 4 and not inverse else rotate(x, table, rope_dim, inverse)

        with patched(ref_attention, "apply_rotary", rotary):
            return super().run(component, inputs, params)


class WithoutQuery(ScaleBf16):
    """ScaleBf16, its intermediates returned but for q."""

    def run(self, component, inputs, params):
        return {k: v for k, v in super().run(component, inputs, params).items() if not k.endswith(".q") and k != "q"}


def test_a_query_without_its_rope_fails_at_q_given_your_qr():
    result = run_case(CASE, CONFIG, QueryWithoutRope(), "q-no-rope", MANIFEST)
    assert result.status == "fail" and result.first_divergent_stage.endswith(".q"), result.first_divergent_stage
    stage = result.outputs[result.first_divergent_stage]
    assert stage["given"] == ["qr"], stage


def test_o_is_judged_given_your_q_and_the_scale_check_follows_it(monkeypatch):
    """With the row count lowered to 0, every `o` given your q carries the check's z; without q
    returned, none does (your own GEMM's error on q would read as a logit scale)."""
    monkeypatch.setattr(chain_attention, "MIN_ROWS", 0)
    given = run_case(CASE, CONFIG, ScaleBf16(), "bf16-scale", MANIFEST)
    outputs = {n: m for n, m in given.outputs.items() if n.endswith(".o")}
    assert all(m["given"][0] == "q" for m in outputs.values()), outputs
    assert all(m.get("logit_scale_z") is not None for m in outputs.values() if m["rederived_rows"])
    bare = run_case(CASE, CONFIG, WithoutQuery(), "bf16-scale-no-q", MANIFEST)
    outputs = {n: m for n, m in bare.outputs.items() if n.endswith(".o")}
    assert outputs and not any(m.get("logit_scale_z") is not None for m in outputs.values())
    assert all("q" in m.get("assumed", []) for m in outputs.values() if m["rederived_rows"]), outputs


def test_the_small_tier_steps_are_below_the_row_count():
    """No step of the small tier's attention cases reaches MIN_ROWS (query, head) rows (168 at most): there
    the check cannot resolve a bf16 scale (4.9 spreads at most), and it does not apply; the production
    tier's prefill fails it (tests/test_production_chain.py)."""
    for case in sorted(c for c in MANIFEST if c.startswith("attention/")):
        meta = load_verified(CONFIG.goldens, case, MANIFEST).meta
        params, batch = meta["params"], int(meta["build"].get("batch", 2))
        rows = batch * max(end - start for start, end in params["schedule"]) * params["config"]["n_heads"]
        assert rows < chain_attention.MIN_ROWS, (case, rows)
    result = run_case(CASE, CONFIG, ScaleBf16(), "bf16-scale", MANIFEST)
    assert not any(m.get("logit_scale_z") is not None for n, m in result.outputs.items() if n.endswith(".o"))
