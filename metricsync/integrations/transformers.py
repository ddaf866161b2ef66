"""Hugging Face ``transformers`` and TRL trainers: a ``TrainerCallback`` that logs through metricsync.

:class:`MetricsyncCallback` owns a :class:`metricsync.Metrics`. Between two
logging steps your code records into ``callback.metrics`` (from
``compute_loss``, a reward function, another callback); when the trainer
logs, the callback records the trainer's own numbers (``loss``,
``learning_rate``, ``grad_norm``, a TRL trainer's ``rewards/...``,
``entropy`` ...) into the same Metrics, syncs it once over the trainer's
process group (``Metrics.sync()``: a constant number of collectives, however
many keys), resets it, and hands the result to your :class:`metricsync.Tracker`
and/or back to the trainer's own reporting (``report_to``, the console).

Every rank must log at the same steps, as the Trainer does: its ``log`` runs
on every process. Only rank 0's Tracker writes.

>>> import tempfile
>>> import metricsync as ms
>>> from transformers import TrainerControl, TrainerState
>>> tracker = ms.Tracker("console", run_dir=tempfile.mkdtemp())
>>> callback = MetricsyncCallback(
...     ms.Metrics({"reward": ms.Spec(("mean", "max"), fmt=".2f")}), tracker=tracker
... )
>>> callback.metrics.record("reward", [1.0, 0.0, 0.5])   # what your code records
>>> logs = {"loss": 0.6931, "learning_rate": 1e-5}       # what the trainer logs
>>> _ = callback.on_log(None, TrainerState(global_step=10), TrainerControl(), logs=logs)
step 10 | loss   0.6931  learning_rate 1.00e-05  reward/mean     0.50  reward/max     1.00
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Any

import metricsync as ms

from ._common import missing_extra, scalars
from ._row import Row

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
except ImportError as exc:  # pragma: no cover - exercised by a test with the package hidden
    raise ImportError(missing_extra("transformers", "transformers", "transformers")) from exc

__all__ = ["TRAINER_SPEC", "MetricsyncCallback"]

TRAINER_SPEC = ms.Spec("last", across="first")
"""The spec of a number the trainer logs that you gave no spec of your own.

The trainer has reduced most of them (its ``loss`` is a mean over every rank),
and ``last`` keeps such a value exactly (a mean over ranks could round it in
the last digit). Some differ by rank (``eval_runtime``, ``train_samples_per_second``,
each rank's own clock): ``across="first"`` logs rank 0's, as the trainer reports.
"""

_DEFAULT_SPEC = ms.Spec()


class _ProgressBarOnly(ProgressCallback):
    """The trainer's progress bar without its printout of ``logs`` (metricsync's console prints)."""

    def on_log(self, *args: Any, **kwargs: Any) -> None:
        return None


class _SilentPrinter(PrinterCallback):
    """The trainer's printer, less the print: it still drops ``total_flos`` from ``logs``."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs is not None:
            logs.pop("total_flos", None)


