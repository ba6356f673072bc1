# Everything a fresh machine needs: `make run` and `make test` install what they use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU wheel; the package metadata accepts a range so GPU users keep their own torch.
TORCH_PIN ?= torch==2.13.0
# Triton runs the example kernels in tests on the CPU (TRITON_INTERPRET=1) and natively on GPUs.
TRITON_PIN ?= triton==3.9.0
REPORT_DIR ?= reports/reference
# The versions CI tested (pytest, pytest-xdist, execnet, numpy, safetensors, click, pyyaml, the linters);
# the package metadata keeps its ranges for users. `make test-latest` tries the newest instead.
CONSTRAINTS ?= constraints/test.txt

.PHONY: install run test test-slow lint test-latest test-production test-distributed generate check verify bench clean browser

$(VENV)/.installed: pyproject.toml Makefile $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) "$(TORCH_PIN)" "$(TRITON_PIN)"
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e ".[lint]"
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/conformance run --impl reference --report-dir $(REPORT_DIR)

# tests/test_lint.py runs `make lint`'s three checks inside the suite, beside the other tests. The tests
# tests/slow_tests.py names (installs, plugin sessions in subprocesses, sweeps of a gate over every golden,
# whole attention diagnoses) run in `make test-slow`; CI runs both.
test: install
	$(PY) -m pytest -n auto --dist loadgroup -q

test-slow: install
	$(PY) -m pytest -n auto --dist loadgroup -q -m slow

# pyflakes' rules and the format (ruff, pyproject.toml), and the types (mypy, tools/typecheck).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PATH="$(abspath $(VENV))/bin:$$PATH" tools/typecheck

# Not in CI: the newest releases of everything but torch (still the CPU pin) in a venv of its own,
# then the suite; it prints the versions it used first.
LATEST ?= .venv-latest
test-latest:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(LATEST)/bin/python -m pip install -q "$(TORCH_PIN)" "$(TRITON_PIN)"
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e ".[lint]"
	@echo "test-latest: the newest releases resolved here:"
	@$(LATEST)/bin/python -m pip freeze --exclude-editable | sed 's/^/  /'
	$(LATEST)/bin/python -m pytest -n auto --dist loadgroup -q -m 'not production and not distributed'

# The production tier (docs/tiers.md): rebuild every case to its pinned SHA-256, build the
# goldens locally, run the reference over them, then the production gates and mutants of
# tests/test_production_chain.py (about an hour on 2 cores; not part of `make test`).
test-production: install
	$(VENV)/bin/conformance generate --tier production --check
	$(VENV)/bin/conformance generate --tier production
	$(VENV)/bin/conformance run --impl reference --tier production --report-dir reports/production
	$(PY) -m pytest -q -m production tests/test_production_chain.py

# Remote pytest-xdist workers over real ssh gateways (tests/test_distributed.py; not part of `make test`):
# an sshd of the test's own on loopback (throwaway keys and port; openssh-server installed where missing),
# two ssh workers judging the cases from the installed wheel, compared with a serial run.
test-distributed: install
	@command -v sshd >/dev/null 2>&1 || test -x /usr/sbin/sshd || \
		{ apt-get update -qq && apt-get install -y -qq openssh-server; } || \
		{ sudo apt-get update -qq && sudo apt-get install -y -qq openssh-server; }
	@mkdir -p /run/sshd 2>/dev/null || sudo mkdir -p /run/sshd
	$(PY) -m pytest -q -s -m distributed tests/test_distributed.py

# Headless Chromium for tests/test_report_browser.py (Debian; the test skips, saying so, without it).
browser:
	apt-get install -y chromium || sudo apt-get install -y chromium

generate: install
	$(VENV)/bin/conformance generate

check: install
	$(VENV)/bin/conformance generate --check

verify: install
	$(VENV)/bin/conformance verify

bench: install
	$(PY) benchmarks/run_overhead.py
	$(PY) benchmarks/plugin_cost.py
	$(PY) benchmarks/plugin_parallel.py
	$(PY) benchmarks/one_case_run.py
	$(PY) benchmarks/topk.py
	$(PY) benchmarks/production_tier.py

clean:
	rm -rf $(VENV) reports *.egg-info
