"""The pytest side of `conformance run`: one pytest item per case, ids equal to case ids.

The CLI writes a run file (JSON: config path, impl spec, device, timeout, case ids) and runs
pytest on it with this plugin (`-p v41_conformance.pytest_plugin`), so `-n`/xdist works unchanged: each
worker rebuilds the implementation from the spec, runs its share of the cases, and attaches each
case's result to its test report as a user property; the controller's `ResultCollector` gathers
them. Users never need to run pytest on this directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RUN_SUFFIX = ".conformance-run.json"
RESULT_KEY = "conformance_result"
MESSAGE_CHARS = 20000


class CaseFailed(Exception):
    """A case did not pass; its message is the harness's own report."""


def pytest_addoption(parser):
    group = parser.getgroup("conformance")
    group.addoption("--conformance-run", default=None, help="run file written by `conformance run`")


def pytest_collect_file(file_path: Path, parent):
    if file_path.name.endswith(RUN_SUFFIX):
        return RunFile.from_parent(parent, path=file_path)
    return None


class RunFile(pytest.File):
    def collect(self):
        run = json.loads(self.path.read_text())
        for case_id in run["cases"]:
            yield CaseItem.from_parent(self, name=case_id, run=run)


_CONTEXT: dict[str, object] = {}


def _context(run: dict):
    """Per-process state: config, implementation, manifest (built once per worker)."""
    key = run["token"]
    if _CONTEXT.get("token") != key:
        from .pool import executor_for

        _CONTEXT.clear()
        executor = executor_for(run)  # a failure here repeats for every case, never a KeyError
        _CONTEXT.update(token=key, executor=executor)
    return _CONTEXT["executor"]


def pytest_sessionfinish(session, exitstatus):
    """The end of a run (or of a worker's share of it): stop the isolation children."""
    executor = _CONTEXT.get("executor")
    if executor is not None:
        executor.close()
    _CONTEXT.clear()


class CaseItem(pytest.Item):
    def __init__(self, *, run: dict, **kwargs):
        super().__init__(**kwargs)
        self.run = run

    def runtest(self):
        try:
            result = _context(self.run).run(self.name)
        except Exception as exc:  # a harness bug: never blame the implementation for it
            from .ids import split_case_id
            from .runner import CaseResult

            result = CaseResult(
                self.name,
                split_case_id(self.name)[0],
                "error",
                f"harness internal error (please report): {type(exc).__name__}: {exc}",
            )
        if len(result.message) > MESSAGE_CHARS:  # results.json stays readable whatever was printed
            result.message = (
                result.message[:MESSAGE_CHARS] + f"\n[... {len(result.message) - MESSAGE_CHARS} more characters]"
            )
        self.user_properties.append((RESULT_KEY, json.dumps(result.to_json())))
        if result.status == "unsupported":
            pytest.skip(result.message)
        if result.status not in ("pass", "partial"):
            raise CaseFailed(f"{result.status}: {result.message}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return f"{self.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.name


class ResultCollector:
    """Registered in the controlling process only; gathers every case's result."""

    def __init__(self) -> None:
        self.results: dict[str, dict] = {}
        self.crashed: dict[str, str] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        for key, value in report.user_properties:
            if key == RESULT_KEY:
                data = json.loads(value)
                self.results[data["id"]] = data
        if report.failed and report.when == "call" and report.nodeid.split("::")[-1] not in self.results:
            # xdist reports a worker that died mid-item this way.
            self.crashed[report.nodeid.split("::")[-1]] = str(report.longrepr)[-2000:]