class MetricsyncCallback(TrainerCallback):
    """Route what the trainer logs, and what you record, through one sync and a Tracker.

    Args:
        metrics: the :class:`metricsync.Metrics` to record into (its specs give
            reductions and formats); a new empty one when None. Read it back as
            ``callback.metrics``.
        tracker: a :class:`metricsync.Tracker` to log every synced step to (at
            ``state.global_step``). You own it: close it, or use it as a
            context manager around ``trainer.train()``.
        group: the process group (or 1-D DeviceMesh) to sync over; None is the
            default group, the one the Trainer trains on.
        timeout: seconds the sync may take before raising ``metricsync.SyncError``.
        update_logs: write the synced values back into the trainer's ``logs``
            dict, so its ``report_to`` integrations and console report them too.
            By default, only when no ``tracker`` is given. Reporting integrations
            run before callbacks passed with ``callbacks=``: use
            :meth:`attach` to put this callback ahead of them.
        trainer_spec: the spec given to a number the trainer logs that
            ``metrics`` has no spec for (:data:`TRAINER_SPEC`: the value as logged).

    Numbers the trainer logs keep their names; strings and other non-numbers
    stay in ``logs`` untouched. After each sync ``metrics`` is reset, so each
    logged value covers the samples recorded since the previous log, and
    ``callback.last_values`` holds what was logged.

    >>> callback = MetricsyncCallback()
    >>> callback.metrics.record("tokens", 512)
    >>> logs = {"loss": 2.5, "epoch": 0.5}
    >>> _ = callback.on_log(None, TrainerState(global_step=3), TrainerControl(), logs=logs)
    >>> logs
    {'loss': 2.5, 'epoch': 0.5, 'tokens': 512.0}
    >>> len(callback.metrics)
    0
    """

    def __init__(
        self,
        metrics: ms.Metrics | None = None,
        tracker: ms.Tracker | None = None,
        *,
        group: Any = None,
        timeout: float | None = None,
        update_logs: bool | None = None,
        trainer_spec: ms.Spec = TRAINER_SPEC,
    ) -> None:
        if metrics is not None and not isinstance(metrics, ms.Metrics):
            raise TypeError(f"expected metrics to be a metricsync.Metrics, got {type(metrics)}")
        if not isinstance(trainer_spec, ms.Spec):
            raise TypeError(f"expected trainer_spec to be a metricsync.Spec, got {trainer_spec!r}")
        self.metrics = metrics if metrics is not None else ms.Metrics()
        self.tracker = tracker
        self.group = group
        self.timeout = timeout
        self.update_logs = tracker is None if update_logs is None else bool(update_logs)
        self.trainer_spec = trainer_spec
        self.last_values: dict[str, float] = {}
        self._attached = False
        self._warned_console = False

    def attach(self, trainer: Any) -> MetricsyncCallback:
        """Add this callback to ``trainer`` ahead of its other callbacks; return it.

        A callback passed with ``Trainer(callbacks=[...])`` runs after the
        ``report_to`` integrations, which then never see what it adds to
        ``logs``; attached this way, they do.

        >>> class FakeHandler:
        ...     callbacks = ["DefaultFlowCallback", "TensorBoardCallback"]
        >>> class FakeTrainer:
        ...     callback_handler = FakeHandler()
        >>> trainer = FakeTrainer()
        >>> callback = MetricsyncCallback().attach(trainer)
        >>> trainer.callback_handler.callbacks[0] is callback
        True
        """
        callbacks = trainer.callback_handler.callbacks
        if any(cb is self for cb in callbacks):
            callbacks.remove(self)
        callbacks.insert(0, self)
        if self._prints_to_console():  # one console line per log: metricsync's
            for i, cb in reversed(list(enumerate(callbacks))):
                if type(cb) is PrinterCallback:
                    callbacks[i] = _SilentPrinter()
                elif type(cb) is ProgressCallback:
                    callbacks[i] = _ProgressBarOnly(max_str_len=cb.max_str_len)
        self._attached = True
        return self

    def _prints_to_console(self) -> bool:
        labels = () if self.tracker is None else self.tracker.backends
        return any(label in ("console", "ConsoleBackend") for label in labels)

    def _record_trainer_logs(self, numbers: Mapping[str, Any]) -> None:
        for key, value in numbers.items():
            # A name you declared keeps your spec; a glob-like key is left to the globs.
            if (
                key not in self.metrics
                and self.metrics.spec(key) == _DEFAULT_SPEC
                and not any(ch in key for ch in "*?[")
            ):
                with contextlib.suppress(ms.SpecMismatchError):  # declared as Spec() itself
                    self.metrics.define(key, self.trainer_spec)
            self.metrics.record(key, value)

    def sync(self, logs: Mapping[str, Any] | None = None) -> ms.Metrics:
        """Record the numbers of ``logs``, sync over ``group``, reset ``metrics``; return the sync.

        Every rank of the group must call it (``on_log`` does, at every log).

        >>> callback = MetricsyncCallback()
        >>> callback.metrics.record("x", [1.0, 3.0])
        >>> callback.sync({"loss": 0.5}).compute()
        {'loss': 0.5, 'x': 2.0}
        """
        self._record_trainer_logs(scalars(logs or {}))
        try:
            return self.metrics.sync(self.group, timeout=self.timeout)
        finally:
            self.metrics.reset()

    def on_log(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Sync what was recorded and logged, and log it at ``state.global_step``."""
        if logs is None:
            logs = {}
        numbers = scalars(logs)
        row = Row()  # the trainer's keys first, then the synced ones in name order
        row.add(self.sync(numbers), first=numbers)
        values = row.compute()
        self.last_values = values
        if self.tracker is not None:
            if self._prints_to_console() and not self._attached and not self._warned_console:
                self._warned_console = True
                warnings.warn(
                    "the trainer prints its logs too: call callback.attach(trainer) so that "
                    "each log is printed once, by metricsync's console",
                    stacklevel=2,
                )
            self.tracker.log(row, step=int(state.global_step))
        if self.update_logs:
            for key, value in values.items():
                if key not in numbers or numbers[key] != value:
                    logs[key] = value
