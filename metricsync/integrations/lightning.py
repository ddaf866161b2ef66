"""PyTorch Lightning: one packed sync per step instead of one collective per logged key.

``self.log(name, value, sync_dist=True)`` in a ``LightningModule`` runs one
``all_reduce`` per key per step, and can only average, sum, min or max a
per-rank value. With :class:`MetricsyncCallback` the module records into a
:class:`metricsync.Metrics` instead (token means with masks, quantiles,
``last``, exact pooling across ranks), and the callback syncs it with one
``Metrics.sync()`` per logging step (a constant number of collectives however
many keys), then logs it to your :class:`metricsync.Tracker` or to the
trainer's loggers. :class:`MetricsyncLogger` is a Lightning ``Logger`` that
writes through metricsync's backends, for ``self.log`` values and the
callback's alike.

The callback finds the Metrics as ``pl_module.metrics`` (the attribute name
is ``attr``) unless you pass it; validation metrics, if any, as
``pl_module.val_metrics`` (``val_attr``), synced and logged at the end of each
validation epoch.

>>> import torch
>>> import metricsync as ms
>>> from lightning.pytorch import LightningModule
>>> class Regression(LightningModule):
...     def __init__(self):
...         super().__init__()
...         self.layer = torch.nn.Linear(4, 1)
...         self.metrics = ms.Metrics({"abs_err": ms.Spec(("mean", "p90"), fmt=".3f")})
...     def training_step(self, batch, batch_idx):
...         x, y = batch
...         err = self.layer(x).squeeze(-1) - y
...         self.metrics.record("abs_err", err.detach().abs())   # every element, no .item()
...         return (err**2).mean()
...     def configure_optimizers(self):
...         return torch.optim.SGD(self.parameters(), lr=0.1)
>>> callback = MetricsyncCallback(every_n_steps=1)
>>> trainer = Trainer(
...     max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
...     enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
... )
>>> data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8))
>>> trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=4))
>>> sorted(callback.last_values), callback.state_dict()
(['abs_err/mean', 'abs_err/p90'], {'last_step': 2})
"""

from __future__ import annotations

import warnings
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

import metricsync as ms

from ._common import missing_extra, scalars
from ._row import Row

try:
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.utilities import rank_zero_only
except ImportError:  # pragma: no cover - only the standalone pytorch_lightning, or none
    try:
        from pytorch_lightning import Callback, Trainer  # type: ignore[assignment]
        from pytorch_lightning.loggers import Logger  # type: ignore[assignment]
        from pytorch_lightning.utilities import rank_zero_only
    except ImportError as exc:
        raise ImportError(missing_extra("lightning", "lightning", "lightning")) from exc

__all__ = ["MetricsyncCallback", "MetricsyncLogger"]


