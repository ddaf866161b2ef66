# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: demo test lint typecheck bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: $(PY) pyproject.toml constraints.txt
	$(PIP) -e ".[torch,plot]"
	touch $@

$(VENV)/.test-installed: $(PY) pyproject.toml constraints.txt
	$(PIP) -e ".[torch,plot,dev,ray,tensorboard,wandb,mlflow]"
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(VENV)/bin/metricsync demo

test: $(VENV)/.test-installed
	$(PY) -m pytest -q

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check metricsync tests bench examples
	$(VENV)/bin/ruff format --check metricsync tests bench examples
	$(VENV)/bin/mypy

bench: $(VENV)/.test-installed
	$(PY) bench/step.py
	$(PY) bench/record.py
	$(PY) bench/sync.py
	$(PY) bench/quantiles.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
