"""Hugging Face ``accelerate``: a ``GeneralTracker`` for ``Accelerator(log_with=...)``.

:class:`MetricsyncTracker` writes what ``accelerator.log(...)`` receives
through a :class:`metricsync.Tracker` (console, JSONL, TensorBoard, W&B,
MLflow ...). Pass an instance, ``Accelerator(log_with=MetricsyncTracker(...))``,
or :func:`register` the class and name it: ``Accelerator(log_with="metricsync")``,
with its arguments in ``init_trackers(..., init_kwargs={"metricsync": {...}})``.

``accelerator.log`` takes a dict of numbers; this tracker also takes a synced
:class:`metricsync.Metrics`, whose specs give each key its format:
``accelerator.log(metrics.sync(), step=step)`` (when it is the only tracker;
other trackers want a dict: ``metrics.sync().compute()``).

>>> import tempfile
>>> tracker = MetricsyncTracker("demo", backends="console", run_dir=tempfile.mkdtemp())
>>> tracker.start()
>>> tracker.store_init_configuration({"lr": 3e-4, "batch_size": 32})
>>> tracker.log({"loss": 0.6931, "lr": 3e-4}, step=1)
step 1 | loss   0.6931  lr 3.00e-04
>>> tracker.finish()
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import metricsync as ms

from ._common import missing_extra, scalars
from ._row import Row

try:
    from accelerate.tracking import GeneralTracker
except ImportError as exc:  # pragma: no cover - exercised by a test with the package hidden
    raise ImportError(missing_extra("accelerate", "accelerate", "accelerate")) from exc

__all__ = ["MetricsyncTracker", "register"]


class MetricsyncTracker(GeneralTracker):
    """An accelerate tracker that logs through a :class:`metricsync.Tracker`.

    Args:
        run_name: the project name (accelerate passes ``init_trackers``'s
            ``project_name`` here when it builds the tracker by name).
        tracker: a Tracker to write to (you close it). By default one is made
            from ``backends``, ``run_dir`` and ``options`` when first needed,
            and ``finish()`` (``accelerator.end_training()``) closes it.
        backends: :class:`metricsync.Tracker` backends (``"jsonl"`` by default).
        run_dir: the Tracker's run directory; ``runs/<run_name>`` by default.
        **options: more Tracker options (``console_keys``, ``project`` ...).

    accelerate calls ``log``, ``store_init_configuration`` and ``finish`` on
    the main process only. The configuration is kept as ``config`` and passed
    to a Tracker made after it as ``config`` (the W&B backend takes it). A
    step of None continues from the last step logged. Values that are not one
    number (accelerate allows strings) are skipped with one warning per key.
    A dict's keys are logged in its order; a Metrics' in name order (each
    metric's keys in its spec's order), on one process as on many.

    >>> MetricsyncTracker(run_dir="unused").name
    'metricsync'
    """

    name = "metricsync"
    requires_logging_directory = False
    main_process_only = True

    def __init__(
        self,
        run_name: str = "metricsync",
        *,
        tracker: ms.Tracker | None = None,
        backends: Any = ("jsonl",),
        run_dir: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self.run_dir = Path(run_dir) if run_dir is not None else Path("runs") / run_name
        self.config: dict[str, Any] | None = None
        self._tracker = tracker
        self._owns_tracker = tracker is None
        self._backends = backends
        self._options = options
        self._next_step = 0
        self._skipped: set[str] = set()

    @property
    def tracker(self) -> ms.Tracker:
        """The :class:`metricsync.Tracker` written to (made on first use when none was given)."""
        if self._tracker is None:
            options = dict(self._options)
            if self.config is not None and "config" not in options:
                options["config"] = self.config  # where the Tracker's own config= goes
            self._tracker = ms.Tracker(self._backends, run_dir=self.run_dir, **options)
        return self._tracker

    def start(self) -> None:
        """Nothing to do yet: the Tracker is made at the first log, after the configuration."""

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Keep the run's hyperparameters as ``config``."""
        self.config = dict(values)

    def log(self, values: Any, step: int | None = None, **kwargs: Any) -> None:
        """Log a dict of numbers (or a Metrics) at ``step``."""
        if step is None:
            step = self._next_step
        self._next_step = int(step) + 1
        if isinstance(values, ms.Metrics):
            row = Row()  # name order, as a sync over several processes computes it
            row.add(values)
            self.tracker.log(row, step=int(step))
            return
        if not isinstance(values, Mapping):
            raise TypeError(f"expected a dict of numbers or a Metrics, got {type(values).__name__}")
        numbers = scalars(values)
        for key in values:
            if key not in numbers and key not in self._skipped:
                self._skipped.add(key)
                warnings.warn(
                    f"metricsync: accelerate tracker skips {key!r}: expected one number, got "
                    f"{type(values[key]).__name__}",
                    UserWarning,
                    stacklevel=2,
                )
        self.tracker.log(numbers, step=int(step))

    def finish(self) -> None:
        """Close the Tracker if this object made it."""
        if self._owns_tracker and self._tracker is not None:
            self._tracker.close()


def register() -> type[MetricsyncTracker]:
    """Register :class:`MetricsyncTracker` so ``Accelerator(log_with="metricsync")`` finds it.

    Needs an accelerate with ``register_tracker_class`` (else ``ImportError``);
    with an older one, pass an instance to ``log_with`` instead. Registering
    again does nothing.

    >>> register().name
    'metricsync'
    """
    import accelerate.tracking

    register_tracker_class = getattr(accelerate.tracking, "register_tracker_class", None)
    if register_tracker_class is None:
        raise ImportError(
            "this accelerate cannot register trackers by name; pass "
            "Accelerator(log_with=MetricsyncTracker(...)) instead"
        )
    known = getattr(accelerate.tracking, "LOGGER_TYPE_TO_CLASS", {})
    if known.get(MetricsyncTracker.name) is not MetricsyncTracker:  # again: no warning
        register_tracker_class(MetricsyncTracker)
    return MetricsyncTracker
