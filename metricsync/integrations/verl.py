"""verl's ``Tracking`` interface, writing through metricsync's backends and formats.

verl's trainers build ``Tracking(project_name, experiment_name,
default_backend, config)`` and call ``.log(data=metrics, step=step)`` once per
step. :class:`Tracking` takes the same arguments and keeps the same
behaviour, so it can replace verl's class: call :func:`install` before the
trainer runs, or construct it yourself. It does not import verl.

- ``default_backend`` is a name or a list of names. verl's names map to
  metricsync's backends: ``console``, ``tensorboard``, ``wandb``, ``mlflow``
  (and ``tracking``, verl's deprecated alias of ``wandb``); metricsync's own
  names (``jsonl``) work too, and so does any name the Tracker accepts
  (``swanlab``, ``trackio`` where metricsync has them).
- ``project_name`` and ``experiment_name`` become the W&B project and run
  name, the MLflow experiment and run name; ``config`` goes to the backends
  that take a run configuration (W&B today).
- TensorBoard writes where verl's does: ``$TENSORBOARD_DIR``, else
  ``tensorboard_log/<project>/<experiment>``. The other file backends write
  under ``run_dir`` (default ``runs/<project>/<experiment>``).
- ``specs`` (metricsync specs by key or glob) give each logged key its
  format: ``{"timing_s/*": Spec(fmt=".3f"), "actor/lr": Spec(fmt=".2e")}``.
  Keys without one get the adaptive format, so a learning rate never prints
  as ``0.000``.
- ``log(data, step, backend=None)`` takes verl's dict of numbers (a
  :class:`metricsync.Metrics` works too); ``backend`` limits the step to some
  of the backends, as in verl. Values that are not one number (tables,
  strings) are skipped with one warning per key.

>>> import tempfile
>>> import metricsync as ms
>>> tracking = Tracking(
...     "gsm8k", "ppo-0.5b", ["console", "jsonl"], config={"trainer": {"total_epochs": 1}},
...     run_dir=tempfile.mkdtemp(), specs={"timing_s/*": ms.Spec(fmt=".3f")},
... )
>>> tracking.log({"actor/pg_loss": 0.0123, "timing_s/gen": 12.5, "actor/lr": 1e-6}, step=1)
step 1 | actor/pg_loss   0.0123  actor/lr 1.00e-06  timing_s/gen   12.500
>>> tracking.log({"actor/pg_loss": 0.02}, step=2, backend=["jsonl"])   # console skipped
>>> tracking.finish()
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import metricsync as ms

from ._common import is_scalar

__all__ = ["BACKEND_NAMES", "Tracking", "install", "uninstall"]

BACKEND_NAMES: dict[str, str] = {
    "console": "console",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "tracking": "wandb",
    "mlflow": "mlflow",
    "swanlab": "swanlab",
    "trackio": "trackio",
    "jsonl": "jsonl",
}
"""verl's backend names and the metricsync backend each maps to; other names pass through."""


