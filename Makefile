# Two set-up commands for a newcomer: `make demo` and `make test`. Both create .venv when missing and install
# the project once; the install is skipped while pyproject.toml is unchanged (the stamp file), and pip reuses
# its cached llama-cpp-python wheel, so the ~5-20 minute llama.cpp build happens once per machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.nexus-installed
UNAME := $(shell uname -s)
# MLX's Linux CPU wheel bundles the reference BLAS (~30x slower matmuls); native/blas.py loads this one instead.
OPENBLAS := /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3

.PHONY: demo test test-fast lint install clean-venv system-deps

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(MAKE) --no-print-directory system-deps
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

system-deps:
ifeq ($(UNAME),Linux)
	@if [ ! -e $(OPENBLAS) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing OpenBLAS (libopenblas0-pthread) for MLX on CPU"; \
	    (apt-get update -qq && apt-get install -y -qq libopenblas0-pthread >/dev/null) \
	      || echo "warning: OpenBLAS install failed; MLX on CPU will use its slow reference BLAS"; \
	  else \
	    echo "warning: $(OPENBLAS) missing; install libopenblas0-pthread for fast MLX on CPU"; \
	  fi; \
	fi
endif

demo: $(STAMP)
	$(VENV)/bin/nexus demo

# The suite on TEST_WORKERS pytest-xdist workers with one model thread each (never more threads than cores: llama.cpp's
# threads stall on a busy core), then the tests marked `serial` in one process.
TEST_WORKERS ?= 2
ONE_THREAD := NEXUS_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1

test: lint
	$(ONE_THREAD) $(PY) -m pytest -n $(TEST_WORKERS) -m "not serial"
	$(PY) -m pytest -m serial

test-fast: lint
	$(ONE_THREAD) $(PY) -m pytest -n $(TEST_WORKERS) -m "not slow and not serial"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean-venv:
	rm -rf $(VENV)
