"""The ``tensorboard`` backend: scalar event files under ``run_dir``.

Uses ``torch.utils.tensorboard.SummaryWriter`` when torch is installed, else
TensorBoard's own framework-free ``tensorboard.summary.Writer``. Each key is
one scalar series (``add_scalar(key, value, step)``, never ``add_scalars``,
which would scatter keys over sub-directories); the writer is flushed every
step. Reopening a run directory adds a new event file that TensorBoard reads
together with the earlier ones.

>>> import tempfile, pathlib
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> backend = TensorBoardBackend(run_dir)
>>> backend.log({"loss": 0.5}, 1, {})
>>> backend.close()
>>> any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import missing_package

__all__ = ["TensorBoardBackend"]


class TensorBoardBackend:
    """Write every value as a TensorBoard scalar under ``run_dir``.

    Raises ``ImportError`` naming ``metricsync[tensorboard]`` when the
    ``tensorboard`` package is missing.

    >>> import tempfile
    >>> TensorBoardBackend(tempfile.mkdtemp()).close()
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, flush_secs: int = 120) -> None:
        try:
            import tensorboard  # noqa: F401  (SummaryWriter needs it too)
        except ImportError as exc:
            raise ImportError(missing_package("tensorboard", "tensorboard", "tensorboard")) from exc
        directory = str(Path(run_dir))
        self._writer: Any
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            from tensorboard.summary import Writer

            self._writer = Writer(directory)
        else:
            self._writer = SummaryWriter(log_dir=directory, flush_secs=flush_secs)
        self._closed = False

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """Add one scalar per key at ``step`` and flush."""
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; calling it again does nothing."""
        if not self._closed:
            self._closed = True
            self._writer.close()
