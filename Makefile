# Commands for a fresh machine: `make test` (quick tier), `make test-all` (everything, CI), `make report`;
# each sets itself up (.venv). `make test-gpu` runs the GPU tests on a GPU machine and installs nothing.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# A GPU machine keeps its own torch (venv sees the system site-packages); elsewhere the CPU build.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_CPU := torch==2.13.0
# pip does not byte-compile every file it installs (most are never imported: a minute of CPU for the dev venv);
# Python compiles a module on its first import and keeps the bytecode in the venv, so make lets it write
# bytecode (PYTHONDONTWRITEBYTECODE, set on some images, is lifted for make's commands).
# The machine's pip installs into the venv (which is made without a pip of its own: ensurepip costs seconds).
PIP := python3 -m pip --python $(PY) install -q --disable-pip-version-check --no-compile
unexport PYTHONDONTWRITEBYTECODE

# What each command installs. The quick tier needs the test tools and the reports extra (one notebook run, one
# browser page: no JupyterLab, about 20 s of installing); test-all adds JupyterLab (the notebooks extra: its
# browser tests) and hf (transformers: about 30 s to install, 160 MB, for the Hugging Face integration).
TEST_EXTRAS ?= dev,reports
ALL_EXTRAS ?= dev,notebooks,hf
REPORT_EXTRAS ?= reports

CORE_VENV ?= build/core-venv
# The suite runs on PYTEST_WORKERS pytest-xdist processes (2: one per core here; 0 runs it in this process).
# tests/conftest.py says what that changes: one torch thread per worker, long tests first (handed out in
# collection order: --no-loadscope-reorder), a module's tests that share a module-scoped fixture on one worker
# (loadgroup), and so the modules that compile the numba kernels; gloo ranks forked from a preloaded server.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15
# pytest's exit status 5 (no test collected: a marker expression or a path that selects nothing) is a failure
# too, said in words; any other status passes through.
CHECK_COLLECTED := status=$$?; if [ $$status -eq 5 ]; then echo "pytest collected no test (exit 5)" >&2; fi; exit $$status

.PHONY: setup test fuzz test-all test-gpu test-core-install report browser clean-venv

# One stamp per set of extras: `make report` installs only what the reports need (no test tools, no Triton
# interpreter, no transformers); `make test` adds the test tools, `make test-all` transformers, to the same venv.
# torch comes from pip (this machine's pinned CPU build, which uv would not see), together with uv; uv then installs
# the package, its extras and a pip for the venv (parallel downloads and unpacking: seconds, where pip takes half a
# minute) while torch's bytecode is written on the other core (that import's warnings, such as numpy not being there
# yet, are dropped: it only warms). pip installs them where uv cannot.
$(VENV)/.installed-%: pyproject.toml
	@test -x $(PY) || python3 -m venv --without-pip $(if $(HAS_GPU),--system-site-packages) $(VENV)
	@if [ -z "$(HAS_GPU)" ]; then $(PIP) "$(TORCH_CPU)" uv; fi
	@$(PY) -c "import torch" 2>/dev/null & warm=$$!; \
	{ test -x $(VENV)/bin/uv && $(VENV)/bin/uv pip install --quiet --no-cache --python $(PY) pip -e ".[$*]"; } \
		|| $(PIP) pip -e ".[$*]"; status=$$?; wait $$warm; exit $$status
	@$(PY) -c "import torch, numba, hilbert_lab.attention.engine"  # their bytecode, once, before the parallel workers
	@touch $@

setup: $(VENV)/.installed-$(ALL_EXTRAS)

# Debian's chromium for the real-browser tests (never a downloaded browser build).
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The core package alone (no extras) in a fresh venv: every subcommand's --help and a small run of each.
test-core-install:
	TORCH_SPEC="$(TORCH_CPU)" .ci/core_install_check $(CORE_VENV)

# Quick tier: every test not marked slow (pyproject.toml says what the markers mean): each module's unit tests,
# the float64 exactness families at small sizes, one gloo ring, one notebook run, one browser page.
test: browser $(VENV)/.installed-$(TEST_EXTRAS)
	@$(PYTEST) -m "not slow"; $(CHECK_COLLECTED)

# The property tests (hypothesis, the gloo ring's random cases, the fused Triton kernel's under its interpreter) with
# FUZZ_EXAMPLES new random examples each (the interpreter: one in 20), where `make test` draws a fixed few: the float64
# oracle against random patterns, calls, caches, curves, rings of 2, 3 and 4 ranks and transformers models (the hf
# extra), for as long as they take.
FUZZ_EXAMPLES ?= 2000
fuzz: $(VENV)/.installed-$(TEST_EXTRAS),hf
	@HILBERT_LAB_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PYTEST) -m "property and not gpu"; $(CHECK_COLLECTED)

# Everything (CI: .ci/run): the slow trainings, every browser test and notebook, and the core-install check. The
# check (its own venv: pip, then one process per command) runs in the background, alongside the dev venv's
# set-up and the suite; its log is build/core-install.log, its result is printed after the suite's. Either
# failing fails `make test-all`.
test-all: browser
	@mkdir -p build
	@$(MAKE) --no-print-directory test-core-install >build/core-install.log 2>&1 & core=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.installed-$(ALL_EXTRAS) && $(PYTEST); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no test (exit 5)" >&2; fi; \
	if wait $$core; then echo "core install check passed (log: build/core-install.log)"; \
	else tail -n 25 build/core-install.log; echo "core install check FAILED (log: build/core-install.log)"; status=1; fi; \
	exit $$status

# Every test marked gpu (the FlashAttention-4 executor's where FA4 is installed, the NCCL ring where two or more
# GPUs are visible), skip reasons printed. A GPU machine has no package registry: nothing is installed. The python
# is PY= from the command line, else the venv's when it has torch, pytest and pytest-xdist, else the system
# python3 (its CUDA torch); the checkout is put on PYTHONPATH. Packages the tests only sometimes use
# (hypothesis, hilbertcurve, playwright, pytest-timeout) may be missing: those tests skip, naming the package.
# WITHOUT=flash_attn runs the suite as a machine without FlashAttention-4 (`auto` then picks among the others).
GPU_WORKERS ?= 8
test-gpu:
	@py="$(PY)"; \
	if [ "$(origin PY)" != "command line" ] && ! "$$py" -c "import torch, pytest, xdist" 2>/dev/null; then py=python3; fi; \
	if ! "$$py" -c "import torch, pytest, xdist" 2>/dev/null; then \
		echo "make test-gpu: $$py lacks torch, pytest or pytest-xdist; name a python that has them: make test-gpu PY=..." >&2; exit 2; fi; \
	echo "make test-gpu: $$(command -v "$$py"), torch $$("$$py" -c 'import torch; print(torch.__version__, "cuda devices:", torch.cuda.device_count())')"; \
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" "$$py" -m pytest -q -rs -m gpu -n $(GPU_WORKERS) --dist loadgroup \
		--durations=15 $(if $(WITHOUT),--without=$(WITHOUT)); $(CHECK_COLLECTED)

report: $(VENV)/.installed-$(REPORT_EXTRAS)
	$(PY) -m hilbert_lab.cli report run default

clean-venv:
	rm -rf $(VENV) $(CORE_VENV)
