"""The ``wandb`` backend: a Weights & Biases run.

``wandb.init`` gets ``dir=$WANDB_DIR`` when that variable is set, else
``dir=run_dir``; the mode comes from the ``mode`` option or, failing that,
wandb's own ``WANDB_MODE`` (``offline`` writes ``<dir>/wandb/offline-run-*``
without touching the network). ``project``, ``name``, ``entity``, ``group``,
``tags`` and ``config`` (the run's hyperparameters) are passed through when
given. Each step is one ``run.log(values, step=step)``; metric keys with
``/`` become W&B sections. Histograms (``Tracker(histograms=...)``) are
``wandb.Histogram(np_histogram=(counts, edges))`` values under
``<name>/histogram``, logged at the same step, at most 512 buckets (W&B's limit; adjacent buckets are merged past it).
``close()`` calls ``run.finish()``.

>>> import tempfile
>>> backend = WandbBackend(tempfile.mkdtemp(), mode="disabled")
>>> backend.log({"loss": 0.5}, 1, {})
>>> backend.close()
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._buckets import histogram_rows
from ._config import as_config
from ._protocol import missing_package

if TYPE_CHECKING:
    from .._state._histogram import Histogram

__all__ = ["WandbBackend"]


class WandbBackend:
    """Log every step to a new W&B run (raises ``ImportError`` naming ``metricsync[wandb]``).

    >>> import tempfile
    >>> WandbBackend(tempfile.mkdtemp(), mode="disabled", project="demo").close()
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        project: str | None = None,
        name: str | None = None,
        mode: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        tags: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(missing_package("wandb", "wandb", "wandb")) from exc
        directory = Path(os.environ.get("WANDB_DIR") or run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        given: dict[str, Any] = {
            "project": project,
            "name": name,
            "mode": mode,
            "entity": entity,
            "group": group,
            "tags": list(tags) if tags is not None else None,
            "config": as_config(config) if config is not None else None,
        }
        self._histogram = wandb.Histogram
        self._run: Any = wandb.init(
            dir=str(directory), **{k: v for k, v in given.items() if v is not None}
        )
        self._closed = False

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """One ``run.log`` call for the whole step."""
        self._run.log(dict(values), step=step)

    def log_histograms(self, histograms: Mapping[str, Histogram], step: int) -> None:
        """One ``run.log`` call holding a ``wandb.Histogram`` per key at ``step``."""
        row = dict(
            histogram_rows(
                histograms,
                lambda _, edges, counts: self._histogram(
                    np_histogram=(counts.tolist(), edges.tolist())
                ),
            )
        )
        if row:
            self._run.log(row, step=step)

    def close(self) -> None:
        """Finish the run; calling it again does nothing."""
        if not self._closed:
            self._closed = True
            self._run.finish()
