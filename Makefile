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
PIP := $(PY) -m pip install -q --disable-pip-version-check

CORE_VENV ?= build/core-venv

.PHONY: setup test test-fast test-core-install report browser clean-venv

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(if $(HAS_GPU),--system-site-packages) $(VENV)
	@if [ -z "$(HAS_GPU)" ]; then $(PIP) "$(TORCH_CPU)"; fi
	$(PIP) -e ".[$(EXTRAS)]"
	@touch $@

setup: $(VENV)/.installed

# Debian's chromium for the one real-browser test (never a downloaded browser build).
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The core package alone (no extras) in a fresh venv: every subcommand's --help and a small run of each.
test-core-install:
	TORCH_SPEC="$(TORCH_CPU)" .ci/core_install_check $(CORE_VENV)

test: setup browser test-core-install
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not browser"

report: setup
	$(PY) -m hilbert_lab.cli report run default

clean-venv:
	rm -rf $(VENV) $(CORE_VENV)
