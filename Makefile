# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: demo test test-matrix docs lint typecheck bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: $(PY) pyproject.toml constraints.txt
	$(PIP) -e ".[torch,plot]"
	touch $@

$(VENV)/.test-installed: $(PY) pyproject.toml constraints.txt metricsync/_version.py
	$(PIP) -e ".[all,dev,docs,verl]"
	$(PIP) --no-deps "verl==0.9.1"
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(VENV)/bin/metricsync demo

test: $(VENV)/.test-installed
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-matrix

# The tests that need no torch on Python 3.10, 3.12 and 3.13 (each found on PATH or under
# pyenv; a missing one is skipped), in venvs under .venv-matrix/ holding numpy, pytest and
# hypothesis only. MATRIX_PYTHONS="3.12" narrows it; MATRIX_PYTHONS="" turns it off.
test-matrix:
	tools/test-matrix.sh

# The documentation site, built strictly (a broken reference or link fails) into site/.
# tests/test_docs.py runs the same build, so `make test` checks it too.
docs: $(VENV)/.test-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check metricsync tests bench examples tools conftest.py
	$(VENV)/bin/ruff format --check metricsync tests bench examples tools conftest.py
	$(VENV)/bin/mypy

bench: $(VENV)/.test-installed
	$(PY) bench/step.py
	$(PY) bench/step_phases.py
	$(PY) bench/record.py
	$(PY) bench/sync.py
	$(PY) bench/several.py
	$(PY) bench/merge.py
	$(PY) bench/quantiles.py
	$(PY) bench/async.py
	$(PY) bench/cli.py

clean:
	rm -rf $(VENV) .venv-matrix site build *.egg-info .pytest_cache .mypy_cache .ruff_cache
