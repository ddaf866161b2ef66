"""Logging backends: a tiny protocol, the built-in implementations and their factory.

A backend is anything with ``log(values, step, formats)`` and ``close()``
(:class:`Backend`); the :class:`~metricsync._tracker.Tracker` fans every step
out to its backends. Built-in backends are chosen by name; each imports its
optional package only when constructed, and a missing package raises
``ImportError`` naming the pip extra to install.

==============  ==========================================  ===================
name            writes                                      options
==============  ==========================================  ===================
``console``     one aligned line per step to ``sys.stdout``  (``console_keys``)
``jsonl``       ``run_dir/metrics.jsonl``                    ``fsync``
``tensorboard`` event files under ``run_dir``                ``flush_secs``
``wandb``       a W&B run (``WANDB_MODE``, ``WANDB_DIR``)    ``project``, ``name``,
                                                             ``mode``, ``entity``,
                                                             ``group``, ``tags``,
                                                             ``config``
``mlflow``      an MLflow run (``MLFLOW_TRACKING_URI``)      ``tracking_uri``,
                                                             ``experiment``,
                                                             ``name``, ``tags``
==============  ==========================================  ===================

>>> class Collect:
...     def __init__(self): self.rows = []
...     def log(self, values, step, formats): self.rows.append((step, dict(values)))
...     def close(self): pass
>>> isinstance(Collect(), Backend)
True
>>> sorted(BACKEND_OPTIONS)
['console', 'jsonl', 'mlflow', 'tensorboard', 'wandb']
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["BACKEND_OPTIONS", "Backend", "create_backend", "missing_package"]


@runtime_checkable
class Backend(Protocol):
    """What a :class:`~metricsync._tracker.Tracker` needs from a backend.

    ``values`` maps metric keys to Python floats (NaN and infinities
    included); ``formats`` maps the same keys to their format spec or None.

    >>> class Print:
    ...     def log(self, values, step, formats): print(step, dict(values))
    ...     def close(self): pass
    >>> isinstance(Print(), Backend)
    True
    """

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """Record ``values`` for ``step``."""

    def close(self) -> None:
        """Flush and release everything; the backend is not used afterwards."""


BACKEND_OPTIONS: dict[str, frozenset[str]] = {
    "console": frozenset(),
    "jsonl": frozenset({"fsync"}),
    "tensorboard": frozenset({"flush_secs"}),
    "wandb": frozenset({"project", "name", "mode", "entity", "group", "tags", "config"}),
    "mlflow": frozenset({"tracking_uri", "experiment", "name", "tags"}),
}
"""Keyword options each built-in backend accepts (passed through ``Tracker(**backend_options)``)."""


def missing_package(backend: str, package: str, extra: str) -> str:
    """The message of the ``ImportError`` raised when an optional package is missing.

    >>> missing_package("wandb", "wandb", "wandb")
    'the "wandb" backend needs the wandb package: pip install "metricsync[wandb]"'
    """
    return f'the "{backend}" backend needs the {package} package: pip install "metricsync[{extra}]"'


def create_backend(
    name: str,
    run_dir: str | os.PathLike[str],
    options: Mapping[str, Any] | None = None,
    *,
    console_keys: str | Sequence[str] | None = None,
) -> Backend:
    """Construct the built-in backend called ``name`` writing under ``run_dir``.

    ``options`` may hold any key of :data:`BACKEND_OPTIONS`; those that this
    backend does not accept are ignored (they belong to another backend).

    >>> create_backend("console", "unused", console_keys="loss").log({"loss": 0.5}, 1, {})
    step 1 | loss      0.5
    >>> create_backend("nope", "runs")
    Traceback (most recent call last):
    ...
    ValueError: expected a backend name among console, jsonl, mlflow, tensorboard, wandb or a backend object, got 'nope'
    """
    if name not in BACKEND_OPTIONS:
        known = ", ".join(sorted(BACKEND_OPTIONS))
        raise ValueError(f"expected a backend name among {known} or a backend object, got {name!r}")
    mine = {k: v for k, v in (options or {}).items() if k in BACKEND_OPTIONS[name]}
    directory = Path(run_dir)
    if name == "console":
        from ._console import ConsoleBackend

        return ConsoleBackend(keys=console_keys)
    if name == "jsonl":
        from ._jsonl import JsonlBackend

        return JsonlBackend(directory, **mine)
    if name == "tensorboard":
        from ._tensorboard import TensorBoardBackend

        return TensorBoardBackend(directory, **mine)
    if name == "wandb":
        from ._wandb import WandbBackend

        return WandbBackend(directory, **mine)
    from ._mlflow import MlflowBackend

    return MlflowBackend(directory, **mine)
