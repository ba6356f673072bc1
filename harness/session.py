"""`conformance run`: select cases, drive pytest over them, gather results, decide the verdict.

The results document (`results.json`) is the single source of truth; every renderer reads it.
Schema (version 1)::

    {schema, impl, impl_kind, device, select, shard ([I, N] or null), tier, started, duration_s,
     exit_code,                  # the process's: `conformance run`'s, or the pytest session's (the plugin)
     selection: {total, owned, ids_sha256, deselected},  # the cases chosen before sharding, those this run
                                 # owned, those pytest's -k/-m/--deselect left out (the plugin)
     stopped,                    # why the run ended early ('' when it ran to the end), not_run
     versions: {harness, torch, python, platform},
     children: {start, server, why},  # how isolation children started: the start method, what the fork
                                 # server is (a fork of the run's process, or a fresh interpreter) and why
                                 # (harness/forkserver.py `how`); start `none` with --no-isolate
     store: {package, version, origin (package | checkout | custom), tier, manifest_sha256},  # harness/store.py
     config: {path, layered_on},  # the conformance.yaml read, and the default store's it was layered on
     overrides: [{key, value, default}],  # every tolerance, floor, timeout or switch the configuration
                                 # changed from the packaged defaults (harness/config.py)
     goldens: {dir, manifest_sha256},
     components: {name: {cases, pass, fail, error, crash, timeout, unsupported, xfail, xpass,
                         floor, floor_ok, tie_rows, near_tie_rows, boundary_flips, signed_zeros, verdict}},
     problems: [str],            # run-level: floors unmet, nothing ran, stale expectations
     stale_expectations: [str],
     cases: [{id, component, status, kind (an error's: dtype error, exception, ...), message, params,
              metrics: {outputs, outputs_failed, outputs_declined (judged neither way), max_ulps, rel_l2, max_abs_err, diff_fraction,
                        bound_used, ulps_headroom, rel_l2_headroom, mismatched, rows_miss, rows_tie,
                        rows_near_tie, boundary_flips, signed_zeros},
              outputs: {name: {ok, policy, note (what a passing output accepted), and that
                               output's metrics; a failing tolerance output adds
                               ulps_histogram: {edges, counts}; along a chain (harness/chain):
                               intermediate (a value the implementation returned at a decision
                               point), given / assumed (the inputs it was judged given: the
                               implementation's own, or the reference's standing in), rederived_rows,
                               hint (what to return to settle an unattributed difference)}},
              duration_s, golden_sha256, tie_rows, tie_example, near_tie_rows, near_tie_example,
              boundary_flips, boundary_example, signed_zeros, signed_zero_example, first_divergent_step,
              first_divergent_stage (along a chain: the first failing output or intermediate),
              expectation, repro (into a sibling report dir), output (the tail it printed)}],
     baseline: {...},            # with --baseline: the diff document (harness/diff.py)
     merged_from, floors_enforced}  # written by `conformance merge` (harness/merge.py)

`bound_used` is the worst element's |actual - expected| over its element-wise bound and
`rel_l2_headroom` the relative L2 error over its bound: 1.0 is at the bound.

Accepted differences (tie order, near ties, boundary flips, signed zeros; harness/differences.py) are counted
per output, per case and per component whether or not they were accepted.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

import torch

from . import __version__
from .adapters.loader import instantiate, resolve
from .config import Config
from .diff import diff_results
from .differences import DIFFERENCES
from .errors import UsageError
from .expectations import apply_expectations, load_expectations
from .golden import MANIFEST
from .ids import split_case_id
from .plan import DEFAULT_REPORT_DIR  # noqa: F401  (re-exported)
from .plan import RunOptions, case_costs, ids_digest, run_document, select_case_ids, shard_ids
from .known import components
from .rundir import RunDir
from .runner import STATUSES
from .stop_signals import StopSignals
from .store import identity

RESULTS_SCHEMA = 1
NOT_RUN = "not_run"


XDIST_FLAGS = ("-n", "--numprocesses", "--tx", "-d", "--dist", "--maxprocesses")
# The run's own pytest session: no cache, no assertion rewriting, one line of progress; and none of
# the plugins that collect garbage at its end to find unraisable exceptions (with torch loaded, a
# third of a second for nothing: the cases run in other processes, or report their own errors).
QUIET_PYTEST = (
    "-p",
    "no:cacheprovider",
    "-p",
    "no:unraisableexception",
    "-p",
    "no:threadexception",
    "--assert=plain",
    "-q",
    "--no-header",
    "-rN",
    "--tb=no",
)


def _xdist_requested(pytest_args: tuple[str, ...]) -> bool:
    """pytest-xdist options in --pytest-args (remote --tx workers, say): pytest-xdist runs the
    cases, each of its workers with its own isolation child, instead of this process's pool."""
    return any(
        a == flag or a.startswith(flag + "=") or (flag == "-n" and a.startswith("-n") and a[2:].isdigit())
        for a in pytest_args
        for flag in XDIST_FLAGS
    )


