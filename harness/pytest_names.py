"""The names the pytest plugin's two modules share (the entry module `pytest_cases` and the run it
imports on demand, `pytest_run`): plain constants, so neither imports the other to know them."""

FROM_OPTION = object()  # the default `conformance_impl`: build the implementation from --conformance-impl
NODE_PREFIX = "conformance::"  # a case's node id is NODE_PREFIX + its case id
OVERRIDE_CHECK = "conformance-impl-override"  # registered when a conftest.py overrides conformance_impl
RUN = "conformance-run"  # the plugin object of a run (v41_conformance.pytest_run.ConformanceRun)
