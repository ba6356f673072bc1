"""Every component has a case space, and what it draws builds and passes with the reference."""

from __future__ import annotations

import pytest

from conftest import ROOT
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.config import load_config
from v41_conformance.fuzz_sample import draw
from v41_conformance.generate import build_golden
from v41_conformance.known import components
from v41_conformance.runner import CaseResult, judge_golden
from v41_conformance.space import shrink_candidates
from v41_conformance.spaces import spaces

DRAWS = 12


def test_every_component_has_a_space():
    missing = sorted(set(components()) - set(spaces()))
    assert not missing, f"components without a case space (harness/spaces/): {missing}"


@pytest.mark.parametrize("component", sorted(components()))
def test_draws_build_and_the_reference_passes_them(component):
    space = spaces().get(component)
    if space is None:
        pytest.fail(f"{component} has no space")
    config = load_config(ROOT / "conformance.yaml")
    impl = ReferenceAdapter()
    seen = set()
    for index in range(DRAWS):
        case = draw(space, seed=1234, index=index)
        assert case.cost >= 0
        seen.add(repr(case.entry.build) + repr(case.entry.params))
        golden = build_golden(case.spec, config)
        result = CaseResult(case.spec.id, component, "error")
        judge_golden(components()[component], golden, impl, config, {}, result)
        assert result.status == "pass", f"{case.spec.id} {case.entry.params} {case.entry.build}: {result.message[:800]}"
    assert len(seen) > DRAWS // 2, "the space draws the same case again and again"
    again = draw(space, seed=1234, index=3)
    assert again.entry == draw(space, seed=1234, index=3).entry  # deterministic


def test_shrinking_yields_smaller_variants_that_still_build():
    space = spaces()["sparse_attn"]
    case = draw(space, seed=7, index=0)
    candidates = list(shrink_candidates(space, case.entry.params, case.entry.build))
    assert candidates
    config = load_config(ROOT / "conformance.yaml")
    built = 0
    from v41_conformance.cases import CaseSpec, concrete_specs

    for params, build in candidates[:10]:
        try:
            spec = concrete_specs(CaseSpec("sparse_attn", "shrunk", params, build), components()["sparse_attn"])[0]
            build_golden(spec, config)
            built += 1
        except Exception:
            pass
    assert built > 0
