# The README's two commands: `make lab` and `make test`. Everything is installed into .venv by this file.
# PYTHON: the first of python3.13 .. python3.10, python3 that is Python 3.10 or newer (or PYTHON=... make lab).
ifeq ($(origin PYTHON), undefined)
PYTHON := $(firstword $(foreach candidate,python3.13 python3.12 python3.11 python3.10 python3,\
	$(shell command -v $(candidate) >/dev/null 2>&1 && $(candidate) -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	2>/dev/null && echo $(candidate))))
endif
# `make test-gpu` runs on the GPU machine's own python3 (torch with CUDA already there; no registry needed)
GPU_PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := -c constraints.txt
# TorchRec's declared dependencies pull the CUDA fbgemm_gpu wheel, which breaks its import on CPU machines,
# so it goes in without them; its light dependencies come from the `torchrec` extra.
TORCHREC := torchrec==1.8.0

.PHONY: lab test test-fast test-gpu bench venv-base venv-dev clean

$(VENV)/.base:
	@test -n "$(PYTHON)" || { echo "make: no Python 3.10 or newer found (tried python3.13 .. python3.10, python3); install one or run PYTHON=/path/to/python make $(MAKECMDGOALS)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(CONSTRAINTS) torch==2.13.0
	$(PIP) install -q $(CONSTRAINTS) -e ".[notebook]"
	touch $@

$(VENV)/.dev: $(VENV)/.base pyproject.toml constraints.txt
	$(PIP) install -q $(CONSTRAINTS) -e ".[notebook,dev,fbgemm,torchrec]"
	$(PIP) install -q $(CONSTRAINTS) --no-deps $(TORCHREC)
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null
	touch $@

venv-base: $(VENV)/.base
venv-dev: $(VENV)/.dev

lab: $(VENV)/.base
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null
	$(PY) -m jupyter lab --no-browser --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root,) \
		--ContentsManager.pre_save_hook=rectoolkit.widgets.clean_notebooks.keep_notebooks_clean

test: $(VENV)/.dev
	$(PY) -m ruff check rectoolkit tests benchmarks
	$(PY) -m pytest -q --durations=25 tests
	$(PY) -m pytest -q --doctest-modules rectoolkit
	RECTOOLKIT_DISABLE_FBGEMM=1 $(PY) -m pytest -q -m "not multiprocess and not browser and not notebooks" \
		tests/sparse tests/kernels tests/modules tests/quant tests/planner tests/plan

test-fast: $(VENV)/.dev
	$(PY) -m pytest -q -x -m "not browser and not notebooks" tests

# The tests marked `gpu` on the visible CUDA device (docs/gpu.md); without make: `bash .ci/gpu`.
test-gpu:
	PYTHON=$(GPU_PYTHON) bash .ci/gpu

bench: $(VENV)/.dev
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV)
