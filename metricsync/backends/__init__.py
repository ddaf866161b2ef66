"""Logging backends: a tiny protocol, the built-in implementations and a registry of names.

A backend is anything with ``log(values, step, formats)`` and ``close()``
(:class:`Backend`); one that also has ``log_histograms(histograms, step)``
(:class:`HistogramBackend`) draws distributions. The
:class:`~metricsync.Tracker` fans every step out to its backends. Backends are
chosen by name; each built-in one imports its optional package only when
created, and a missing package raises ``ImportError`` naming the pip extra to
install. Other names come from :func:`register_backend` or from installed
packages' entry points in the group ``metricsync.backends``.

===============  =========================================  ========================
name             writes                                     options
===============  =========================================  ========================
``console``      one aligned line per step to ``stdout``    ``console_keys``
``jsonl``        ``run_dir/metrics.jsonl``                  ``fsync``
``tensorboard``  event files under ``run_dir`` (scalars,    ``flush_secs``,
                 histograms, hparams)                       ``config``,
                                                            ``double_precision``
``wandb``        a W&B run (``WANDB_MODE``, ``WANDB_DIR``)  ``project``, ``name``,
                                                            ``mode``, ``entity``,
                                                            ``group``, ``tags``,
                                                            ``config``
``mlflow``       an MLflow run (``MLFLOW_TRACKING_URI``)    ``tracking_uri``,
                                                            ``experiment``, ``name``,
                                                            ``tags``, ``config``
``swanlab``      a SwanLab run (``SWANLAB_MODE``),          ``project``, ``name``,
                 logs under ``run_dir/swanlog``             ``mode``, ``workspace``,
                                                            ``group``, ``tags``,
                                                            ``config``
``trackio``      a Trackio run in its local SQLite store    ``project``, ``name``,
                 (``TRACKIO_DIR``)                          ``group``, ``config``
===============  =========================================  ========================

>>> class Collect:
...     def __init__(self): self.rows = []
...     def log(self, values, step, formats): self.rows.append((step, dict(values)))
...     def close(self): pass
>>> isinstance(Collect(), Backend)
True
>>> sorted(BACKEND_OPTIONS)
['console', 'jsonl', 'mlflow', 'swanlab', 'tensorboard', 'trackio', 'wandb']
"""

from __future__ import annotations

from ._protocol import Backend, HistogramBackend, missing_package
from ._registry import (
    BACKEND_OPTIONS,
    ENTRY_POINT_GROUP,
    BackendFactory,
    available_backends,
    backend_factory,
    backend_options,
    create_backend,
    register_backend,
    unregister_backend,
)

__all__ = [
    "BACKEND_OPTIONS",
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendFactory",
    "HistogramBackend",
    "available_backends",
    "backend_factory",
    "backend_options",
    "create_backend",
    "missing_package",
    "register_backend",
    "unregister_backend",
]
