"""The pytest plugin a kernel team's own suite loads (entry point `pytest11: conformance`).

`pytest --conformance-impl mypkg.kernels:Impl` in any project collects one test per case, named
by its case id, with the statuses, isolation, timeouts, expectations and report files of
`conformance run` (pass; fail/error/crash/timeout fail the test; unsupported skips; an expected
failure is an xfail, an unexpected pass fails). Without `--conformance-impl` the plugin does
nothing, so installing the harness changes no other pytest run.

The implementation comes from `--conformance-impl` (any `--impl` form) unless the project's own
`conftest.py` overrides the `conformance_impl` fixture (one built on the team's GPU, say); that
object then runs in the test process itself, without isolation. xdist works unchanged: every
process selects the same cases, and each worker judges its share.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .pytest_plugin import MESSAGE_CHARS, RESULT_KEY, ResultCollector

FROM_OPTION = object()  # the default `conformance_impl`: build the implementation from --conformance-impl


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "DeepSeek-V4.1 conformance cases (v41-conformance)")
    group.addoption("--conformance-impl", default=None, metavar="IMPL",
                    help="run the conformance cases against IMPL (reference, a conformance.yaml name, "
                         "package.module:attr or path/file.py:attr); the label when a conftest supplies "
                         "the conformance_impl fixture")
    group.addoption("--conformance-select", action="append", default=[], metavar="PATTERNS",
                    help="shell-style patterns over case ids (repeat or comma separate; default: every case)")
    group.addoption("--conformance-device", default="cpu", help="cpu, cuda or cuda:N (as conformance run --device)")
    group.addoption("--conformance-report-dir", default=None, metavar="DIR",
                    help="write results.json, summary.md, junit.xml and report.html here")
    group.addoption("--conformance-config", default=None, metavar="FILE",
                    help="conformance.yaml (default: the nearest one upwards, layered on the packaged store)")
    group.addoption("--conformance-tier", default="small", help="small (packaged) or production (built locally)")
    group.addoption("--conformance-timeout", default=None, type=float, metavar="SECONDS",
                    help="per case (default: the configuration's)")
    group.addoption("--conformance-no-isolate", action="store_true",
                    help="run the implementation in the test process (no crash or hang protection)")


@dataclass
class Plan:
    """What every process of the session agrees on: the configuration, the options, the cases."""

    config: Any
    options: Any
    ids: list[str]
    token: str
    started: float = field(default_factory=time.time)
    run_dir: str | None = None  # the session's private folder (v41_conformance.rundir): output capture, children
    _spec: Any = None
    _expectations: Any = None
    _manifest: Any = None

    @property
    def conf(self) -> dict:
        """The implementation's conformance.yaml entry ({} for a target named by path or module)."""
        return self.config.impls.get(self.options.impl, {})

    def expectations(self) -> list:
        from .expectations import load_expectations

        if self._expectations is None:
            self._expectations = load_expectations(self.conf, self.config.root, f"{self.config.path}: impls")
        return self._expectations

    def manifest(self) -> dict:
        from .golden import read_manifest

        if self._manifest is None:
            self._manifest = read_manifest(self.config.goldens)
        return self._manifest

    def spec(self):
        from .adapters.loader import resolve

        if self._spec is None:
            self._spec = resolve(self.options.impl, self.config)
        return self._spec

    def document(self) -> dict:
        from .session import run_document

        return run_document(self.config, self.options, self.spec(), self.ids, self.token, self.run_dir)


def _plan(config) -> Plan | None:
    impl = config.getoption("conformance_impl")
    if not impl:
        return None
    from .config import load_config
    from .ids import parse_select
    from .session import RunOptions, select_case_ids

    select = parse_select(config.getoption("conformance_select"))
    path = config.getoption("conformance_config")
    harness_config = load_config(Path(path) if path else None)
    harness_config.validate()
    harness_config = harness_config.for_tier(config.getoption("conformance_tier"))
    report_dir = config.getoption("conformance_report_dir")
    options = RunOptions(impl=impl, select=select, report_dir=Path(report_dir or "reports/latest"),
                         device=config.getoption("conformance_device"), timeout=config.getoption("conformance_timeout"),
                         isolate=not config.getoption("conformance_no_isolate"), tier=harness_config.tier,
                         config_path=config.getoption("conformance_config"))
    ids = select_case_ids(harness_config, select)
    token = hashlib.sha256(json.dumps([impl, ids, str(harness_config.path), harness_config.tier]).encode()).hexdigest()[:16]
    return Plan(harness_config, options, ids, token)


PLAN = pytest.StashKey[Plan | None]()
COLLECTOR = pytest.StashKey[ResultCollector]()
RUN_DIR = pytest.StashKey[Any]()  # the controller's RunDir, and the scratch folder it lives in without a report dir
RUN_DIR_KEY = "conformance_run_dir"  # in an xdist worker's workerinput: the controller's run folder


def pytest_configure(config):
    from .errors import HarnessError

    try:
        plan = _plan(config)
        if plan is not None and hasattr(config, "workerinput"):  # an xdist worker captures into the controller's
            plan.run_dir = config.workerinput.get(RUN_DIR_KEY)
        elif plan is not None:
            plan.run_dir = _open_run_dir(config)
    except HarnessError as exc:
        raise pytest.UsageError(f"--conformance-impl: {exc}") from None
    config.stash[PLAN] = plan
    if plan is not None and not hasattr(config, "workerinput"):  # the controller gathers the results
        collector = ResultCollector()
        config.stash[COLLECTOR] = collector
        config.pluginmanager.register(collector, "conformance-results")


