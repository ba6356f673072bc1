"""The top-k branches that tie-dense random rows never reach, pinned by goldens (cases/topk_fallbacks.yaml).

Three branches of the emulated torch CPU top-k (`v41_conformance.reference.topk`) had no golden:
the short-run handling of the std::sort of the first k-1 picks (`_introsort_short` moves a range
of more than 16 equal keys as one cached permutation: `TopkStats.short_uniform_runs`) and the
depth-limit fallbacks of __introselect (heap select) and __introsort_loop (heap sort), reached by
McIlroy's adversary (`kind: adversarial`). For every case of that file this module proves:

* its golden is what this torch's own ``torch.topk`` returns on the CPU, indices and values bit
  for bit (the golden is real torch behaviour, not only the emulation's);
* the emulation reproduces it and reaches exactly the branches the case is meant for;
* each mutant of the emulation (a branch replaced by what a plausible port would do instead)
  changes the output of exactly the cases that reach its branch, and the project's judge
  (`api.check_outputs`) fails it there as tie order, which ``accept_ties`` accepts: the
  goldens hold each branch's tie order.

Unsorted cases leave the order of the picks unspecified, so there a mutant is judged with
``strict_topk_order``; by default only a mutant that changes the set of picks fails.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import v41_conformance.reference.topk as topk_module
from v41_conformance import api
from v41_conformance.reference.topk import TopkStats, emulate_topk

needs_libstdcxx = pytest.mark.skipif(
    not (platform.system() == "Linux" and "GCC" in torch.__config__.show()),
    reason="torch's CPU topk tie order is emulated for Linux + GCC (libstdc++) builds only",
)

CASES_FILE = Path(__file__).resolve().parents[1] / "cases" / "topk_fallbacks.yaml"
COMPONENT = "topk.torch_cpu"

# The TopkStats counters that tell the branches apart, and each case's (> 0; the others stay 0).
SHORT = "short_uniform_runs"
SELECT = "introselect_heap_fallbacks"
SORT = "introsort_heap_fallbacks"
PARTIAL = "partial_sort_rows"
BRANCHES = (PARTIAL, SHORT, SELECT, SORT)
REACHES = {
    "short-run-few-values-n1000-k200-sorted": {SHORT},
    "short-run-few-values-n2000-k600-sorted-bf16": {SHORT},
    "short-run-few-values-n600-k150-smallest-bf16": {SHORT},
    "adversarial-select-n1000-k250-unsorted": {SELECT},
    "adversarial-select-n1000-k600-ties2-sorted-bf16": {SELECT, SORT},
    "adversarial-select-n500-k200-ties2-sorted-smallest": {SELECT, SORT},
    "adversarial-sort-n1000-k999-ties2-sorted": {SORT},
    "adversarial-sort-n1000-k100-ties2-unsorted-bf16": {SELECT},
    "adversarial-sort-n1000-k200-ties2-unsorted-bf16": {SELECT},
    "adversarial-partial-n2000-k20-bf16": {PARTIAL},
}
# Unsorted cases where a mutant picks other tied elements, not only another order (mutant names).
SET_CHANGES = {
    "adversarial-sort-n1000-k100-ties2-unsorted-bf16": {"stable_heap_select"},
    "adversarial-sort-n1000-k200-ties2-unsorted-bf16": {"stable_heap_select", "no_depth_limit"},
}


# ---------------------------------------------------------------------------------- mutants


def _stable_select_array(K, I, first, middle, last):
    """__heap_select done as a stable selection: the best middle-first, lowest slot first among ties
    (stored worst first, so the caller's swap still puts the worst kept at nth)."""
    src = np.argsort(K[first:last], kind="stable")[: middle - first][::-1] + first
    K[first:middle], I[first:middle] = K[src], I[src]


def _stable_select_list(K, I, first, middle, last):
    src = sorted(range(first, last), key=K.__getitem__)[: middle - first][::-1]
    K[first:middle], I[first:middle] = [K[j] for j in src], [I[j] for j in src]


def _stable_sort_array(K, I, first, last):
    """The heap sort fallback done as a stable sort."""
    src = np.argsort(K[first:last], kind="stable") + first
    K[first:last], I[first:last] = K[src], I[src]


def _stable_sort_list(K, I, first, last):
    src = sorted(range(first, last), key=K.__getitem__)
    K[first:last], I[first:last] = [K[j] for j in src], [I[j] for j in src]


def _keep_in_place(length: int, depth: int) -> Callable[[list], list]:
    """A run of equal keys left where it is, as a stable sort would leave it."""
    return list


# mutant name -> (the branch it replaces, the emulation's functions it replaces)
MUTANTS: dict[str, tuple[str, dict[str, Callable]]] = {
    "no_depth_limit": ("fallbacks", {"_lg": lambda n: 1 << 20}),  # partitions on, never falls back
    "stable_heap_select": (SELECT, {"_heap_select_np": _stable_select_array, "_heap_select": _stable_select_list}),
    "stable_heap_sort": (SORT, {"_heap_sort_np": _stable_sort_array, "_sort_heap": _stable_sort_list}),
    "short_run_in_place": (SHORT, {"_uniform_introsort_take": _keep_in_place}),
}


def _mutant_reaches(mutant: str, name: str) -> bool:
    branch = MUTANTS[mutant][0]
    reached = REACHES[name]
    return bool(reached & {SELECT, SORT}) if branch == "fallbacks" else branch in reached


# ---------------------------------------------------------------------------------- helpers


def _case_names() -> list[str]:
    spec = yaml.safe_load(CASES_FILE.read_text())
    assert spec["component"] == COMPONENT
    return [c["name"] for c in spec["cases"]]


NAMES = _case_names()


def _case(name: str) -> api.Case:
    return api.case(f"{COMPONENT}/{name}")


def _call(case: api.Case) -> tuple[torch.Tensor, int, bool, bool]:
    p = case.params
    return case.inputs()["values"], int(p["k"]), bool(p["largest"]), bool(p["sorted"])


def _emulated(case: api.Case, stats: TopkStats | None = None) -> dict[str, torch.Tensor]:
    x, k, largest, sorted_ = _call(case)
    values, indices = emulate_topk(x, k, largest=largest, sorted=sorted_, stats=stats)
    return {"values": values, "indices": indices}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert torch.equal(got["indices"], want["indices"]), f"{what}: indices differ"
    assert got["values"].dtype == want["values"].dtype, f"{what}: values dtype differs"
    assert torch.equal(_bits(got["values"]), _bits(want["values"])), f"{what}: values differ in their bits"


# ---------------------------------------------------------------------------------- tests


def test_every_case_of_the_file_has_its_branches_named() -> None:
    assert sorted(NAMES) == sorted(REACHES)
    assert {f"{COMPONENT}/{n}" for n in NAMES} <= {c.id for c in api.cases(f"{COMPONENT}/*")}


@needs_libstdcxx
@pytest.mark.parametrize("name", NAMES)
def test_golden_is_torch_topk(name: str) -> None:
    case = _case(name)
    x, k, largest, sorted_ = _call(case)
    values, indices = torch.topk(x, k, largest=largest, sorted=sorted_)
    _assert_same({"values": values, "indices": indices}, case.expected(), f"{name}: torch.topk vs golden")


@pytest.mark.parametrize("name", NAMES)
def test_emulation_reaches_the_intended_branches(name: str) -> None:
    case = _case(name)
    stats = TopkStats()
    _assert_same(_emulated(case, stats), case.expected(), f"{name}: emulation vs golden")
    reached = {branch for branch in BRANCHES if getattr(stats, branch) > 0}
    assert reached == REACHES[name], stats


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
@pytest.mark.parametrize("name", NAMES)
def test_mutant_fails_exactly_the_cases_of_its_branch(name: str, mutant: str, monkeypatch) -> None:
    case = _case(name)
    with monkeypatch.context() as patch:  # only the emulation is mutated, never the judge
        for attribute, replacement in MUTANTS[mutant][1].items():
            patch.setattr(topk_module, attribute, replacement)
        outputs = _emulated(case)
    if not _mutant_reaches(mutant, name):
        _assert_same(outputs, case.expected(), f"{name}: {mutant} changed a case that does not reach its branch")
        return
    assert not torch.equal(outputs["indices"], case.expected()["indices"]), f"{name}: {mutant} changed nothing"
    if case.params["sorted"]:
        _assert_fails_as_tie_order(case, outputs, {})
    else:
        _assert_judged_unsorted(case, outputs, mutant in SET_CHANGES.get(name, set()))


def _assert_fails_as_tie_order(case: api.Case, outputs: dict[str, torch.Tensor], conf: dict) -> None:
    """Fails on indices alone, every differing row tie order (no miss), and passes with accept_ties."""
    verdict = api.check_outputs(case, outputs, impl_conf=conf)
    indices = verdict.outputs["indices"]
    assert not verdict.ok and verdict.outputs["values"]["ok"], verdict
    assert indices["rows_tie"] > 0 and indices["rows_miss"] == 0, indices
    assert api.check_outputs(case, outputs, impl_conf={**conf, "accept_ties": True}).ok


def _assert_judged_unsorted(case: api.Case, outputs: dict[str, torch.Tensor], set_changes: bool) -> None:
    """An unsorted case: the mutant fails strict_topk_order; by default it fails (as tie order) only
    where it picked other tied elements, since the order of the picks is unspecified."""
    assert not api.check_outputs(case, outputs, impl_conf={"strict_topk_order": True}).ok
    picked = [set(row) for row in outputs["indices"].tolist()]
    wanted = [set(row) for row in case.expected()["indices"].tolist()]
    assert (picked != wanted) == set_changes
    if set_changes:
        _assert_fails_as_tie_order(case, outputs, {})
    else:
        assert api.check_outputs(case, outputs).ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_adversarial_levels_stay_distinct_and_exact(dtype: torch.dtype) -> None:
    """The adversary's keys (up to 2n) become values the dtype holds exactly, in the keys' order, so
    a bf16 / f16 case replays the same comparisons as the keys did."""
    from v41_conformance.components.topk import _exact_levels

    levels = _exact_levels(torch.arange(2 * 4096 + 1), dtype)
    assert torch.equal(levels.to(dtype).float(), levels) and bool((levels[1:] > levels[:-1]).all())


# ---------------------------------------------------------------------------------- fuzz space


def _fuzz_branches(index: int) -> set[str]:
    """The counted branches draw `index` of fuzz seed 0 reaches (only cheap draws are built: adversarial
    rows and few_values rows of at most 20,000 elements; the rest count as reaching none)."""
    from v41_conformance.fuzz_sample import draw
    from v41_conformance.known import components
    from v41_conformance.spaces import spaces

    spec = draw(spaces()[COMPONENT], seed=0, index=index).spec
    rows, n = spec.build["shape"]
    if spec.build["kind"] != "adversarial" and not (spec.build["kind"] == "few_values" and rows * n <= 20_000):
        return set()
    params = components()[COMPONENT].with_defaults(spec.params)
    x = components()[COMPONENT].build(dict(params), dict(spec.build), spec.generator())["values"]
    stats = TopkStats()
    emulate_topk(x, int(params["k"]), largest=bool(params["largest"]), sorted=bool(params["sorted"]), stats=stats)
    return {branch for branch in (SHORT, SELECT, SORT) if getattr(stats, branch) > 0}


def test_fresh_fuzz_cases_reach_every_branch() -> None:
    """Fuzz seed 0 reaches the short-run handling and both fallbacks within its first 100 top-k draws."""
    reached: set[str] = set()
    for index in range(100):
        reached |= _fuzz_branches(index)
        if reached == {SHORT, SELECT, SORT}:
            return
    pytest.fail(f"the first 100 draws of seed 0 reach only {sorted(reached)}")