def read_baseline(path: Path) -> dict:
    """A results document from a report dir or a results.json (UsageError naming the file)."""
    from .report import read_results

    return read_results(path)


def load_implementation(config: Config, options: RunOptions, flag: str = "--impl"):
    """Resolve `options.impl` and build it once, before any case runs, and let it prepare() (build its
    extensions, once, before workers start): an implementation that cannot be loaded is one
    UsageError naming `flag`, never an error per case. Returns its ImplSpec."""
    try:
        spec = resolve(options.impl, config)
        impl = instantiate(spec)
    except UsageError as exc:
        raise UsageError(str(exc).replace("--impl", flag)) from None  # the loader speaks of --impl
    prepare = getattr(impl, "prepare", None)
    if callable(prepare):
        try:
            prepare()
        except Exception as exc:
            raise UsageError(f"{flag} {options.impl}: prepare() failed: {type(exc).__name__}: {exc}") from None
    return spec


def run(config: Config, options: RunOptions) -> dict:
    """Run the selected cases, write every report into `options.report_dir`, return results.json.

    The report dir is locked for the whole run (`v41_conformance.rundir`); SIGINT and SIGTERM stop the
    run the way Ctrl-C stops pytest: the cases that finished keep their verdicts, the rest are
    `not_run`, the reports are written, and every isolation child's process group is killed.
    """
    import pytest

    from . import forkserver, workers
    from .pytest_plugin import RUN_SUFFIX, ResultCollector
    from .report import write_reports

    if options.isolate:
        forkserver.warm_up()  # the fork server imports torch while this process selects the cases
    spec = load_implementation(config, options)  # fail fast (exit 2) on one that cannot even be loaded
    expectations = load_expectations(spec.conf, config.root, f"{config.path}: impls.{spec.name}")
    baseline = read_baseline(options.baseline) if options.baseline else None  # before this run rewrites it
    ids = select_case_ids(config, options.select)
    selection = {"total": len(ids), "ids_sha256": ids_digest(ids)}
    if options.shard:
        ids = shard_ids(ids, *options.shard)
    selection["owned"] = len(ids)
    costs = case_costs(config, ids)
    ids = workers.heaviest_first(ids, costs)
    pool = options.isolate and not _xdist_requested(options.pytest_args)
    count = workers.resolve(options.workers, costs, options.isolate)
    with RunDir(options.report_dir) as run_dir:
        run_file = run_dir.path / f"cases{RUN_SUFFIX}"
        run_file.write_text(
            json.dumps(
                run_document(
                    config,
                    options,
                    spec,
                    ids,
                    run_dir.token,
                    str(run_dir.path.resolve()),
                    max(1, count) if pool else 1,
                    pool,
                )
            )
        )
        (run_dir.path / "pytest.ini").write_text("[pytest]\n")
        collector = ResultCollector()
        args = [
            "-c",
            str(run_dir.path / "pytest.ini"),
            "--rootdir",
            str(run_dir.path),
            "-p",
            "v41_conformance.pytest_plugin",
            *QUIET_PYTEST,
            str(run_file),
        ]
        if not pool and count > 1:
            args += ["-n", str(count)]
        args += list(options.pytest_args)
        started = time.time()
        stop = StopSignals()
        with stop:
            code = pytest.main(args, plugins=[collector]) if ids else pytest.ExitCode.OK
            run_dir.kill_children()
            if code == pytest.ExitCode.USAGE_ERROR:
                raise UsageError(
                    f"pytest refused the arguments {' '.join(args[len(args) - len(options.pytest_args) :])!r} "
                    "(its message is above); check --pytest-args and -n"
                )
            if code == pytest.ExitCode.INTERRUPTED and stop.signal is None:
                stop.signal = signal.SIGINT
            early = int(code) == 1 and any(
                a in ("-x", "--exitfirst") or a.startswith("--maxfail") for a in options.pytest_args
            )
            stopped = stopped_reason(stop.signal, "-x / --maxfail in --pytest-args" if early else "")
            results = [result_of(case_id, collector, stopped, options.repro(case_id)) for case_id in ids]
            run_dir.gather_output(ids, {r["id"]: r["status"] for r in results})
            stale = apply_expectations(results, expectations)
            doc = summarise(config, options, spec, results, stale, started, stopped, stop.signal, selection)
            if baseline is not None:
                doc["baseline"] = diff_results(baseline, doc, str(options.baseline), str(options.report_dir))
            write_reports(doc, options.report_dir)
    return doc


