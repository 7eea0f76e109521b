# Two commands for a fresh machine: `make report` and `make test`. Each sets itself up (.venv).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# hf: transformers for the Hugging Face integration and its tests (about 30 s to install, 160 MB; its tests
# take about 20 s); kept out of dev so that `pip install -e .[dev]` stays the test tools only.
EXTRAS ?= dev,notebooks,hf
# A GPU machine keeps its own torch (venv sees the system site-packages); elsewhere the CPU build.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_CPU := torch==2.13.0
# pip does not byte-compile every file it installs (most are never imported: a minute of CPU for the dev venv);
# Python compiles a module on its first import and keeps the bytecode in the venv, so make lets it write
# bytecode (PYTHONDONTWRITEBYTECODE, set on some images, is lifted for make's commands).
PIP := $(PY) -m pip install -q --disable-pip-version-check --no-compile
unexport PYTHONDONTWRITEBYTECODE

CORE_VENV ?= build/core-venv
# The suite runs on PYTEST_WORKERS pytest-xdist processes (2: one per core here; 0 runs it in this process).
# tests/conftest.py says what that changes: one torch thread per worker, long tests first (handed out in
# collection order: --no-loadscope-reorder), a module's tests that share a module-scoped fixture on one worker
# (loadgroup), and so the modules that compile the numba kernels; gloo ranks forked from a preloaded server.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

.PHONY: setup test test-fast test-core-install report browser clean-venv

# One stamp per set of extras: `make report` installs only what the reports need (no test tools, no Triton
# interpreter, no transformers); `make test` adds the rest to the same venv.
$(VENV)/.installed-%: pyproject.toml
	@test -x $(PY) || python3 -m venv $(if $(HAS_GPU),--system-site-packages) $(VENV)
	@if [ -z "$(HAS_GPU)" ]; then $(PIP) "$(TORCH_CPU)"; fi
	$(PIP) -e ".[$*]"
	@$(PY) -c "import torch, numba, hilbert_lab.attention.engine"  # their bytecode, once, before the parallel workers
	@touch $@

setup: $(VENV)/.installed-$(EXTRAS)

# Debian's chromium for the one real-browser test (never a downloaded browser build).
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The core package alone (no extras) in a fresh venv: every subcommand's --help and a small run of each.
test-core-install:
	TORCH_SPEC="$(TORCH_CPU)" .ci/core_install_check $(CORE_VENV)

# The core-install check (its own venv: pip, then one process per command) runs in the background, alongside the
# dev venv's set-up and the suite; its log is build/core-install.log, its result is printed after the suite's.
# Either failing fails `make test`.
test: browser
	@mkdir -p build
	@$(MAKE) --no-print-directory test-core-install >build/core-install.log 2>&1 & core=$$!; \
	$(MAKE) --no-print-directory setup && $(PYTEST); status=$$?; \
	if wait $$core; then echo "core install check passed (log: build/core-install.log)"; \
	else tail -n 25 build/core-install.log; echo "core install check FAILED (log: build/core-install.log)"; status=1; fi; \
	exit $$status

test-fast: setup
	$(PYTEST) -m "not slow and not browser"

REPORT_EXTRAS ?= notebooks

report: $(VENV)/.installed-$(REPORT_EXTRAS)
	$(PY) -m hilbert_lab.cli report run default

clean-venv:
	rm -rf $(VENV) $(CORE_VENV)
