"""The ``tensorboard`` backend: event files under ``run_dir``.

Events are written with TensorBoard's own event-file writer and protocol
buffers (what ``torch.utils.tensorboard.SummaryWriter`` uses underneath), so
neither torch nor TensorFlow is needed:

- every value is a scalar series (one tag per key, never ``add_scalars``,
  which would scatter keys over sub-directories). By default it is a
  ``simple_value``, as ``SummaryWriter.add_scalar(tag, value)`` writes it:
  what TensorBoard draws and what ``EventAccumulator(...).Scalars(tag)``
  reads, in float32: about 7 significant digits (``1e-6`` reads back as
  ``9.99999997e-07``, ``123456789`` as ``123456792.0``), a magnitude beyond
  about 3.4e38 as an infinity and one below about 7e-46 as ``0.0`` (``1e-50``
  reads back as ``0.0``). With ``double_precision=True`` it is a float64
  tensor, exact, as ``SummaryWriter.add_scalar(..., new_style=True,
  double_precision=True)`` writes it: TensorBoard draws it as a scalar, but
  scripts read it with ``EventAccumulator(...).Tensors(tag)``, not ``Scalars``.
  A run directory holding both kinds for one tag (a run of an earlier
  metricsync, which wrote float64 tensors, resumed with the float32 default)
  is one curve in TensorBoard but split between ``Tensors`` and ``Scalars``
  for ``EventAccumulator``: resume with the setting the run started with;
- histograms (``Tracker(histograms=...)``) are TensorBoard histograms tagged
  ``<name>/histogram``, as ``SummaryWriter.add_histogram_raw`` writes them,
  at most 512 buckets;
- ``config`` becomes the run's hyperparameters in the HParams dashboard
  (nested keys joined with ``/``).

The writer is flushed every step. Reopening a run directory adds a new event
file that TensorBoard reads together with the earlier ones.

>>> import tempfile, pathlib
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> backend = TensorBoardBackend(run_dir, config={"lr": 3e-4})
>>> backend.log({"loss": 0.5}, 1, {})
>>> backend.close()
>>> any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
True
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._buckets import histogram_rows
from ._config import as_config, flat_config
from ._protocol import missing_package

if TYPE_CHECKING:
    from .._state._histogram import Histogram

__all__ = ["TensorBoardBackend"]


class TensorBoardBackend:
    """Write every value as a TensorBoard scalar under ``run_dir`` (float64 with ``double_precision``).

    Raises ``ImportError`` naming ``metricsync[tensorboard]`` when the
    ``tensorboard`` package is missing.

    >>> import tempfile
    >>> TensorBoardBackend(tempfile.mkdtemp()).close()
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        flush_secs: int = 120,
        config: Mapping[str, Any] | None = None,
        double_precision: bool = False,
    ) -> None:
        if not isinstance(double_precision, bool):
            raise TypeError(f"expected double_precision to be a bool, got {double_precision!r}")
        self._double_precision = double_precision
        try:
            import tensorboard  # noqa: F401  (first, so a missing package is reported as such)
            from tensorboard.compat.proto import (
                event_pb2,
                summary_pb2,
                tensor_pb2,
                tensor_shape_pb2,
                types_pb2,
            )
            from tensorboard.plugins.scalar import metadata as scalar_metadata
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as exc:
            raise ImportError(missing_package("tensorboard", "tensorboard", "tensorboard")) from exc
        self._event = event_pb2.Event
        self._summary = summary_pb2.Summary
        self._histogram = summary_pb2.HistogramProto
        self._tensor = tensor_pb2.TensorProto
        self._scalar_shape = tensor_shape_pb2.TensorShapeProto()
        self._double = types_pb2.DT_DOUBLE
        self._scalar_metadata = scalar_metadata.create_summary_metadata(
            display_name="", description=""
        )
        self._described: set[str] = set()  # tags whose plugin metadata this file already holds
        self._writer: Any = EventFileWriter(str(Path(run_dir)), flush_secs=flush_secs)
        self._closed = False
        if config is not None:
            self._write_hparams(flat_config(as_config(config)))

    def _write(self, step: int, values: list[Any]) -> None:
        summary = self._summary(value=values)
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def _write_hparams(self, hparams: Mapping[str, bool | int | float | str]) -> None:
        from tensorboard.plugins.hparams import metadata, plugin_data_pb2

        info = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
        for key, value in hparams.items():
            if isinstance(value, bool):
                info.hparams[key].bool_value = value
            elif isinstance(value, (int, float)):
                info.hparams[key].number_value = value
            else:
                info.hparams[key].string_value = value
        data = plugin_data_pb2.HParamsPluginData(session_start_info=info)
        tag = metadata.SESSION_START_INFO_TAG
        meta = metadata.create_summary_metadata(data)
        self._write(0, [self._summary.Value(tag=tag, metadata=meta)])
        self._writer.flush()

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """One event holding a scalar per key at ``step``; then flush."""
        if not self._double_precision:
            scalars = [self._summary.Value(tag=key, simple_value=v) for key, v in values.items()]
            self._write(step, scalars)
            self._writer.flush()
            return
        items = []
        for key, value in values.items():
            tensor = self._tensor(
                dtype=self._double, double_val=[value], tensor_shape=self._scalar_shape
            )
            item = self._summary.Value(tag=key, tensor=tensor)
            if key not in self._described:
                item.metadata.CopyFrom(self._scalar_metadata)
                self._described.add(key)
            items.append(item)
        self._write(step, items)
        self._writer.flush()

    def log_histograms(self, histograms: Mapping[str, Histogram], step: int) -> None:
        """One TensorBoard histogram per key at ``step`` (adjacent buckets merged past 512)."""
        items = [
            self._summary.Value(tag=key, histo=proto)
            for key, proto in histogram_rows(histograms, self._histogram_proto)
        ]
        if items:
            self._write(step, items)
            self._writer.flush()

    def _histogram_proto(self, hist: Histogram, edges: np.ndarray, counts: np.ndarray) -> Any:
        return self._histogram(
            min=float(edges[0]),
            max=float(edges[-1]),
            num=float(np.sum(counts)),
            sum=hist.sum,
            sum_squares=hist.sum_squares,
            bucket_limit=edges[1:].tolist(),
            bucket=counts.tolist(),
        )

    def close(self) -> None:
        """Flush and close the event file; calling it again does nothing."""
        if not self._closed:
            self._closed = True
            self._writer.close()
