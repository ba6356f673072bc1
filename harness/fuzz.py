"""`conformance fuzz`: fresh cases at any seed and shape, judged like frozen ones; failures shrunk
and, on request, promoted to goldens.

A fuzz run samples cases (harness/fuzz_sample.py) in rounds. Each round builds its cases' goldens
with the reference into a private store under `<report-dir>/.fuzz/` (nothing touches `goldens/`),
then runs the implementation on them with `conformance run`'s own machinery (harness/session.py:
the adapters, isolation, `-n`, the comparator, expectations), so a fuzz case is judged exactly as
a frozen one would be. Rounds go on until `--budget` seconds or `--cases N` cases.

A failing case is shrunk (harness/space.py `shrink_candidates`): smaller shapes, fewer steps,
simpler inputs, each candidate built and judged in an isolated child, kept when it still fails
the same output the same way (`signature`). The smallest is printed as a case-file entry, with
the command that re-creates the original case; `--promote` appends it to `cases/` and writes its
golden through the normal generator (manifest and discrimination self-check included), after
which `conformance run --select <id>` reproduces the failure at once.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .cases import CaseSpec, concrete_specs, load_case_file
from .config import Config
from .errors import HarnessError, UsageError
from .fuzz_sample import Sampled, sample, selected_spaces
from .golden import encode, golden_path, manifest_entry, write_atomic, write_manifest
from .known import components
from .report.headroom import output_group
from .space import Space, shrink_candidates

FUZZ_DIR = ".fuzz"
BAD = ("fail", "error", "crash", "timeout")
ROUND_MIN_S, ROUND_MAX_S = 2.0, 20.0  # estimated reference seconds per round


@dataclass
class FuzzOptions:
    impl: str
    select: list[str]
    report_dir: Path
    seed: int = 0
    budget_s: float | None = 60.0
    cases: int | None = None
    index: int | None = None  # re-create one case of the seed (the command printed with a failure)
    workers: str = "0"
    isolate: bool = True
    timeout: float | None = None
    device: str = "cpu"
    config_path: str | None = None
    promote: bool = False
    shrink_s: float = 60.0
    shrink_most: int = 3  # distinct failures (component, signature) shrunk per run


@dataclass
class Tally:
    tried: int = 0
    failed: int = 0
    invalid: int = 0
    seconds: float = 0.0  # building the golden and judging, summed over the component's cases


@dataclass
class Store:
    """The private golden store of one fuzz run."""

    root: Path
    manifest: dict[str, dict] = field(default_factory=dict)

    @property
    def goldens(self) -> Path:
        return self.root / "goldens"

    def add(self, golden) -> str:
        case_id = golden.meta["case_id"]
        data = encode(golden)
        path = golden_path(self.goldens, case_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        self.manifest[case_id] = manifest_entry(self.goldens, case_id, data)
        write_manifest(self.goldens, self.manifest)
        return case_id


def signature(case: dict) -> tuple:
    """How a case failed: its status and, for a failed comparison, which outputs (by name, steps
    folded) failed. A shrunk case must fail the same way to replace the original."""
    if case["status"] != "fail":
        return (case["status"],)
    failing = sorted({output_group(n) for n, m in (case.get("outputs") or {}).items() if m.get("ok") is False})
    return ("fail", *failing)


def entry_yaml(entry: CaseSpec) -> str:
    """The case as a `cases/*.yaml` entry (flow-style mappings, one line each)."""
    lines = [f"  - name: {entry.name}"]
    if entry.params:
        lines.append(f"    params: {_flow(entry.params)}")
    if entry.build:
        lines.append(f"    build: {_flow(entry.build)}")
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=100000, sort_keys=True).strip()


def fuzz(config: Config, options: FuzzOptions) -> dict:
    from .rundir import RunDir
    from .session import judge_components

    chosen = selected_spaces(options.select)
    if not chosen:
        raise UsageError(
            f"--select {','.join(options.select)} matches no component with a case space; "
            "`conformance list --components` names them"
        )
    import os

    import torch

    # Building goldens: the small shapes fuzz draws gain nothing from intra-op threads, and on a
    # shared machine they lose much (as for the small tier's cases in harness/execution.py).
    torch.set_num_threads(int(os.environ.get("CONFORMANCE_THREADS", 1)))
    started = time.time()
    report_dir = Path(options.report_dir)
    with RunDir(report_dir) as run_dir:
        store = Store(run_dir.path / FUZZ_DIR)
        store.goldens.mkdir(parents=True)
        (store.root / "cases").mkdir()
        tallies = {name: Tally() for name in chosen}
        results: list[dict] = []
        invalid: list[dict[str, str]] = []
        sampled: dict[str, Sampled] = {}
        deadline = None if options.budget_s is None or options.cases is not None else started + options.budget_s
        stream = _cases(options, chosen)
        done = False
        round_number = 0
        while not done:
            batch, estimate = [], 0.0
            target = ROUND_MIN_S if round_number == 0 else min(ROUND_MAX_S, max(ROUND_MIN_S, estimate_left(deadline)))
            while estimate < target:
                case = next(stream, None)
                if case is None or (options.cases is not None and len(sampled) >= options.cases):
                    done = True
                    break
                if deadline is not None and time.time() >= deadline:
                    done = True
                    break
                sampled[case.spec.id] = case
                built = _build(case, config, store, tallies[case.spec.component], invalid)
                if built:
                    batch.append(case.spec.id)
                    estimate += case.cost
            if batch:
                results += _judge(batch, config, store, options, run_dir.path / f"round-{round_number}", tallies)
            round_number += 1
            if deadline is not None and time.time() >= deadline:
                done = True
        for case in results:
            case["repro"] = reproduce_command(options, sampled[case["id"]].index)
        failures = _failures(results, sampled, options)
        shrunk = _shrink_all(failures, chosen, config, store, options, run_dir)
        promoted = _promote_all(shrunk, config, options) if options.promote else {}
        per, problems = judge_components(results, {}, False, "")
        problems += [
            f"{i['id']}: the space drew a case the reference refused ({i['why']}); a harness bug, please report"
            for i in invalid
        ]
        doc = _document(options, config, chosen, tallies, results, per, problems, shrunk, promoted, started)
        from .report import write_reports

        write_reports(doc, report_dir)
    return doc


def estimate_left(deadline: float | None) -> float:
    return ROUND_MAX_S if deadline is None else max(0.0, (deadline - time.time()) / 4)


def _cases(options: FuzzOptions, chosen: dict[str, Space]):
    if options.index is not None:  # one case, as sampled at that index of that seed
        for case in sample(options.seed, chosen):
            if case.index == options.index:
                yield case
                return
    yield from sample(options.seed, chosen)


def _build(case: Sampled, config: Config, store: Store, tally: Tally, invalid: list) -> bool:
    from .generate import build_golden

    start = time.perf_counter()
    try:
        store.add(build_golden(case.spec, config))
        return True
    except Exception as exc:  # the space drew something the reference refuses: not the implementation's fault
        invalid.append({"id": case.spec.id, "why": f"{type(exc).__name__}: {exc}"[:300]})
        tally.invalid += 1
        return False
    finally:
        tally.seconds += time.perf_counter() - start


def _judge(
    batch: list[str], config: Config, store: Store, options: FuzzOptions, report_dir: Path, tallies: dict[str, Tally]
) -> list[dict]:
    from .session import RunOptions
    from .session import run as run_session

    run_options = RunOptions(
        impl=options.impl,
        select=list(batch),
        report_dir=report_dir,
        workers=options.workers,
        device=options.device,
        timeout=options.timeout,
        isolate=options.isolate,
        config_path=options.config_path,
    )
    doc = run_session(replace(config, goldens=store.goldens, cases=store.root / "cases"), run_options)
    for case in doc["cases"]:
        tally = tallies[case["component"]]
        tally.tried += 1
        tally.failed += case["status"] in BAD
        tally.seconds += float(case.get("duration_s") or 0.0)
    return doc["cases"]


def _failures(results: list[dict], sampled: dict[str, Sampled], options: FuzzOptions) -> list[dict]:
    """The first failing case of each (component, signature), at most `shrink_most` of them."""
    seen, chosen = set(), []
    for case in results:
        if case["status"] not in BAD:
            continue
        key = (case["component"], signature(case))
        if key in seen:
            continue
        seen.add(key)
        chosen.append({"case": case, "sampled": sampled[case["id"]]})
    return chosen[: options.shrink_most]


def _shrink_all(
    failures: list[dict], chosen: dict[str, Space], config: Config, store: Store, options: FuzzOptions, run_dir
) -> list[dict]:
    from .pool import executor_for

    if not failures:
        return []
    out = []
    run = _executor_run(config, store, options, run_dir)
    executor = executor_for(run)
    try:
        deadline = time.time() + options.shrink_s
        for failure in failures:
            out.append(
                _shrink(failure, chosen[failure["case"]["component"]], config, store, executor, deadline, options)
            )
    finally:
        executor.close()
    return out


def _executor_run(config: Config, store: Store, options: FuzzOptions, run_dir) -> dict:
    from .adapters.loader import resolve

    spec = resolve(options.impl, config)
    return {
        "token": f"fuzz-shrink-{run_dir.token}",
        "run_dir": str(run_dir.path),
        "config": str(config.path),
        "tier": config.tier,
        "goldens_dir": str(store.goldens),
        "cases_dir": str(store.root / "cases"),
        "impl": {"name": spec.name, "kind": spec.kind, "target": spec.target, "root": spec.root, "conf": spec.conf},
        "device": options.device,
        "timeout": options.timeout or config.timeout,
        "isolate": options.isolate,
        "workers": 1,
        "prefetch": False,
        "diagnosis_budget": 0,
    }  # shrinking compares failures' signatures: no diagnosis of each candidate


def _shrink(
    failure: dict, space: Space, config: Config, store: Store, executor, deadline: float, options: FuzzOptions
) -> dict:
    from .generate import build_golden

    case, sampled = failure["case"], failure["sampled"]
    want = signature(case)
    current = sampled.entry
    current_case = case
    steps = attempts = 0
    component = components()[space.component]
    improved = True
    while improved and time.time() < deadline:
        improved = False
        for params, build in shrink_candidates(space, current.params, current.build):
            if time.time() >= deadline:
                break
            attempts += 1
            name = f"{sampled.entry.name}-m{attempts}"
            entry = CaseSpec(space.component, name, params, build, source="shrunk")
            try:
                concrete = concrete_specs(entry, component)
                if len(concrete) != 1:
                    continue
                case_id = store.add(build_golden(concrete[0], config))
            except Exception:
                continue  # a candidate the builder or the reference refuses
            result = executor.run(case_id).to_json()
            if result["status"] in BAD and signature(result) == want:
                current, current_case = entry, result
                steps += 1
                improved = True
                break
    return {
        "original": case,
        "sampled": sampled,
        "entry": current,
        "case": current_case,
        "steps": steps,
        "attempts": attempts,
        "signature": list(want),
        "command": reproduce_command(options, sampled.index),
    }


def reproduce_command(options: FuzzOptions, index: int) -> str:
    parts = ["conformance", "fuzz", "--impl", options.impl, "--seed", str(options.seed), "--index", str(index)]
    for pattern in options.select:
        parts += ["--select", pattern]
    if options.config_path:
        parts += ["--config", options.config_path]
    if options.device != "cpu":
        parts += ["--device", options.device]
    return " ".join(shlex.quote(p) for p in parts)


def _promote_all(shrunk: list[dict], config: Config, options: FuzzOptions) -> dict[str, str]:
    """Each shrunk case into cases/ and its golden through the generator: {fuzz id: message}."""
    out = {}
    for item in shrunk:
        entry: CaseSpec = item["entry"]
        out[item["original"]["id"]] = promote(entry, config)
    return out


def promote(entry: CaseSpec, config: Config) -> str:
    """Append `entry` to its component's case file, generate its golden; undo the append if the
    generator refuses it. Returns what happened, starting with the case id or 'not promoted'."""
    from .generate import generate

    component = components()[entry.component]
    path = promoted_case_file(config.cases, entry.component)
    before = path.read_text() if path.exists() else None
    text = before if before is not None else f"component: {entry.component}\ncases:\n"
    if not text.endswith("\n"):
        text += "\n"
    path.write_text(text + entry_yaml(entry))
    ids = [c.id for c in concrete_specs(entry, component)]
    try:
        if not any(c.name == entry.name for c in load_case_file(path)):
            raise HarnessError(f"{path}: the appended case did not load (is `cases:` the last key?)")
        report = generate(config, select=ids)
        if report.errors:
            raise HarnessError("; ".join(report.errors.values()))
    except HarnessError as exc:
        if before is None:
            path.unlink()
        else:
            path.write_text(before)
        return f"not promoted: {exc}"
    return ", ".join(ids)


def promoted_case_file(cases_dir: Path, component: str) -> Path:
    """The case file of `component`'s promoted fuzz cases, `<component>_fuzz.yaml` (a file of its own, apart
    from the hand-written cases: what the fuzz found stays visible as such)."""
    return Path(cases_dir) / f"{component.replace('.', '_')}_fuzz.yaml"


def _document(
    options: FuzzOptions,
    config: Config,
    chosen: dict[str, Space],
    tallies: dict[str, Tally],
    results: list[dict],
    per: dict,
    problems: list[str],
    shrunk: list[dict],
    promoted: dict[str, str],
    started: float,
) -> dict:
    import platform
    import sys

    import torch

    from . import __version__
    from .session import RESULTS_SCHEMA, exit_code_of

    failures = []
    for item in shrunk:
        entry = item["entry"]
        failures.append(
            {
                "id": item["original"]["id"],
                "component": item["original"]["component"],
                "status": item["original"]["status"],
                "signature": item["signature"],
                "why": (item["original"].get("message") or "").split("\n")[0][:400],
                "command": item["command"],
                "shrunk": {
                    "id": item["case"]["id"],
                    "steps": item["steps"],
                    "attempts": item["attempts"],
                    "entry": f"component: {entry.component}\ncases:\n" + entry_yaml(entry),
                    "why": (item["case"].get("message") or "").split("\n")[0][:400],
                },
                "promoted": promoted.get(item["original"]["id"], ""),
            }
        )
    return {
        "schema": RESULTS_SCHEMA,
        "impl": options.impl,
        "impl_kind": "fuzz",
        "device": options.device,
        "select": options.select,
        "shard": None,
        "tier": config.tier,
        "selection": {},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 3),
        "exit_code": exit_code_of(results, problems, "", None),
        "versions": {
            "harness": __version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "goldens": {"dir": "(fuzz: built in memory from the seed)", "manifest_sha256": None},
        "components": per,
        "problems": problems,
        "stopped": "",
        "not_run": 0,
        "stale_expectations": [],
        "cases": sorted(results, key=lambda r: r["id"]),
        "fuzz": {
            "seed": options.seed,
            "budget_s": options.budget_s,
            "cases_requested": options.cases,
            "index": options.index,
            "components": {
                name: {
                    "tried": t.tried,
                    "failed": t.failed,
                    "invalid": t.invalid,
                    "cases_per_s": round(t.tried / t.seconds, 2) if t.seconds else None,
                }
                for name, t in sorted(tallies.items())
            },
            "spaces": {name: s.note for name, s in sorted(chosen.items())},
            "failures": failures,
        },
    }


def fuzz_json(doc: dict) -> str:
    return json.dumps(doc["fuzz"], indent=1)