def stopped_reason(signum: int | None, stopped_early_by: str = "") -> str:
    """Why cases may have been left out: '' when the run went to the end. `stopped_early_by`: the
    option that ended it at the first failure (-x, --maxfail), if it did."""
    if signum is not None:
        return f"the run was interrupted by {signal.Signals(signum).name}"
    if stopped_early_by:
        return f"the run stopped at the first failure ({stopped_early_by})"
    return ""


def result_of(case_id: str, collector, stopped: str, repro: str) -> dict:
    """A case's result as the run's collector gathered it; `crash` when the pytest-xdist worker
    running it died, `not_run` when the run ended before it."""
    data = collector.results.get(case_id)
    if data is None and case_id in collector.crashed:
        data = {
            "id": case_id,
            "component": split_case_id(case_id)[0],
            "status": "crash",
            "message": f"the worker running this case died: {collector.crashed[case_id]}",
            "outputs": {},
        }
    if data is None:
        why = stopped or "the run ended before this case was handed to a worker"
        data = {
            "id": case_id,
            "component": split_case_id(case_id)[0],
            "status": NOT_RUN,
            "message": f"not run: {why}; this says nothing about the implementation",
            "outputs": {},
        }
    data["repro"] = repro
    return data


def summarise(
    config: Config,
    options: RunOptions,
    spec,
    results: list[dict],
    stale: list[str],
    started: float,
    stopped: str = "",
    signum: int | None = None,
    selection: dict | None = None,
) -> dict:
    registry = components()
    # floors: on a full run of the small tier (not a --select, a shard, or a pytest -k/-m/--deselect)
    full_run = (
        not options.select and not options.shard and config.tier == "small" and not (selection or {}).get("deselected")
    )
    floors = {name: config.floor(component) for name, component in registry.items()}
    run_diagnosis = run_level_names(results)  # tie orders named from several cases' evidence together
    per_component, problems = judge_components(results, floors, full_run, stopped)
    exit_code = exit_code_of(results, problems, stopped, signum)
    manifest_path = config.goldens / MANIFEST
    return {
        "schema": RESULTS_SCHEMA,
        "impl": spec.name,
        "impl_kind": spec.kind,
        "device": options.device,
        "select": options.select,
        "shard": list(options.shard) if options.shard else None,
        "tier": config.tier,
        "selection": selection or {},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 3),
        "exit_code": exit_code,
        "versions": {
            "harness": __version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "children": children_of(options),
        "store": identity(config.goldens, config.tier),
        "config": {"path": str(config.path), "layered_on": str(config.layered_on) if config.layered_on else None},
        "overrides": config.overrides(spec.name),
        "goldens": {
            "dir": os.path.relpath(config.goldens, config.root),
            "manifest_sha256": hashlib.sha256(manifest_path.read_bytes()).hexdigest()
            if manifest_path.exists()
            else None,
        },
        "components": per_component,
        "problems": problems,
        "run_diagnosis": run_diagnosis,
        "stopped": stopped,
        "not_run": sum(1 for r in results if r["status"] == NOT_RUN),
        "stale_expectations": stale,
        "cases": sorted(results, key=lambda r: r["id"]),
    }


