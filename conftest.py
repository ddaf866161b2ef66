"""Settings shared by ``tests/`` and the doctests under ``metricsync/``.

The numpy-only test matrix (``make test-matrix``) runs without torch and the
backends' packages. There, modules that import torch at import time are not
collected, and a doctest is skipped, naming what it needs, when its examples
import a missing package or its module wraps one (a backend's doctests create
that backend). With everything installed, nothing here changes a run.

Hypothesis runs derandomized (the ``deterministic`` profile): each property test
tries the same examples on every run and every machine, so CI fails only where
a local run fails too. ``HYPOTHESIS_PROFILE=explore`` draws fresh examples
(and keeps the failures it finds in ``.hypothesis/`` to replay them).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent

# Console widths come from $COLUMNS when it is set (else a pipe is not wrapped); pytest's
# xdist workers inherit one from the controller's terminal, so the tests that print a
# table or a console line would wrap there and not in a plain run. Tests that need a
# width set it themselves.
os.environ.pop("COLUMNS", None)

# No deadline in either profile: a loaded machine makes any per-example time limit flaky.
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

NEEDS_AT_IMPORT = {
    "metricsync/_record/_device.py": "torch",
    "metricsync/_record/_device_fold.py": "torch",
    "metricsync/_record/_device_refs.py": "torch",
    "metricsync/_record/_streams.py": "torch",
    "metricsync/integrations/transformers.py": "transformers",
    "metricsync/integrations/accelerate.py": "accelerate",
    "metricsync/integrations/lightning.py": "lightning",
    "tests/test_verl_single_controller.py": "torch",
    "tests/test_verl_side_by_side.py": "torch",
}
"""Modules that import an optional package at import time."""

DOCTESTS_NEED = {
    "metricsync/backends/_tensorboard.py": "tensorboard",
    "metricsync/backends/_wandb.py": "wandb",
    "metricsync/backends/_mlflow.py": "mlflow",
    "metricsync/backends/_swanlab.py": "swanlab",
    "metricsync/backends/_trackio.py": "trackio",
    "metricsync/_cli/_plotting.py": "matplotlib",
    "metricsync/_cli/_benchmark.py": "torch",
    "metricsync/testing.py": "torch",
}
"""Modules whose doctests use an optional package without importing it themselves."""

_IMPORT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", re.M)


def _missing(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):
        return True


collect_ignore = [path for path, package in NEEDS_AT_IMPORT.items() if _missing(package)]


_STARTS_RAY = re.compile(r"ray\.init\(|local_ray\(|^\s*import ray\b|examples/verl", re.M)


def _starts_ray(path: Path, seen: dict[Path, bool]) -> bool:
    if path not in seen:
        seen[path] = path.suffix == ".py" and bool(_STARTS_RAY.search(path.read_text()))
    return seen[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under `pytest -n 2 --dist loadgroup` (make test), the tests that start a Ray cluster
    # all run in one worker: two clusters at once would share the machine's two cores.
    seen: dict[Path, bool] = {}
    for item in items:
        if _starts_ray(Path(str(item.fspath)), seen):
            item.add_marker(pytest.mark.xdist_group("ray"))
    for item in items:
        if not isinstance(item, pytest.DoctestItem) or item.dtest is None:
            continue
        needed = {m for example in item.dtest.examples for m in _IMPORT.findall(example.source)}
        relative = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        if relative in DOCTESTS_NEED:
            needed.add(DOCTESTS_NEED[relative])
        missing = sorted(m for m in needed if _missing(m))
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(missing)}"))
