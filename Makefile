# Spillway: `make run` (demo on http://127.0.0.1:8000) and `make test` (the whole suite).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export CHECKPOINT_DISABLE := 1
# Every Python process the suite and `make run` start (pytest workers, Celery workers, gunicorn, manage.py commands:
# hundreds in a `make test`) would otherwise compile the project's ~300 modules from source at each start (~0.45 s
# of CPU each on 2 cores, measured) where the environment sets PYTHONDONTWRITEBYTECODE, as these machines do.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv install install-dev run test test-fast test-durations lint bench migrate

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

install: venv
	$(BIN)/pip install -q -r requirements.txt

install-dev: venv
	$(BIN)/pip install -q -r requirements-dev.txt

lint: install-dev
	$(BIN)/ruff check .

# The suite runs against PostgreSQL and Redis (override with DATABASE_URL / REDIS_URL).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/spillway
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1

# xdist workers take whole files (module-scoped fleets stay on one worker); each gets its own test database (a
# copy of one migrated template: tests/dbsetup.py) and Redis database. scripts/test-workers picks how many: two
# per core where a core is at most 2.2x slower than the reference machine's and the machine is not busy (most of a
# worker's time is spent waiting on real processes: 2 workers 634 s, 4 workers 427-446 s on 2 cores, measured),
# three within 1.3x where quiet tests run ahead of the others, otherwise one per core. Tests that measure under load
# (marked `quiet`) keep the rest out of their way (tests/quiet.py), so a slower machine does not starve them.
# Files mostly waiting and files keeping the CPU busy are handed out in step, each longest first
# (tests/ordering.py, from tests/file_durations.json), not xdist's most-tests-first.
# `make test PYTEST_XDIST=` runs serially; SPILLWAY_TEST_WORKERS=N sets the count.
PYTEST_XDIST ?= $(shell scripts/test-workers)

# scripts/setup-system installs missing system packages and the cloud extra, starts PostgreSQL and
# Redis and creates the database. A test skipped for a missing dependency fails the run
# (SPILLWAY_ALLOW_SKIPS=1 allows a partial run, loudly).
test: install-dev
	scripts/setup-system test "$(TEST_DATABASE_URL)"
	$(BIN)/ruff check .
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) SPILLWAY_TESTING=1 $(BIN)/python -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)

# The inner loop: no real processes, browsers or slow tests (tests/conftest.py marks them), on the same workers,
# keeping the test databases between runs (Django still applies new migrations to them).
# `make test-fast PYTEST_ARGS=--lf` re-runs what failed last time.
test-fast: install-dev
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) SPILLWAY_TESTING=1 $(BIN)/python -m pytest -q \
		$(PYTEST_XDIST) --reuse-db -m "not process and not browser and not haproxy and not slow" $(PYTEST_ARGS)

# A full run that writes each test file's time into tests/file_durations.json (commit it: it orders `make test`).
test-durations: install-dev
	SPILLWAY_RECORD_DURATIONS=1 $(MAKE) test

migrate: install
	$(BIN)/python manage.py migrate --noinput

# Fresh clone -> demo UI on http://127.0.0.1:8000 with web, worker and beat (SQLite + embedded broker).
# RUN_BIND moves the web server (tests/test_make_run.py runs the real `make run` beside a developer's).
RUN_BIND ?= 127.0.0.1:8000
run: install
	scripts/setup-system run
	$(BIN)/python controlplane/localenv.py
	# Refuse before touching the database when another run holds the ports (it is using that database).
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py runall --check --bind $(RUN_BIND)
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py migrate --noinput --verbosity 0
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py loaddemo
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py runall --bind $(RUN_BIND)

# Benchmarks: each prints its figures and a last line `RESULT key=value ...`.
bench: bench-render bench-runtime bench-propagation bench-hitless bench-overflow bench-overflow-fleet bench-loadgen bench-capacity-runs bench-scheduler bench-synth bench-ui bench-vip-failover bench-events bench-dataplane bench-acme bench-scale bench-tenants bench-fleet-size bench-node-cost bench-scaleout bench-fuzz bench-longpoll bench-signals bench-chaos bench-steering bench-prepared bench-applied-state

# --- benchmark targets (one per line pair; keep this section at the end) ---
bench-runtime: install-dev
	$(BIN)/python tests/bench/bench_runtime.py
bench-loadgen: install-dev
	$(BIN)/python tests/bench/bench_loadgen.py
bench-synth: install-dev
	$(BIN)/pip install -q -r requirements-cloud.txt
	$(BIN)/python tests/bench/bench_synth.py
bench-render: install-dev
	$(BIN)/python tests/bench/bench_render.py
bench-overflow: install-dev
	$(BIN)/python tests/bench/bench_overflow.py
bench-overflow-fleet: install-dev
	$(BIN)/python tests/bench/bench_overflow_fleet.py
bench-propagation: install-dev
	$(BIN)/python tests/bench/bench_propagation.py
bench-hitless: install-dev
	$(BIN)/python tests/bench/bench_hitless.py
bench-capacity-runs: install-dev
	$(BIN)/python tests/bench/bench_capacity_runs.py
bench-scheduler: install-dev
	$(BIN)/python tests/bench/bench_scheduler.py
bench-ui: install-dev
	$(BIN)/python tests/bench/bench_ui.py
bench-vip-failover: install-dev
	$(BIN)/python tests/bench/bench_vip_failover.py
bench-events: install-dev
	$(BIN)/python tests/bench/bench_events.py
bench-dataplane: install-dev
	$(BIN)/python tests/bench/bench_dataplane.py
bench-acme: install-dev
	$(BIN)/python tests/bench/bench_acme.py
bench-scale: install-dev
	$(BIN)/python tests/bench/bench_scale.py
bench-tenants: install-dev
	$(BIN)/python tests/bench/bench_tenants.py
bench-fleet-size: install-dev
	$(BIN)/python tests/bench/bench_fleet_size.py
bench-node-cost: install-dev
	$(BIN)/python tests/bench/bench_node_cost.py
bench-scaleout: install-dev
	$(BIN)/python tests/bench/bench_scaleout.py
bench-fuzz: install-dev
	$(BIN)/python tests/bench/bench_fuzz.py
bench-longpoll: install-dev
	$(BIN)/python tests/bench/bench_longpoll.py
bench-signals: install-dev
	$(BIN)/python tests/bench/bench_signals.py
bench-chaos: install-dev
	$(BIN)/python tests/bench/bench_chaos.py
bench-steering: install-dev
	$(BIN)/python tests/bench/bench_steering.py
bench-prepared: install-dev
	$(BIN)/python tests/bench/bench_prepared.py
bench-applied-state: install-dev
	$(BIN)/python tests/bench/bench_applied_state.py
