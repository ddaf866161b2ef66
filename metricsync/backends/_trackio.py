"""The ``trackio`` backend: a Trackio run in Trackio's local SQLite store.

``trackio.init`` gets ``project`` (default ``"metricsync"``), ``name``,
``group`` and ``config`` (the run's hyperparameters). The data go where
Trackio keeps them: ``$TRACKIO_DIR``, read when ``trackio`` is first imported,
else its folder in the Hugging Face cache; ``trackio show`` opens the
dashboard. ``$TRACKIO_SPACE_ID`` or ``$TRACKIO_SERVER_URL`` send the run to a
Space or a server instead, as Trackio itself decides. Each step is one
``run.log(values, step=step)``; histograms (``Tracker(histograms=...)``) are
``trackio.Histogram(np_histogram=(counts, edges))`` values under
``<name>/histogram``, at most 512 buckets. ``close()`` finishes the run. Trackio holds one run per process, so
starting this backend finishes a Trackio run started earlier in the process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._buckets import histogram_rows
from ._config import as_config
from ._protocol import missing_package

if TYPE_CHECKING:
    from .._state._histogram import Histogram

__all__ = ["TrackioBackend"]


class TrackioBackend:
    """Log every step to a Trackio run (raises ``ImportError`` naming ``metricsync[trackio]``)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        project: str | None = None,
        name: str | None = None,
        group: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import trackio
        except ImportError as exc:
            raise ImportError(missing_package("trackio", "trackio", "trackio")) from exc
        self._histogram = trackio.Histogram
        self._run: Any = trackio.init(
            project=project or "metricsync",
            name=name,
            group=group,
            config=as_config(config) if config is not None else None,
            embed=False,
        )
        self.project: str = project or "metricsync"
        self.name: str = self._run.name
        self._closed = False

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """One ``run.log`` call for the whole step."""
        self._run.log(dict(values), step=step)

    def log_histograms(self, histograms: Mapping[str, Histogram], step: int) -> None:
        """One ``run.log`` call holding a ``trackio.Histogram`` per key at ``step``."""
        row = dict(histogram_rows(histograms, lambda _, e, c: self._histogram(np_histogram=(c, e))))
        if row:
            self._run.log(row, step=step)

    def close(self) -> None:
        """Finish the run; calling it again does nothing."""
        if not self._closed:
            self._closed = True
            self._run.finish()