def run_level_names(results: list[dict]) -> list[dict]:
    """`diagnosis.across_cases.name_across_cases`, imported (with the variant catalogue) only where a
    case recorded tie evidence for it."""
    if not any((r.get("diagnosis") or {}).get("tie_support") for r in results):
        return []
    from .diagnosis.across_cases import name_across_cases

    return name_across_cases(results)


def children_of(options: RunOptions) -> dict:
    """How this run's isolation children started (`v41_conformance.forkserver.how`)."""
    if not options.isolate:
        return {
            "start": "none",
            "server": "none",
            "why": "--no-isolate: the implementation runs in the run's own process",
        }
    from .forkserver import how

    return how()


def judge_components(
    results: list[dict], floors: dict[str, int], full_run: bool, stopped: str
) -> tuple[dict, list[str]]:
    """Per component: counts by status and accepted difference, the floor, the verdict; and the
    run-level problems (floors missed, nothing executed). On a full run every component in
    `floors` is judged, present or not; otherwise only those with results."""
    per_component: dict[str, dict] = {}
    counts = [d.count for d in DIFFERENCES]
    empty = lambda: {s: 0 for s in STATUSES} | {"cases": 0} | dict.fromkeys(counts, 0)  # noqa: E731
    for result in results:
        entry = per_component.setdefault(result["component"], empty())
        entry["cases"] += 1
        entry[result["status"]] = entry.get(result["status"], 0) + 1
        for count in counts:
            entry[count] += int(result.get(count) or 0)
    problems = []
    names = sorted(set(per_component) | (set(floors) if full_run else set()))
    for name in names:
        entry = per_component.setdefault(name, empty())
        executed = entry["cases"] - entry["unsupported"] - entry[NOT_RUN]
        floor = floors.get(name, 1)
        entry["floor"] = floor
        all_unsupported = entry["cases"] > 0 and executed == 0 and entry[NOT_RUN] == 0
        entry["floor_ok"] = all_unsupported or not full_run or bool(stopped) or executed >= floor
        if not entry["floor_ok"]:
            problems.append(f"{name}: ran {executed} case(s), fewer than its floor of {floor}")
        bad = sum(entry[s] for s in ("fail", "error", "crash", "timeout", "xpass"))
        if all_unsupported:
            entry["verdict"] = "unsupported"
        elif bad == 0 and entry[NOT_RUN] and not executed:
            entry["verdict"] = NOT_RUN
        else:
            entry["verdict"] = "pass" if bad == 0 and entry["floor_ok"] and not entry[NOT_RUN] else "fail"
            if entry["verdict"] == "pass" and entry["partial"]:
                entry["verdict"] = "partial"  # passed what was judged; some outputs were declined
    executed_total = sum(1 for r in results if r["status"] not in ("unsupported", NOT_RUN))
    if executed_total == 0 and not stopped:
        problems.append(
            "no case was executed (nothing selected, no goldens, or nothing supported): "
            "a run that judges nothing does not pass"
        )
    return dict(sorted(per_component.items())), problems


def exit_code_of(results: list[dict], problems: list[str], stopped: str, signum: int | None) -> int:
    failed = any(r["status"] not in ("pass", "partial", "xfail", "unsupported", NOT_RUN) for r in results)
    if signum is not None:
        return 128 + int(signum)  # 130 after SIGINT, 143 after SIGTERM
    if failed or problems or stopped:
        return 1
    return 0
