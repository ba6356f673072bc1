"""The conformance run inside a pytest session: what `pytest --conformance-impl IMPL` does.

Imported by the plugin (`v41_conformance.pytest_cases`) only when the option asks for the cases.
Its verdict is `conformance run`'s (`v41_conformance.session` decides both):

- The controlling process (the only one without xdist) plans the run as the CLI does: the
  configuration validated, the implementation loaded once (an implementation that cannot be loaded
  is one usage error, pytest's exit 4, before any case runs), the cases selected and ordered.
  pytest-xdist workers receive the plan from it (`workerinput`) and judge their share, each through
  one isolation child forked from its own fork server; a worker imports no torch itself.
- One item per case, node id `conformance::<case id>`: pass and partial pass; fail, error, crash,
  timeout and xpass fail; unsupported skips; an expected failure is an xfail.
- At the end the controller judges the run as the CLI does: a run stopped by SIGINT or SIGTERM
  exits 130 or 143, one that judged nothing (a selection that matched nothing, or only unsupported
  cases) or missed a floor fails, and every report says so; results.json's `exit_code` is the
  session's exit status. Cases that -k, -m or --deselect left out are not part of the run.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .pytest_names import FROM_OPTION, NODE_PREFIX, OVERRIDE_CHECK, RUN
from .pytest_plugin import MESSAGE_CHARS, RESULT_KEY, ResultCollector
from .stop_signals import StopSignals

if TYPE_CHECKING:
    from .config import Config
    from .execution import CaseExecutor
    from .pool import CasePool
    from .rundir import RunDir
    from .shared_pool import SharedPool, SharedPoolClient

PLAN_KEY = "v41_conformance_plan"  # the controller's plan, in every xdist worker's workerinput
POOL_KEY = "v41_conformance_pool"  # the controller's shared isolation pool, in a local worker's workerinput


@dataclass
class Plan:
    """What every process of the session agrees on (plain JSON, sent to xdist workers)."""

    run: dict  # the run document (v41_conformance.session.run_document): what an isolation child needs
    ids: list[str]  # heaviest first
    costs: dict[str, float]  # estimated seconds per case (v41_conformance.workers.estimate)
    expectations: list[dict]  # the implementation's, as {pattern, status, reason}

    def order(self, workers: int) -> list[str]:
        """The order of the items (the same in every process). pytest-xdist's load scheduling hands
        each of `workers` workers a contiguous chunk of the first items, then the rest a few at a
        time to whoever is free: so the chunks are balanced by estimated cost, the rest heaviest first."""
        if workers < 2:
            return list(self.ids)
        chunk = max(2, len(self.ids) // workers // 4)  # xdist's initial chunk (xdist/scheduler/load.py)
        head, rest = self.ids[: chunk * workers], self.ids[chunk * workers :]
        lanes: list[list[str]] = [[] for _ in range(workers)]
        loads = [0.0] * workers
        for case_id in head:  # longest processing time first, into the least loaded lane with room
            lane = min((i for i in range(workers) if len(lanes[i]) < chunk), key=lambda i: loads[i])
            lanes[lane].append(case_id)
            loads[lane] += self.costs.get(case_id, 0.0)
        return [case_id for lane in lanes for case_id in lane] + rest


class ConformanceRun:
    """The plugin object of a run (registered as `conformance-run`), in every process of the session."""

    def __init__(self, config: pytest.Config, chosen: list[str]):
        self.config = config
        self.controller = not hasattr(config, "workerinput")
        distributed = self.controller and getattr(config.option, "dist", "no") != "no"
        self.overridden = config.pluginmanager.has_plugin(OVERRIDE_CHECK)  # a conftest.py supplies the object
        isolate = not config.getoption("conformance_no_isolate")
        # Who runs isolation children: the controller for itself (no xdist) and for the workers on its
        # own machine (v41_conformance.shared_pool); a worker elsewhere for itself.
        self.shares = isolate and not self.overridden and distributed and _local_workers(config)
        shared = getattr(config, "workerinput", {}).get(POOL_KEY)
        runs_children = self.shares if distributed else (not shared and not _refusal(_plan_version(config)))
        if isolate and not self.overridden and runs_children:
            from .forkserver import warm_up

            warm_up()  # first: the fork server imports torch while this process plans the run
        self.started = time.time()
        self.stop: Any = None
        self.ran = False
        self.collected: set[str] | None = None
        self.doc: dict | None = None
        # isolation children (v41_conformance.pool), or a worker's connection to the shared ones
        self._pool: CasePool | SharedPoolClient | None = None
        # the controller's pool for its local xdist workers (v41_conformance.shared_pool)
        self._shared: SharedPool | None = None
        self._executor: CaseExecutor | None = None  # --conformance-no-isolate (v41_conformance.execution)
        # a conftest's object: the configuration and manifest it is judged with
        self._own_object: tuple[Config, dict[str, dict[str, Any]]] | None = None
        # (the controller's RunDir, its scratch folder without a report dir)
        self._run_dir: tuple[RunDir, Path | None] | None = None
        if distributed:
            from .pytest_remote import join_for_workers

            join_for_workers(config)  # before xdist reads the arguments it hands its workers
        if self.controller:
            self._plan_run(chosen)
            self.collector = ResultCollector()
            config.pluginmanager.register(self.collector, "conformance-results")
        else:
            self.plan = Plan(**config.workerinput[PLAN_KEY])  # type: ignore[attr-defined]  # xdist's, on a worker
        self.refusal = _refusal(self.plan.run.get("harness_version"))
        workers = int(config.workerinput["workercount"]) if not self.controller else 1  # type: ignore[attr-defined]
        self.items = self.plan.order(workers)

    # -- the plan (controller) -------------------------------------------------------------------
    def _plan_run(self, chosen: list[str]) -> None:
        """The plan, as `conformance run` makes it: every policy resolves, the implementation loads
        and prepares (unless a conftest.py supplies the object under a label), the cases are chosen
        and ordered; any failure is one usage error (pytest's exit 4) before any case runs."""
        from .adapters.loader import ImplSpec, resolve
        from .config import load_config
        from .errors import HarnessError
        from .expectations import load_expectations
        from .ids import parse_select
        from .plan import RunOptions, case_costs, run_document, select_case_ids
        from .session import load_implementation
        from .workers import heaviest_first

        option = self.config.getoption
        try:
            select = parse_select(option("conformance_select"))
            path = option("conformance_config")
            config = load_config(Path(path) if path else None)
            config.validate()
            config = config.for_tier(option("conformance_tier"))
            report_dir = option("conformance_report_dir")
            self.options = RunOptions(
                impl=option("conformance_impl"),
                select=select or chosen,
                report_dir=Path(report_dir or "reports/latest"),
                device=option("conformance_device"),
                timeout=option("conformance_timeout"),
                isolate=not option("conformance_no_isolate"),
                tier=config.tier,
                config_path=path,
            )
            try:
                spec = resolve(self.options.impl, config)
            except HarnessError:
                if not self.overridden:
                    raise
                spec = ImplSpec(self.options.impl, "python")  # a label for the object a conftest.py supplies
            else:  # an implementation: it must load, whether or not a conftest.py supplies one instead
                load_implementation(config, self.options, "--conformance-impl")
            ids = select_case_ids(config, select)
            if chosen:
                ids = [i for i in ids if i in set(chosen)]
            costs = case_costs(config, ids)
            ids = heaviest_first(ids, costs)
            expectations = load_expectations(spec.conf, config.root, f"{config.path}: impls.{spec.name}")
        except HarnessError as exc:
            raise _usage(exc) from None
        token = hashlib.sha256(json.dumps([spec.name, ids, str(config.path), config.tier]).encode()).hexdigest()[:16]
        self.harness_config, self.spec = config, spec
        self.overrides = config.overrides(spec.name)
        self.plan = Plan(
            run_document(config, self.options, spec, ids, token, self._open_run_dir()),
            ids,
            {i: round(c, 6) for i, c in costs.items()},
            [asdict(e) for e in expectations],
        )

    def _open_run_dir(self) -> str:
        """The session's private folder, as `conformance run` has one: what each case prints is captured
        there (gathered into output.log), isolation children are recorded there (killed at the end).
        Under the report dir, which it holds for the session (one run at a time per folder); in a
        scratch folder without one."""
        import tempfile

        from .rundir import RunDir

        report_dir = self.config.getoption("conformance_report_dir")
        scratch = None if report_dir else Path(tempfile.mkdtemp(prefix="conformance-"))
        run_dir = RunDir(Path(report_dir) if scratch is None else scratch)
        run_dir.__enter__()
        self._run_dir = (run_dir, scratch)
        return str(run_dir.path.resolve())

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        node.workerinput[PLAN_KEY] = asdict(self.plan)
        if self.shares and getattr(node.gateway.spec, "popen", False):  # a worker on this machine
            if self._shared is None:
                from .shared_pool import SharedPool

                self._shared = SharedPool(self.plan.run, int(node.workerinput["workercount"]))
            node.workerinput[POOL_KEY] = self._shared.address

    def pytest_report_header(self, config):
        if not self.controller:
            return []
        from .store import describe

        run = self.plan.run
        lines = [
            f"conformance: {self.spec.name} ({self.spec.kind}) on {run['device']}, {len(self.plan.ids)} case(s) of "
            f"the {describe(run['store'])}; config {run['config']}"
        ]
        if run["isolate"] and not self.overridden:
            from .forkserver import how
            from .report.header import children_line

            lines.append(f"conformance: {children_line({'children': how()})}")
        if self.overrides:
            from .report.header import override_lines

            lines.append(f"conformance: the configuration changes {len(self.overrides)} packaged default(s):")
            lines += [f"  {line}" for line in override_lines({"overrides": self.overrides})]
        return lines

    # -- collection ----------------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)  # before -k, -m and --deselect act on the items
    def pytest_collection_modifyitems(self, session, config, items):
        collection = Cases.from_parent(session, name="conformance", nodeid="conformance")
        items.extend(collection.collect())

    def pytest_collection_finish(self, session):
        if self.controller:
            self.collected = {i.nodeid[len(NODE_PREFIX) :] for i in session.items if i.nodeid.startswith(NODE_PREFIX)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.collected is None:
            self.collected = {i[len(NODE_PREFIX) :] for i in ids if i.startswith(NODE_PREFIX)}

    # -- running ------------------------------------------------------------------------------------
    def pytest_sessionstart(self, session):
        if self.controller and threading.current_thread() is threading.main_thread():
            self.stop = _stop_signals(self.config).__enter__()  # SIGTERM stops the session the way Ctrl-C does

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session):
        self.ran = not self.config.option.collectonly
        loop = self.stop if isinstance(self.stop, XdistLoopStop) else None
        if loop is not None:
            loop.looping = True
        try:
            return (yield)
        finally:
            if loop is not None:
                loop.looping = False

    def judge(self, case_id: str, conformance_impl) -> dict:
        """One case's result (plain JSON, expectations applied), judged in this process's way."""
        from .case_result import CaseResult
        from .expectations import Expectation, apply_expectations
        from .ids import split_case_id

        try:
            result = self._result(case_id, conformance_impl)
        except Exception as exc:  # a harness bug: never blame the implementation for it
            result = CaseResult(
                case_id,
                split_case_id(case_id)[0],
                "error",
                f"harness internal error (please report): {type(exc).__name__}: {exc}",
            )
        data = result.to_json()
        apply_expectations([data], [Expectation(**e) for e in self.plan.expectations])
        if len(data.get("message") or "") > MESSAGE_CHARS:
            data["message"] = data["message"][:MESSAGE_CHARS] + "\n[...]"
        return data

    def _result(self, case_id: str, conformance_impl):
        run = self.plan.run
        if self.refusal:  # this worker's package is not the controller's: it judges nothing
            from .case_result import CaseResult
            from .ids import split_case_id

            return CaseResult(case_id, split_case_id(case_id)[0], "error", self.refusal)
        if conformance_impl is not FROM_OPTION:  # the project's own object, in this process
            from .execution import config_of
            from .golden import read_manifest
            from .runner import run_case

            from .capture import output_file, run_captured

            if self._own_object is None:
                config = config_of(run)
                self._own_object = (config, read_manifest(config.goldens))
            config, manifest = self._own_object
            return run_captured(
                output_file(run.get("run_dir"), case_id),
                lambda: run_case(case_id, config, conformance_impl, run["impl"]["name"], manifest, run["impl"]["conf"]),
            )
        if run["isolate"]:  # an isolation child; this process never imports torch for it
            if self._pool is None:
                shared = getattr(self.config, "workerinput", {}).get(POOL_KEY)
                if shared:  # the controller's, on this machine
                    from .shared_pool import SharedPoolClient

                    self._pool = SharedPoolClient(shared)
                else:
                    from .forkserver import warm_up
                    from .pool import CasePool

                    warm_up()
                    self._pool = CasePool(run, 1, [])
            return self._pool.result(case_id)
        if self._executor is None:
            from .execution import CaseExecutor

            self._executor = CaseExecutor.from_run(run)
        return self._executor.run(case_id)

    def pytest_sessionfinish(self, session, exitstatus):
        for pool in (self._pool, self._shared):
            if pool is not None:
                pool.close()
        self._pool = self._shared = None
        if self.controller and self.ran and exitstatus != pytest.ExitCode.USAGE_ERROR:
            self.doc = self._conclude(session, int(exitstatus))
            session.exitstatus = self.doc["exit_code"]

    def pytest_unconfigure(self, config):
        if self.stop is not None:
            self.stop.__exit__(None, None, None)
            self.stop = None
        if self._run_dir is not None:
            import shutil

            run_dir, scratch = self._run_dir
            self._run_dir = None
            run_dir.__exit__(None, None, None)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    # -- the verdict (controller) ---------------------------------------------------------------------
    def _conclude(self, session, status: int) -> dict:
        from .expectations import Expectation, apply_expectations
        from .report import write_reports
        from .session import ids_digest, result_of, stopped_reason, summarise

        signum = self.stop.signal if self.stop is not None else None
        if signum is None and status == pytest.ExitCode.INTERRUPTED and not session.shouldfail:
            stopped = f"the pytest session was interrupted (pytest exit status {status})"
        else:
            stopped = stopped_reason(signum, "-x / --maxfail" if session.shouldfail else "")
        ids = [i for i in self.plan.ids if self.collected is None or i in self.collected]
        results = [result_of(i, self.collector, stopped, self.options.repro(i, "pytest")) for i in ids]
        expectations = [Expectation(**e) for e in self.plan.expectations]
        apply_expectations([r for r in results if r["id"] not in self.collector.results], expectations)
        stale = [
            f"{e.pattern} ({e.status}: {e.reason})"
            for e in expectations
            if not any(e.matches(r["id"]) for r in results)
        ]
        selection = {
            "total": len(self.plan.ids),
            "owned": len(ids),
            "ids_sha256": ids_digest(self.plan.ids),
            "deselected": len(self.plan.ids) - len(ids),
        }
        doc = summarise(
            self.harness_config, self.options, self.spec, results, stale, self.started, stopped, signum, selection
        )
        verdict, doc["exit_code"] = doc["exit_code"], session_exit_status(status, doc["exit_code"])
        if verdict == 0 and doc["exit_code"] != 0:
            doc["problems"].append(
                f"the pytest session failed outside the conformance cases (pytest exit status "
                f"{status}): see pytest's own report"
            )
        if self.config.getoption("conformance_report_dir"):
            if self._run_dir is not None:  # output.log: what each case printed, as `conformance run` keeps it
                self._run_dir[0].gather_output(ids, {r["id"]: r["status"] for r in results})
            write_reports(doc, self.options.report_dir)
        return doc

    def pytest_terminal_summary(self, terminalreporter):
        if self.doc is None:
            return
        from .report.header import override_lines, verdict

        doc, write = self.doc, terminalreporter.write_line
        terminalreporter.section("conformance")
        write(f"{doc['impl']}: {verdict(doc)} ({len(doc['cases'])} case(s), exit status {doc['exit_code']})")
        if doc["stopped"]:
            write(f"STOPPED: {doc['stopped']}; {doc['not_run']} case(s) not run")
        for problem in doc["problems"]:
            write(f"PROBLEM: {problem}")
        changed = override_lines(doc)
        if changed:
            write(f"the configuration changes {len(changed)} packaged default(s):")
            for line in changed:
                write(f"  {line}")
        if self.config.getoption("conformance_report_dir"):
            write(f"reports: {Path(self.options.report_dir) / 'results.json'}, summary.md, junit.xml, report.html")


def _local_workers(config) -> bool:
    """pytest-xdist starts workers on this machine: -n N, or a popen --tx."""
    return bool(getattr(config.option, "numprocesses", None)) or any(
        "popen" in spec for spec in (getattr(config.option, "tx", None) or ())
    )


def _stop_signals(config: pytest.Config) -> StopSignals:
    """What SIGINT and SIGTERM do to the controller: stop the session the way Ctrl-C does
    (`StopSignals`), under pytest-xdist between two events of its loop."""
    dsession = config.pluginmanager.getplugin("dsession")  # xdist's controller loop (-n, --dist)
    if dsession is not None and hasattr(dsession, "queue"):
        return XdistLoopStop(dsession)
    return StopSignals()


class XdistLoopStop(StopSignals):
    """SIGINT and SIGTERM in the controller of a pytest-xdist session: `StopSignals`' stop (the first
    one raises KeyboardInterrupt, later ones are only noted), raised where xdist's loop can take it.

    The controller spends the run in xdist's loop (`DSession.loop_once`), waiting on a `queue.Queue`
    for its workers' events. A KeyboardInterrupt raised by the handler at whatever bytecode the signal
    interrupts can land in that wait after it let the queue's lock go and before it takes it back
    (`Condition.wait`'s `finally`); the wait's `with` then releases an unlocked lock, and that
    RuntimeError, not the KeyboardInterrupt, ends the session: an INTERNALERROR, so pytest skips the
    terminal summary and the STOPPED line. So while the loop runs the handler only notes the signal, a
    thread of this object hands the loop an event of its own, and the loop raises KeyboardInterrupt
    when it takes that event, between two others. Before the loop starts and after it ends the first
    signal interrupts at once, as `StopSignals` does; so does a second one while the loop runs (the
    loop has not taken the first: something keeps it from its queue)."""

    EVENT = "conformance_stop"  # xdist's loop calls its `worker_<event name>(**kwargs)` for each event

    def __init__(self, dsession) -> None:
        super().__init__()
        self.looping = False  # set by ConformanceRun.pytest_runtestloop while xdist's loop runs
        self._dsession = dsession
        self._signalled = threading.Event()
        self._closed = False

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signum
            if self.looping:
                self._signalled.set()  # nothing of the loop's is touched here: it may be mid-way in its queue
                return
            raise KeyboardInterrupt
        if self.looping:
            raise KeyboardInterrupt

    def _hand_over(self) -> None:
        """The thread between the handler and the loop. The handler runs in the main thread, which may
        hold the queue's lock (a plain Lock) at that moment: its own `Queue.put` would wait for ever."""
        self._signalled.wait()
        if not self._closed:
            self._dsession.queue.put((self.EVENT, {}))

    def _stop_loop(self) -> None:
        raise KeyboardInterrupt

    def __enter__(self) -> XdistLoopStop:
        setattr(self._dsession, f"worker_{self.EVENT}", self._stop_loop)
        threading.Thread(target=self._hand_over, name="conformance-stop", daemon=True).start()
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._closed = True
        self._signalled.set()  # the thread ends without handing anything over


def _usage(exc: Exception) -> pytest.UsageError:
    text = str(exc)
    return pytest.UsageError(text if text.startswith("--conformance-") else f"conformance: {text}")


def _plan_version(config) -> str | None:
    """The controller's package version, in an xdist worker (None in the controller itself)."""
    return getattr(config, "workerinput", {}).get(PLAN_KEY, {}).get("run", {}).get("harness_version")


def _refusal(theirs: str | None) -> str:
    from . import __version__
    from .store import version_refusal

    return version_refusal(theirs) if theirs is not None and theirs != __version__ else ""


def session_exit_status(pytest_status: int, verdict: int) -> int:
    """The session's exit status: the conformance verdict (`conformance run`'s exit code) where it is
    a stop by a signal (130, 143) or where pytest itself saw nothing wrong (0, or 5: no test ran);
    otherwise pytest's own (1: a test failed, 2: interrupted, 3: internal error, 4: usage error)."""
    if verdict >= 128 or pytest_status in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        return verdict
    return pytest_status


class Cases(pytest.Collector):
    """The conformance cases of this session (node id `conformance`)."""

    def collect(self):
        run = self.config.pluginmanager.get_plugin(RUN)
        for case_id in run.items:
            yield CaseFunction.from_parent(self, name=case_id, callobj=_judge_case)


class CaseFunction(pytest.Function):
    """One case's test; pytest's failure headings name it by its case id."""

    def reportinfo(self):
        return self.path, None, self.name


def _judge_case(request, conformance_impl):
    """One case: its verdict, as a pytest outcome."""
    run = request.config.pluginmanager.get_plugin(RUN)
    case_id = request.node.name
    data = run.judge(case_id, conformance_impl)
    request.node.user_properties.append((RESULT_KEY, json.dumps(data)))
    status, message = data["status"], data.get("message") or ""
    if status in ("pass", "partial"):  # partial: what was judged passed; results.json names the declined
        return
    if status == "unsupported":
        pytest.skip(message)
    if status == "xfail":
        pytest.xfail(data.get("expectation") or message)
    pytest.fail(f"{case_id}: {status}: {message}", pytrace=False)
