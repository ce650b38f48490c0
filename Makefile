# Set-up and everyday commands. `make serve` and `make test` each do all set-up on a fresh machine:
# create .venv, install torch first (the CPU build unless told otherwise, see below, so nothing pulls
# CUDA packages), then lookupspec, pull the default model, then run.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
# pytest worker processes for `make test` / `make test-fast` (pytest-xdist; whole files per worker, the
# slowest first: see tests/suite_plan.py), each with its share of the cores for torch's threads (two
# workers on two cores: one thread each). 0 runs the suite in this process, one test after another.
TEST_WORKERS ?= 2
PYTEST_RUN = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# torch. TORCH is the requirement; TORCH_INDEX the wheel index it comes from. The default index is
# PyTorch's CPU one: from PyPI, `pip install torch==2.13.0` gets the CUDA build and several GB of
# NVIDIA packages. The index is probed first (one request, TORCH_PROBE_TIMEOUT seconds, no retries);
# when it does not answer, or TORCH_INDEX is empty, torch comes from pip's own configured sources
# (PyPI, or a local wheelhouse pip.conf names). `make torch-source` prints the choice. Examples:
#   make TORCH_INDEX=https://download.pytorch.org/whl/cu128 install   # a CUDA build on a GPU machine
#   make TORCH=torch==2.13.0+cu128 TORCH_INDEX=https://download.pytorch.org/whl/cu128 install
#   make TORCH_INDEX= install                                         # pip's configured sources only
# They apply when torch is installed: `make clean` first to change the build of an existing .venv.
TORCH               ?= torch==2.13.0
TORCH_INDEX         ?= https://download.pytorch.org/whl/cpu
TORCH_PROBE_TIMEOUT ?= 5

# Shell code that sets $$index to TORCH_INDEX when it answers, else to "" with the reason in $$why.
define TORCH_CHOOSE
index='$(strip $(TORCH_INDEX))'; why="TORCH_INDEX is empty"; \
if [ -n "$$index" ]; then \
	if why=$$($(PYTHON) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=float(sys.argv[2]))' "$$index" '$(TORCH_PROBE_TIMEOUT)' 2>&1); then \
		why=""; \
	else \
		why="$$index not reachable: $$(printf '%s\n' "$$why" | tail -n 1)"; index=""; \
	fi; \
fi
endef

.PHONY: install install-test torch-source serve test test-fast lint bench pull clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Where torch would come from, without installing anything.
torch-source:
	@$(TORCH_CHOOSE); \
	if [ -n "$$index" ]; then echo "$(TORCH) from $$index"; \
	else echo "$(TORCH) from pip's configured sources ($$why)"; fi

# torch before anything that depends on it, so pip never picks a build of its own.
$(VENV)/.torch: | $(BIN)/python
	@$(TORCH_CHOOSE); \
	if [ -n "$$index" ]; then \
		echo "installing $(TORCH) from $$index"; \
		$(BIN)/pip install --quiet --index-url "$$index" '$(TORCH)'; \
	else \
		echo "installing $(TORCH) from pip's configured sources ($$why)"; \
		$(BIN)/pip install --quiet '$(TORCH)'; \
	fi
	touch $@

# Stamps re-run the install whenever pyproject.toml changes.
# setuptools warns that an editable install is one ("BuildBackendWarning: Editable installation"):
# true and expected here, so it is not shown.
PIP_EDITABLE = PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP_EDITABLE) .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.torch
	$(PIP_EDITABLE) ".[test]"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The default model, and beside it numba's kernel caches and the C kernels (compiled once here rather
# than in every process that first needs them: lookupspec/warmup.py).
PULL = $(BIN)/python -c 'from lookupspec.warmup import warm_native, warm_numba; warm_numba(); warm_native()' & \
	jit=$$!; $(BIN)/lookupspec pull smollm2-135m-instruct && wait $$jit

pull: $(VENV)/.installed
	$(PULL)

# `make serve MODEL=/path/to/model PORT=8080`: a Hugging Face directory or a GGUF file instead of the
# default demo model (pulled only when it is the one served). Ctrl-C drains and stops it.
MODEL ?= smollm2-135m-instruct
PORT  ?= 8000
serve: $(VENV)/.installed
	@if [ "$(MODEL)" = "smollm2-135m-instruct" ]; then $(PULL); fi
	@echo "starting lookupspec serve --model $(MODEL) on http://127.0.0.1:$(PORT) (Ctrl-C stops it)"
	$(BIN)/lookupspec serve --host 127.0.0.1 --port $(PORT) --model "$(MODEL)"

# The whole suite, real-model tests included (they are marked `real_model` and run here too).
test: install-test
	$(PULL)
	$(PYTEST_RUN) $(PYTEST_ARGS)

# Everything but the real-model tests, for quick iterations.
test-fast: install-test
	$(PYTEST_RUN) -m "not real_model" $(PYTEST_ARGS)

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/mypy lookupspec kernels gateway tools

# The engine benchmark on the default prompts (all four kinds, 128 new tokens, SmolLM2, greedy);
# ~30 min on two cores. BENCH_ARGS="--limit 8" for a quick look.
BENCH_ARGS ?=
bench: pull install-test
	mkdir -p out
	$(BIN)/lookupspec bench --json out/bench.json --plot out/bench.png $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
