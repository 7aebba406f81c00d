# Spillway: `make run` (demo on http://127.0.0.1:8000) and `make test` (the whole suite).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export CHECKPOINT_DISABLE := 1

.PHONY: venv install install-dev run test lint bench migrate

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

test: install-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# Benchmarks: each prints its figures and a last line `RESULT key=value ...`.
bench: bench-render bench-runtime bench-propagation bench-hitless bench-overflow bench-loadgen bench-scheduler bench-ui bench-synth

# --- benchmark targets (one per line pair; keep this section at the end) ---
