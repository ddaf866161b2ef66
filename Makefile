# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -qq -c constraints.txt

.PHONY: demo test test-all test-slow test-matrix lock docs lint typecheck bench clean

$(PY):
	@echo "make: creating the virtual environment .venv (once), then installing into it"
	@$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: $(PY) pyproject.toml constraints.txt
	@echo "make demo: installing metricsync with torch and matplotlib into .venv (once)"
	$(PIP) -e ".[torch,plot]"
	touch $@

# One pip install of the pinned set the suite needs (requirements/test.txt, made by
# `make lock`): every integration's real package, verl without its training stack.
$(VENV)/.test-installed: $(PY) pyproject.toml constraints.txt requirements/test.txt metricsync/_version.py
	@echo "make test: installing metricsync and the pinned test dependencies into .venv (once, a few minutes)"
	$(PIP) --no-deps -r requirements/test.txt -e .
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(VENV)/bin/metricsync demo

# The whole suite but the cases marked slow, on two pytest workers (Ray's in one of them).
test: $(VENV)/.test-installed
	@echo "make test: running the test suite on 2 workers (slow cases and other Pythons: make test-all)"
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow"

# What `make test` leaves out: the slow cases (a wheel and an sdist built and installed in
# a clean venv, ...) and the numpy-only tests on Python 3.10, 3.12 and 3.13.
test-slow: $(VENV)/.test-installed
	@echo "make test-slow: the slow cases, then the tests that need no torch on other Pythons"
	$(PY) -m pytest -q -n 2 --dist loadgroup -m slow
	$(MAKE) --no-print-directory test-matrix

test-all: test test-slow

# Pin the test set anew after a change of pyproject.toml's extras: every extra, then verl
# with --no-deps (its own list is a training stack; the verl extra holds what its modules import).
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --disable-pip-version-check -qq -c constraints.txt -e ".[all,dev,docs,verl]"
	.venv-lock/bin/python -m pip install --disable-pip-version-check -qq -c constraints.txt --no-deps "verl==0.9.1"
	(echo "# Made by \`make lock\`: what \`make test\` installs, pinned; torch as constraints.txt pins it."; \
	 .venv-lock/bin/python -m pip freeze --all --exclude-editable | grep -v -e "^metricsync" -e "^-e" -e "^pip==" \
	 | sed -e 's/^torch==\([^+]*\)+.*/torch==\1/') > requirements/test.txt
	rm -rf .venv-lock

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
	rm -rf $(VENV) .venv-matrix .venv-lock site build *.egg-info .pytest_cache .mypy_cache .ruff_cache
