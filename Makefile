# swarm-autoscaler: every target does its own setup on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint format test test-fast bench mutation demo run image docs services-up services-down clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[local,sim,debug,dev,docs]'
	touch $(STAMP)

install: $(STAMP)

# One definition of lint: `make lint`, and `make test` (scripts/test-lanes.sh runs it first).
LINT := $(BIN)/ruff check src tests bench scripts && $(BIN)/ruff format --check src tests bench scripts && $(BIN)/mypy src
lint: $(STAMP)
	$(LINT)

format: $(STAMP)
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

# The whole suite: lint, then every test. Servers the tests need (redis-server, dockerd) are installed
# with apt when missing by scripts/ensure-services.sh; the suite itself starts and stops them.
# Every run records the AWS actions the product sends (at the local EC2) in one log; the audit run then checks
# docker/iam-policy.json against it.
AWS_ACTIONS := $(abspath build/aws-actions.log)
# A skipped test fails `make test` (tests/conftest.py): what needs root, dockerd or promtool must run.
# --durations prints the slowest tests of each run, to see where the suite's time goes.
TEST_ENV := SWARM_AUTOSCALER_LAB_AWS_ACTION_LOG=$(AWS_ACTIONS) SWARM_AUTOSCALER_NO_SKIP=1
# Two lanes at once (scripts/test-lanes.sh): the swarm lane (swarm adapter tests, then the e2e suite, one
# process at a time: only one local swarm may exist per machine, and each run's swarm is session-scoped),
# and beside it every other test on TEST_WORKERS pytest-xdist workers. The audit runs after both.
# The script runs the lint first (meanwhile it downloads what the images are built from).
TEST_WORKERS ?= 2
test: $(STAMP)
	bash scripts/ensure-services.sh
	mkdir -p build && rm -f $(AWS_ACTIONS) $(AWS_ACTIONS).requests
	$(TEST_ENV) TEST_WORKERS=$(TEST_WORKERS) LINT='$(LINT)' bash scripts/test-lanes.sh $(BIN)
	$(TEST_ENV) $(BIN)/pytest -m audit tests/audit

# Without the chaos test (a few minutes; `make test` runs it).
test-fast: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not swarm and not e2e and not chaos and not audit"

bench: $(STAMP)
	$(BIN)/python -m bench

# Mutation testing (mutmut, configured in pyproject.toml) of the safety-relevant modules against the fast
# planner and loop tests, then the kill rate per module. Not part of `make test`: a run takes long (the
# docs/lab/mutation.md says how long). MUTATE narrows it to some mutants, e.g. MUTATE='swarm_autoscaler.core.plan.*';
# MUTATION_JOBS sets the parallel workers. Each run starts afresh (mutants/ is rebuilt).
MUTATE ?=
MUTATION_JOBS ?= 2
mutation: $(STAMP)
	rm -rf mutants
	HYPOTHESIS_PROFILE=mutation nice -n 19 $(BIN)/mutmut run --max-children $(MUTATION_JOBS) $(MUTATE)
	$(BIN)/python scripts/mutation_report.py --survivors

# The operator's manual and the lab notes as a static site in build/site (mkdocs, material theme). --strict
# turns every warning into an error: a broken link or anchor fails the build (tests/docs runs it too).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

demo: $(STAMP)
	$(BIN)/swarm-autoscaler demo

run: $(STAMP)
	$(BIN)/swarm-autoscaler run

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build mutants

# The daemon's image without a registry: a Debian base from mmdebstrap, wheels from the host, built on a
# dockerd the project starts and saved under build/image/ (DEBUG=1 adds debugpy). See docs/deployment.md.
image: $(STAMP)
	bash scripts/ensure-services.sh
	$(BIN)/python -m swarm_autoscaler_lab.localcloud.image $(if $(filter 1,$(DEBUG)),--debug)