def _open_run_dir(config) -> str:
    """The session's private folder, as `conformance run` has one: what each case prints is
    captured there (gathered into the report dir's output.log), isolation children are recorded
    there (killed at the end). Under the report dir, which it holds for the session (one run at a
    time per folder); in a scratch folder without one."""
    import tempfile

    from .rundir import RunDir

    report_dir = config.getoption("conformance_report_dir")
    scratch = None if report_dir else Path(tempfile.mkdtemp(prefix="conformance-"))
    run_dir = RunDir(Path(report_dir) if report_dir else scratch)
    run_dir.__enter__()
    config.stash[RUN_DIR] = (run_dir, scratch)
    return str(run_dir.path.resolve())


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: each worker captures into the controller's run folder."""
    plan = node.config.stash.get(PLAN, None)
    if plan is not None and plan.run_dir:
        node.workerinput[RUN_DIR_KEY] = plan.run_dir


def pytest_unconfigure(config):
    opened = config.stash.get(RUN_DIR, None)
    if opened is not None:
        import shutil

        run_dir, scratch = opened
        run_dir.__exit__(None, None, None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def conformance_impl():
    """The implementation the conformance cases judge. Override it in your conftest.py to supply
    one yourself (it then runs in the test process); by default --conformance-impl builds it."""
    return FROM_OPTION


class Cases(pytest.Collector):
    """The conformance cases of this session (node id `conformance`)."""

    def collect(self):
        plan = self.config.stash[PLAN]
        for case_id in plan.ids:
            yield pytest.Function.from_parent(self, name=case_id, callobj=_judge_case)


@pytest.hookimpl(tryfirst=True)  # before -k, -m and --deselect act on the items
def pytest_collection_modifyitems(session, config, items):
    plan = config.stash.get(PLAN, None)
    if plan is None:
        return
    collection = Cases.from_parent(session, name="conformance", nodeid="conformance")
    items.extend(collection.collect())


_EXECUTORS: dict[str, Any] = {}


def _executor(plan: Plan):
    from .execution import CaseExecutor

    executor = _EXECUTORS.get(plan.token)
    if executor is None:
        executor = _EXECUTORS[plan.token] = CaseExecutor.from_run(plan.document())
    return executor


def pytest_sessionfinish(session, exitstatus):
    for executor in _EXECUTORS.values():
        executor.close()
    _EXECUTORS.clear()
    plan = session.config.stash.get(PLAN, None)
    collector = session.config.stash.get(COLLECTOR, None)
    if plan is None or collector is None or not session.config.getoption("conformance_report_dir"):
        return
    _write_reports(plan, collector, session.config)


def _judge_case(request, conformance_impl):
    """One case: its verdict, as a pytest outcome."""
    from .expectations import apply_expectations
    from .ids import split_case_id
    from .runner import CaseResult, run_case

    plan: Plan = request.config.stash[PLAN]
    case_id = request.node.name
    if conformance_impl is FROM_OPTION:
        executor = _executor(plan)
        try:
            result = executor.run(case_id)
        except Exception as exc:  # a harness bug: never blame the implementation for it
            result = CaseResult(case_id, split_case_id(case_id)[0], "error",
                                f"harness internal error (please report): {type(exc).__name__}: {exc}")
    else:  # the project's own object, in this process
        from .capture import output_file, run_captured

        result = run_captured(output_file(plan.run_dir, case_id), lambda: run_case(
            case_id, plan.config, conformance_impl, plan.options.impl, plan.manifest(), plan.conf))
    data = result.to_json()
    data["repro"] = plan.options.repro(case_id)
    apply_expectations([data], plan.expectations())
    if len(data.get("message") or "") > MESSAGE_CHARS:
        data["message"] = data["message"][:MESSAGE_CHARS] + "\n[...]"
    request.node.user_properties.append((RESULT_KEY, json.dumps(data)))
    status, message = data["status"], data.get("message") or ""
    if status in ("pass", "partial"):  # partial: what was judged passed; results.json names the declined
        return
    if status == "unsupported":
        pytest.skip(message)
    if status == "xfail":
        pytest.xfail(data.get("expectation") or message)
    pytest.fail(f"{case_id}: {status}: {message}", pytrace=False)


def _write_reports(plan: Plan, collector: ResultCollector, config) -> None:
    from .report import write_reports
    from .session import NOT_RUN, summarise

    results = []
    for case_id in plan.ids:
        data = collector.results.get(case_id)
        if data is None:
            from .ids import split_case_id

            data = {"id": case_id, "component": split_case_id(case_id)[0], "status": NOT_RUN, "outputs": {},
                    "message": "not run: deselected, or the session ended before it; this says nothing about "
                               "the implementation", "repro": plan.options.repro(case_id)}
        results.append(data)
    stale = [f"{e.pattern} ({e.status}: {e.reason})" for e in plan.expectations()
             if not any(e.matches(d["id"]) for d in results)]
    opened = config.stash.get(RUN_DIR, None)
    if opened is not None:
        opened[0].gather_output(plan.ids, {d["id"]: d["status"] for d in results})
    try:
        spec = plan.spec()
    except Exception:  # a fixture supplied the implementation and the name resolves to nothing
        from .adapters.loader import ImplSpec

        spec = ImplSpec(plan.options.impl, "python")
    doc = summarise(plan.config, plan.options, spec, results, stale, plan.started,
                    selection={"total": len(plan.ids), "owned": len(plan.ids)})
    write_reports(doc, plan.options.report_dir)