class Tracking:
    """A drop-in for verl's ``Tracking``: one metricsync Tracker per backend name.

    Args:
        project_name: verl's ``trainer.project_name``.
        experiment_name: verl's ``trainer.experiment_name``.
        default_backend: a backend name or a list of them (``trainer.logger``).
        config: the run configuration (verl passes its whole config as a dict).
        run_dir: where file backends write; ``runs/<project>/<experiment>`` by default.
        specs: metricsync specs (by key or glob) whose ``fmt`` formats the keys logged.
        **options: more :class:`metricsync.Tracker` options (``console_keys``,
            ``mode`` for W&B, ``tracking_uri`` for MLflow, ...).

    Only rank 0 writes (each Tracker's rule). ``logger`` maps each verl backend
    name to its :class:`metricsync.Tracker`, as verl's ``logger`` maps names
    to its loggers.

    >>> import tempfile
    >>> with Tracking("p", "e", "jsonl", run_dir=tempfile.mkdtemp()) as tracking:
    ...     tracking.log({"critic/score/mean": 0.5}, step=1)
    ...     sorted(tracking.logger)
    ['jsonl']
    """

    supported_backend = sorted(BACKEND_NAMES)

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | Iterable[str] = "console",
        config: Mapping[str, Any] | None = None,
        *,
        run_dir: str | os.PathLike[str] | None = None,
        specs: Mapping[str, ms.Spec] | None = None,
        **options: Any,
    ) -> None:
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"expected backend names (str), got {name!r}")
            if name == "tracking":
                warnings.warn(
                    "the `tracking` logger is deprecated in verl; use `wandb` instead",
                    DeprecationWarning,
                    stacklevel=2,
                )
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.config = dict(config) if config is not None else None
        self.run_dir = (
            Path(run_dir) if run_dir is not None else Path("runs") / project_name / experiment_name
        )
        self._formats = ms.Metrics(dict(specs or {}))  # resolves a key's spec, holds nothing
        self._skipped: set[str] = set()
        self.logger: dict[str, ms.Tracker] = {}
        run_options: dict[str, Any] = {
            "project": project_name,
            "name": experiment_name,
            "experiment": project_name,  # MLflow's experiment is verl's project
        }
        if self.config is not None:
            run_options["config"] = self.config  # where the Tracker's own config= will go
        run_options.update(options)
        try:
            for name in dict.fromkeys(names):
                backend = BACKEND_NAMES.get(name, name)
                if any(self.logger_backend(other) == backend for other in self.logger):
                    continue  # "tracking" and "wandb" together: one W&B run
                directory = self.run_dir
                if backend == "tensorboard":
                    directory = Path(
                        os.environ.get("TENSORBOARD_DIR")
                        or Path("tensorboard_log") / project_name / experiment_name
                    )
                self.logger[name] = ms.Tracker((backend,), run_dir=directory, **run_options)
        except BaseException:
            self.finish()
            raise

    @staticmethod
    def logger_backend(name: str) -> str:
        """The metricsync backend a verl backend name maps to.

        >>> Tracking.logger_backend("tracking"), Tracking.logger_backend("jsonl")
        ('wandb', 'jsonl')
        """
        return BACKEND_NAMES.get(name, name)

    def _as_metrics(self, data: Mapping[str, Any]) -> ms.Metrics:
        """``data``'s numbers as a Metrics whose compute() gives them back, with their formats."""
        out = ms.Metrics()
        for key, value in data.items():
            if not isinstance(key, str) or not is_scalar(value):
                if key not in self._skipped:
                    self._skipped.add(key)
                    warnings.warn(
                        f"metricsync: verl Tracking skips {key!r}: expected one number, got "
                        f"{type(value).__name__}",
                        UserWarning,
                        stacklevel=3,
                    )
                continue
            out.define(key, ms.Spec("last", fmt=self._formats.spec(key).fmt))
            out.record(key, value)
        return out

    def log(self, data: Any, step: int, backend: Iterable[str] | None = None) -> None:
        """Log ``data`` (a dict of numbers or a Metrics) at ``step`` to each backend.

        ``backend`` (a collection of names) limits the step to those backends.
        """
        chosen = [
            (name, tracker)
            for name, tracker in self.logger.items()
            if backend is None or name in backend
        ]
        if not chosen:
            return
        if isinstance(data, ms.Metrics):
            metrics = data
        elif isinstance(data, Mapping):
            metrics = self._as_metrics(data)
        else:
            raise TypeError(f"expected a dict of numbers or a Metrics, got {type(data).__name__}")
        for _, tracker in chosen:
            tracker.log(metrics, step=step)

    def finish(self) -> None:
        """Close every backend; calling it again does nothing."""
        for tracker in self.logger.values():
            tracker.close()

    close = finish

    def __enter__(self) -> Tracking:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish()

    def __del__(self) -> None:  # verl's Tracking finishes its runs when collected
        with contextlib.suppress(Exception):
            self.finish()

    def __repr__(self) -> str:
        return (
            f"Tracking(project_name={self.project_name!r}, experiment_name="
            f"{self.experiment_name!r}, backends={list(self.logger)!r})"
        )


_original: dict[str, Any] = {}


def install() -> type[Tracking]:
    """Make verl's trainers log through :class:`Tracking`; return it.

    Replaces ``verl.utils.tracking.Tracking``, and the name in every verl
    module already imported that took it with ``from verl.utils.tracking
    import Tracking``. Call it before the trainer is constructed (in verl's
    Ray driver process). :func:`uninstall` puts verl's class back.

    >>> import sys, types
    >>> fake = types.ModuleType("verl.utils.tracking")
    >>> fake.Tracking = type("Tracking", (), {})
    >>> sys.modules["verl.utils.tracking"] = fake
    >>> install() is fake.Tracking is Tracking
    True
    >>> uninstall(); fake.Tracking is Tracking
    False
    >>> del sys.modules["verl.utils.tracking"]
    """
    module: Any = sys.modules.get("verl.utils.tracking")
    if module is None:
        try:
            import verl.utils.tracking
        except ImportError as exc:
            raise ImportError(
                "metricsync.integrations.verl.install() needs verl installed"
            ) from exc
        module = verl.utils.tracking
    original = getattr(module, "Tracking", None)
    if original is Tracking:
        return Tracking
    _original.clear()
    _original["class"] = original
    for name, loaded in list(sys.modules.items()):
        in_verl = name == "verl" or name.startswith("verl.")
        if in_verl and loaded is not None and getattr(loaded, "Tracking", None) is original:
            setattr(loaded, "Tracking", Tracking)  # noqa: B010
            _original.setdefault("modules", []).append(name)
    module.Tracking = Tracking
    return Tracking


def uninstall() -> None:
    """Put back the ``Tracking`` that :func:`install` replaced (no-op if it did not run)."""
    original = _original.pop("class", None)
    for name in _original.pop("modules", []):
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "Tracking", None) is Tracking:
            setattr(loaded, "Tracking", original)  # noqa: B010