class MetricsyncLogger(Logger):
    """A Lightning ``Logger`` writing through a :class:`metricsync.Tracker`.

    Args:
        tracker: the Tracker to write to (you close it); by default the logger
            makes one from ``backends``, ``run_dir`` and ``options`` on rank 0,
            at the first step it logs, and closes it when training ends.
        backends, run_dir, options: :class:`metricsync.Tracker` arguments.
        name, version: what Lightning shows as the experiment's name and version.

    Values logged with ``self.log`` arrive already reduced by Lightning, with
    the adaptive format; a Metrics synced by :class:`MetricsyncCallback`
    arrives whole, with its specs' formats, its keys in name order. What is
    logged at one step makes one row, written at ``save()`` (Lightning calls it
    after each of its logs, the callback once the trainer has logged the step)
    or when another step comes: the callback's keys and ``self.log``'s share
    one console line. ``log_hyperparams`` keeps the hyperparameters as
    ``hparams`` and passes them to the Tracker as ``config`` (the W&B backend
    takes it).

    >>> import tempfile
    >>> logger = MetricsyncLogger(backends="console", run_dir=tempfile.mkdtemp())
    >>> synced = ms.Metrics({"err": ms.Spec(("mean", "max"), fmt=".2f")})
    >>> synced.record("err", [0.5, 1.0])
    >>> logger.log_metrics(synced, step=5)                           # the callback's
    >>> logger.log_metrics({"train_loss": 0.25, "epoch": 0.0}, step=5)  # self.log's
    >>> logger.save()
    step 5 | err/mean     0.75  err/max     1.00  train_loss     0.25  epoch        0
    >>> logger.finalize("success")
    """

    def __init__(
        self,
        tracker: ms.Tracker | None = None,
        *,
        backends: Any = ("jsonl",),
        run_dir: str = "lightning_logs/metricsync",
        name: str = "metricsync",
        version: int | str | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self._tracker = tracker
        self._owns_tracker = tracker is None
        self._backends = backends
        self._run_dir = run_dir
        self._options = options
        self._name = name
        self._version = version if version is not None else 0
        self.hparams: dict[str, Any] = {}
        self._row: Row | None = None  # the step logged last, until save()
        self._row_step = 0

    @property
    def name(self) -> str:
        """The experiment name given at construction."""
        return self._name

    @property
    def version(self) -> int | str:
        """The experiment version given at construction (0 by default)."""
        return self._version

    @property
    def save_dir(self) -> str:
        """The Tracker's run directory."""
        return str(self.tracker.run_dir) if self._tracker is not None else self._run_dir

    @property
    def tracker(self) -> ms.Tracker:
        """The Tracker written to (made on first use when none was given)."""
        if self._tracker is None:
            options = dict(self._options)
            if self.hparams and "config" not in options:
                options["config"] = dict(self.hparams)  # where the Tracker's own config= goes
            self._tracker = ms.Tracker(self._backends, run_dir=self._run_dir, **options)
        return self._tracker

    @rank_zero_only
    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace, *args: Any, **kwargs: Any
    ) -> None:
        """Keep ``params`` as ``hparams`` (passed as ``config`` to a Tracker made later)."""
        self.hparams.update(vars(params) if isinstance(params, Namespace) else dict(params))

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        """Add a dict of numbers (or a Metrics) to the row of ``step`` (the step after the
        last one when None); the row is written at :meth:`save`, or first when another step,
        or a key the row holds already, comes."""
        if step is None:
            step = 0 if self._last_step is None else self._last_step + 1
        self._last_step = int(step)
        part = Row()
        part.add(metrics if isinstance(metrics, ms.Metrics) else scalars(metrics))
        if self._row is not None and (self._row_step != int(step) or self._row.shares_keys(part)):
            self.save()
        if self._row is None:
            self._row, self._row_step = part, int(step)
        else:
            self._row.extend(part)

    _last_step: int | None = None

    def save(self) -> None:
        """Write the row logged last, if not written yet."""
        row, self._row = self._row, None
        if row is not None and len(row):
            self.tracker.log(row, step=self._row_step)

    def finalize(self, status: str) -> None:
        """Write the last row; close the Tracker if this logger made it (a later stage,
        ``trainer.validate()`` after ``fit()``, makes a new one, which appends to the same
        run directory)."""
        self.save()
        if self._owns_tracker and self._tracker is not None:
            self._tracker.close()
            self._tracker = None


