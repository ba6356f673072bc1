"""The pytest plugin a kernel team's own suite loads (entry point `pytest11: conformance`).

`pytest --conformance-impl mypkg.kernels:Impl` in any project collects one test per case, node id
`conformance::<case id>`, with the statuses, isolation, timeouts, expectations, reports and verdict
of `conformance run` (`v41_conformance.pytest_run`). `pytest 'conformance::<case id>'
--conformance-impl ...` re-runs that case alone.

Every pytest run in an environment that has the harness installed imports this module, so it
imports nothing but pytest: without --conformance-impl it only registers its options and the
`conformance_impl` fixture. One check stays on: a conftest.py that overrides `conformance_impl` to
hand the cases an object of its own, in a run without --conformance-impl (which collects no case),
ends the session with a usage error instead of judging nothing in silence. An override that returns
`FROM_OPTION` (falling back to --conformance-impl) is not one.
"""

from __future__ import annotations

import sys

import pytest

from .pytest_names import FROM_OPTION, NODE_PREFIX, OVERRIDE_CHECK, RUN  # noqa: F401  (FROM_OPTION: a conftest's)


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "DeepSeek-V4.1 conformance cases (v41-conformance)")
    group.addoption(
        "--conformance-impl",
        default=None,
        metavar="IMPL",
        help="run the conformance cases against IMPL (reference, a conformance.yaml name, "
        "package.module:attr or path/file.py:attr); the label when a conftest supplies "
        "the conformance_impl fixture",
    )
    group.addoption(
        "--conformance-select",
        action="append",
        default=[],
        metavar="PATTERNS",
        help="shell-style patterns over case ids (repeat or comma separate; default: every case)",
    )
    group.addoption("--conformance-device", default="cpu", help="cpu, cuda or cuda:N (as conformance run --device)")
    group.addoption(
        "--conformance-report-dir",
        default=None,
        metavar="DIR",
        help="write results.json, summary.md, junit.xml and report.html here",
    )
    group.addoption(
        "--conformance-config",
        default=None,
        metavar="FILE",
        help="conformance.yaml (default: the nearest one upwards, layered on the packaged store)",
    )
    group.addoption("--conformance-tier", default="small", help="small (packaged) or production (built locally)")
    group.addoption(
        "--conformance-timeout",
        default=None,
        type=float,
        metavar="SECONDS",
        help="per case (default: the configuration's)",
    )
    group.addoption(
        "--conformance-no-isolate",
        action="store_true",
        help="run the implementation in the test process (no crash or hang protection)",
    )


def pytest_configure(config):
    chosen = [arg[len(NODE_PREFIX) :] for arg in config.args if arg.startswith(NODE_PREFIX)]
    impl = config.getoption("conformance_impl")
    if chosen:  # node ids of cases: no file to collect, the plugin selects them
        if not impl:
            raise pytest.UsageError(
                f"{NODE_PREFIX}{chosen[0]}: a conformance case runs only with --conformance-impl "
                "NAME (the implementation it judges)"
            )
        config.args[:] = [arg for arg in config.args if not arg.startswith(NODE_PREFIX)]
    if impl:
        from .pytest_run import ConformanceRun

        config.pluginmanager.register(ConformanceRun(config, chosen), RUN)


@pytest.fixture(scope="session")
def conformance_impl():
    """The implementation the conformance cases judge. Override it in your conftest.py to supply
    one yourself (it then runs in the test process); by default --conformance-impl builds it."""
    return FROM_OPTION


class OverrideCheck:
    """A conftest.py overrides `conformance_impl`: with --conformance-impl its object is judged;
    without it no case is collected, so an object it hands over would be judged by nothing."""

    @pytest.fixture(scope="session", autouse=True)
    @classmethod
    def _conformance_impl_without_the_option(cls, request):
        if request.config.getoption("conformance_impl"):
            return
        if request.getfixturevalue("conformance_impl") is not FROM_OPTION:
            message = (
                "your conftest.py supplies the conformance_impl fixture, but without --conformance-impl no "
                "conformance case is collected, so nothing would judge it: pass --conformance-impl NAME (the "
                "name the reports give your implementation), or return "
                "v41_conformance.pytest_cases.FROM_OPTION when the cases are not wanted"
            )
            if hasattr(request.config, "workerinput"):  # an xdist worker cannot end the session: every test errors
                pytest.fail(message, pytrace=False)
            pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)


def overrides_the_fixture(plugin) -> bool:
    """A plugin (a conftest.py module, say) that defines its own `conformance_impl` fixture."""
    own = getattr(plugin, "conformance_impl", None)
    return (
        plugin is not sys.modules[__name__]
        and own is not None
        and own is not conformance_impl
        and isinstance(own, type(conformance_impl))
    )


def pytest_plugin_registered(plugin, manager):
    if not manager.has_plugin(OVERRIDE_CHECK) and overrides_the_fixture(plugin):
        manager.register(OverrideCheck(), OVERRIDE_CHECK)
