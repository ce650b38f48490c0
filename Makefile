# Set-up and everyday commands. `make serve` and `make test` each do all set-up on a fresh machine:
# create .venv, install (torch pinned to the 2.13.0 CPU wheel first, so nothing pulls CUDA packages),
# pull the default model, then run.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install install-test serve test test-fast lint bench pull clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamps re-run the install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

pull: $(VENV)/.installed
	$(BIN)/lookupspec pull smollm2-135m-instruct

serve: pull
	$(BIN)/lookupspec serve --host 127.0.0.1 --port 8000

# The whole suite, real-model tests included (they are marked `real_model` and run here too).
test: install-test
	$(BIN)/lookupspec pull smollm2-135m-instruct
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Everything but the real-model tests, for quick iterations.
test-fast: install-test
	$(BIN)/python -m pytest -q -m "not real_model" $(PYTEST_ARGS)

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/mypy lookupspec kernels gateway

# The engine benchmark on the default prompts (all four kinds, 128 new tokens, SmolLM2, greedy);
# ~30 min on two cores. BENCH_ARGS="--limit 8" for a quick look.
BENCH_ARGS ?=
bench: pull install-test
	mkdir -p out
	$(BIN)/lookupspec bench --json out/bench.json --plot out/bench.png $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