class MetricsyncCallback(Callback):
    """Sync a LightningModule's :class:`metricsync.Metrics` once per logging step, and log it.

    Args:
        metrics: the training Metrics; by default ``getattr(pl_module, attr)``.
        tracker: a :class:`metricsync.Tracker` to log to (you close it), at
            ``trainer.global_step``. Without one, the callback logs to the
            trainer's loggers (``trainer.loggers``) at the step Lightning logs
            ``self.log`` values at (one less); a :class:`MetricsyncLogger` among
            them gets the Metrics whole, with its formats.
        attr: the module attribute holding the training Metrics.
        val_metrics: validation Metrics; by default ``getattr(pl_module,
            val_attr, None)``. Synced and logged at the end of each validation
            epoch (not during the sanity check, whose samples are dropped).
        val_attr: the module attribute holding the validation Metrics.
        every_n_steps: sync and log every this many optimizer steps (by
            default the trainer's ``log_every_n_steps``). Samples recorded in
            between accumulate, so a logged value covers every step since the
            last one. What is left at the end of training is logged then.
        group: the process group (or 1-D DeviceMesh) to sync over; None is the
            default group, the one DDP trains on.
        timeout: seconds a sync may take before raising ``metricsync.SyncError``.

    Every rank reaches the same optimizer steps in DDP, so every rank syncs at
    the same steps; only rank 0's Tracker or loggers write. The keys come in
    name order (each metric's in its spec's order), on one rank as on many.
    After each sync the Metrics is reset; ``last_values`` holds what was
    logged last.

    >>> callback = MetricsyncCallback(metrics=ms.Metrics(), every_n_steps=10)
    >>> callback.every_n_steps, callback.last_values
    (10, {})
    """

    def __init__(
        self,
        metrics: ms.Metrics | None = None,
        tracker: ms.Tracker | None = None,
        *,
        attr: str = "metrics",
        val_metrics: ms.Metrics | None = None,
        val_attr: str = "val_metrics",
        every_n_steps: int | None = None,
        group: Any = None,
        timeout: float | None = None,
    ) -> None:
        for label, given in (("metrics", metrics), ("val_metrics", val_metrics)):
            if given is not None and not isinstance(given, ms.Metrics):
                raise TypeError(f"expected {label} to be a metricsync.Metrics, got {type(given)}")
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"expected every_n_steps to be a positive int, got {every_n_steps!r}")
        self.metrics = metrics
        self.tracker = tracker
        self.attr = attr
        self.val_metrics = val_metrics
        self.val_attr = val_attr
        self.every_n_steps = every_n_steps
        self.group = group
        self.timeout = timeout
        self.last_values: dict[str, float] = {}
        self._last_step = 0  # the optimizer step of the last sync (0: none yet)
        self._warned_no_output = False

    # ------------------------------------------------------------ finding the Metrics

    def _train_metrics(self, pl_module: Any) -> ms.Metrics:
        if self.metrics is not None:
            return self.metrics
        found = getattr(pl_module, self.attr, None)
        if not isinstance(found, ms.Metrics):
            raise AttributeError(
                f"MetricsyncCallback expected {type(pl_module).__name__}.{self.attr} to be a "
                f"metricsync.Metrics, got {type(found).__name__}; set it in __init__ or pass "
                "MetricsyncCallback(metrics=...)"
            )
        return found

    def _validation_metrics(self, pl_module: Any) -> ms.Metrics | None:
        if self.val_metrics is not None:
            return self.val_metrics
        found = getattr(pl_module, self.val_attr, None)
        return found if isinstance(found, ms.Metrics) else None

    # ------------------------------------------------------------ syncing and logging

    def sync(self, metrics: ms.Metrics) -> ms.Metrics:
        """Sync ``metrics`` over ``group`` (every rank must call it) and reset it; return the sync.

        >>> m = ms.Metrics({"n": ms.Spec("sum")})
        >>> m.record("n", 3)
        >>> MetricsyncCallback().sync(m).compute(), len(m)
        ({'n': 3.0}, 0)
        """
        try:
            return metrics.sync(self.group, timeout=self.timeout)
        finally:
            metrics.reset()

    def _publish(self, trainer: Any, synced: ms.Metrics, step: int) -> None:
        row = Row()  # name order, as a sync over several ranks computes it
        row.add(synced)
        self.last_values = row.compute()
        if self.tracker is not None:
            self.tracker.log(row, step=step)
            return
        loggers = list(getattr(trainer, "loggers", None) or ())
        step = _logger_step(trainer, step)  # beside what the module self.logs
        if not loggers:
            if not self._warned_no_output and trainer.is_global_zero:
                self._warned_no_output = True
                warnings.warn(
                    "metricsync: MetricsyncCallback has no tracker and the trainer no logger; "
                    "synced metrics are kept in callback.last_values only",
                    UserWarning,
                    stacklevel=2,
                )
            return
        for logger in loggers:
            if isinstance(logger, MetricsyncLogger):  # joined by self.log's keys of this step
                logger.log_metrics(synced, step=step)
            else:
                logger.log_metrics(dict(self.last_values), step=step)

    def _save_rows(self, trainer: Any) -> None:
        """Write the rows a MetricsyncLogger still holds: the trainer has logged their step."""
        for logger in getattr(trainer, "loggers", None) or ():
            if isinstance(logger, MetricsyncLogger):
                logger.save()

    def _flush(self, trainer: Any, pl_module: Any) -> None:
        step = int(trainer.global_step)
        self._last_step = step
        self._publish(trainer, self.sync(self._train_metrics(pl_module)), step)

    # ------------------------------------------------------------ Lightning hooks

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        """Check, before the first step, that the training Metrics can be found."""
        self._train_metrics(pl_module)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Write the row of the previous step, if the trainer logged nothing at it."""
        self._save_rows(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Sync and log when the optimizer has stepped to a multiple of ``every_n_steps``."""
        step = int(trainer.global_step)
        every = self.every_n_steps or int(getattr(trainer, "log_every_n_steps", 1) or 1)
        if step != self._last_step and step % every == 0:
            self._flush(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        """Log what the steps since the last sync recorded."""
        if int(trainer.global_step) != self._last_step:
            self._flush(trainer, pl_module)
        self._save_rows(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
        """Write the row of the epoch's last step."""
        self._save_rows(trainer)

    def on_validation_start(self, trainer: Trainer, pl_module: Any) -> None:
        """Write the row of the last training step before validation's."""
        self._save_rows(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: Any) -> None:
        """Write validation's row (the trainer has logged its own values of it)."""
        self._save_rows(trainer)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
        """Sync and log the validation Metrics (dropped during the sanity check)."""
        metrics = self._validation_metrics(pl_module)
        if metrics is None:
            return
        if trainer.sanity_checking:
            metrics.reset()
            return
        self._publish(trainer, self.sync(metrics), int(trainer.global_step))

    def state_dict(self) -> dict[str, Any]:
        """The step of the last sync, so a resumed run keeps its cadence."""
        return {"last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self._last_step = int(state_dict.get("last_step", 0))


def _logger_step(trainer: Any, step: int) -> int:
    """The step Lightning gives its loggers now: its count of batches that stepped the
    optimizers, at which it logs ``self.log`` values (``trainer.global_step`` counts this
    batch's step already); ``step`` where the trainer has no such count."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    stepped = getattr(loop, "_batches_that_stepped", None)
    return stepped if isinstance(stepped, int) else step
