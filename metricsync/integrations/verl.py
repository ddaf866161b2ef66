"""verl's ``Tracking`` interface, writing through metricsync's backends and formats.

verl's trainers build ``Tracking(project_name, experiment_name,
default_backend, config)``, call ``.log(data=metrics, step=step)`` once per
step and ``.finish(exit_code=...)`` at the end. :class:`Tracking` takes the
same arguments and keeps the same behaviour, so it can replace verl's class:
call :func:`install` before the trainer runs, or construct it yourself. It
imports verl only for verl's own backends.

- ``default_backend`` is a name or a list of names; every name verl 0.9.1
  accepts works. ``console``, ``tensorboard``, ``wandb``, ``mlflow``,
  ``swanlab`` and ``trackio`` (and ``tracking``, verl's deprecated alias of
  ``wandb``) go through metricsync's backends, as do metricsync's own names
  (``jsonl``, registered backends). verl's other backends (``file``,
  ``clearml``, ``vemlp_wandb``, ``rl_insight``: :data:`VERL_BACKENDS`) run
  verl's own code, which needs verl installed (a clear
  ``ModuleNotFoundError`` otherwise).
- ``project_name`` and ``experiment_name`` become the W&B project and run
  name, the MLflow experiment and run name; ``config`` goes to the backends
  that take a run configuration.
- TensorBoard writes where verl's does: ``$TENSORBOARD_DIR``, else
  ``tensorboard_log/<project>/<experiment>``; verl's ``file`` backend writes
  where verl's does (``$VERL_FILE_LOGGER_PATH``, else
  ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``). metricsync's file
  backends write under ``run_dir`` (default ``runs/<project>/<experiment>``).
- ``specs`` (metricsync specs by key or glob) give each logged key its
  format: ``{"timing_s/*": Spec(fmt=".3f"), "actor/lr": Spec(fmt=".2e")}``.
  Keys without one get the adaptive format, so a learning rate never prints
  as ``0.000``.
- ``log(data, step, backend=None)`` takes verl's dict (a
  :class:`metricsync.Metrics` works too); ``backend`` limits the step to some
  of the backends, as in verl. verl's own backends get the dict as it is
  (strings, lists and booleans included, as verl gives them); metricsync's
  get its numbers, booleans as 0 or 1, and skip the other values with one
  warning per key.
- ``finish(exit_code=0)`` closes every backend once; verl's own backends get
  the exit code. A Tracking left open is finished when the interpreter
  exits, before the backends' own exit hooks run, never from a finalizer
  during shutdown (where W&B's client hangs).

>>> import tempfile
>>> import metricsync as ms
>>> tracking = Tracking(
...     "gsm8k", "ppo-0.5b", ["console", "jsonl"], config={"trainer": {"total_epochs": 1}},
...     run_dir=tempfile.mkdtemp(), specs={"timing_s/*": ms.Spec(fmt=".3f")},
... )
>>> tracking.log({"actor/pg_loss": 0.0123, "timing_s/gen": 12.5, "actor/lr": 1e-6}, step=1)
step 1 | actor/pg_loss   0.0123  actor/lr 1.00e-06  timing_s/gen   12.500
>>> tracking.log({"actor/pg_loss": 0.02}, step=2, backend=["jsonl"])   # console skipped
>>> tracking.finish(exit_code=0)
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import metricsync as ms

from ._common import is_scalar

__all__ = ["BACKEND_NAMES", "VERL_BACKENDS", "Tracking", "install", "uninstall"]

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

VERL_BACKENDS: tuple[str, ...] = ("clearml", "file", "rl_insight", "vemlp_wandb")
"""verl 0.9.1's backends that metricsync does not implement: run by verl's own code."""


class Tracking:
    """A drop-in for verl's ``Tracking``: one backend per name, metricsync's or verl's.

    Args:
        project_name: verl's ``trainer.project_name``.
        experiment_name: verl's ``trainer.experiment_name``.
        default_backend: a backend name or a list of them (``trainer.logger``).
        config: the run configuration (verl passes its whole config as a dict).
        run_dir: where metricsync's file backends write;
            ``runs/<project>/<experiment>`` by default.
        specs: metricsync specs (by key or glob) whose ``fmt`` formats the keys logged.
        **options: more :class:`metricsync.Tracker` options (``console_keys``,
            ``mode`` for W&B, ``tracking_uri`` for MLflow, ...).

    Raises:
        ModuleNotFoundError: a backend's package (verl for :data:`VERL_BACKENDS`,
            or the package verl's backend imports) is not installed.
        ValueError: a name neither metricsync nor verl knows.

    Only rank 0 writes through metricsync's backends (each Tracker's rule).
    ``logger`` maps each backend name to its :class:`metricsync.Tracker`, or
    to verl's own logger object for :data:`VERL_BACKENDS`, as verl's
    ``logger`` maps names to its loggers.

    >>> import tempfile
    >>> with Tracking("p", "e", "jsonl", run_dir=tempfile.mkdtemp()) as tracking:
    ...     tracking.log({"critic/score/mean": 0.5}, step=1)
    ...     sorted(tracking.logger)
    ['jsonl']
    """

    supported_backend = sorted({*BACKEND_NAMES, *VERL_BACKENDS})

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
        self.logger: dict[str, Any] = {}
        self._verl: dict[str, Any] = {}  # name -> verl's own Tracking running that backend
        self._finished = False
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
        run_options: dict[str, Any] = {
            "project": project_name,
            "name": experiment_name,
            "experiment": project_name,  # MLflow's experiment is verl's project
        }
        if self.config is not None:
            run_options["config"] = self.config  # where the Tracker's own config= will go
        run_options.update(options)
        made: dict[str, Any] = {}
        try:
            for name in dict.fromkeys(names):
                if name in VERL_BACKENDS:
                    self._verl[name] = _verl_backend(name, project_name, experiment_name, config)
                    made[name] = self._verl[name].logger[name]
                    continue
                backend = BACKEND_NAMES.get(name, name)
                if any(self.logger_backend(other) == backend for other in made):
                    continue  # "tracking" and "wandb" together: one W&B run
                directory = self.run_dir
                if backend == "tensorboard":
                    directory = Path(
                        os.environ.get("TENSORBOARD_DIR")
                        or Path("tensorboard_log") / project_name / experiment_name
                    )
                made[name] = ms.Tracker((backend,), run_dir=directory, **run_options)
        except BaseException:
            self.logger = made
            try:  # noqa: SIM105 (the construction error is the one to raise)
                self.finish(exit_code=1)
            except Exception:
                pass
            raise
        self.logger = made
        # Finish at exit before the backends' own exit hooks (registered earlier) run.
        self._at_exit: Callable[[], None] = functools.partial(_finish_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    @staticmethod
    def logger_backend(name: str) -> str:
        """The metricsync backend a verl backend name maps to (verl's own: the name).

        >>> Tracking.logger_backend("tracking"), Tracking.logger_backend("jsonl")
        ('wandb', 'jsonl')
        """
        return BACKEND_NAMES.get(name, name)

    def _as_metrics(self, data: Mapping[str, Any]) -> ms.Metrics:
        """``data``'s numbers as a Metrics whose compute() gives them back, with their formats."""
        out = ms.Metrics()
        for key, value in data.items():
            flag = _flag(value)
            if flag is not None:
                value = flag
            elif not isinstance(key, str) or not is_scalar(value):
                if key not in self._skipped:
                    self._skipped.add(key)
                    warnings.warn(
                        f"metricsync: verl Tracking skips {key!r} on metricsync's backends: "
                        f"expected one number, got {type(value).__name__}",
                        UserWarning,
                        stacklevel=3,
                    )
                continue
            out.define(key, ms.Spec("last", fmt=self._formats.spec(key).fmt))
            out.record(key, value)
        return out

    def log(self, data: Any, step: int, backend: Iterable[str] | None = None) -> None:
        """Log ``data`` (verl's dict, or a Metrics) at ``step`` to each backend.

        ``backend`` (a collection of names) limits the step to those backends.
        verl's own backends get the dict as given; metricsync's its numbers.
        """
        chosen = [
            (name, logger)
            for name, logger in self.logger.items()
            if backend is None or name in backend
        ]
        if not chosen:
            return
        if not isinstance(data, (ms.Metrics, Mapping)):
            raise TypeError(f"expected a dict or a Metrics, got {type(data).__name__}")
        metrics: ms.Metrics | None = None
        for name, logger in chosen:
            if name in self._verl:
                logger.log(data=data.compute() if isinstance(data, ms.Metrics) else data, step=step)
                continue
            if metrics is None:
                metrics = data if isinstance(data, ms.Metrics) else self._as_metrics(data)
            logger.log(metrics, step=step)

    def finish(self, exit_code: int = 0) -> None:
        """Close every backend once (verl's own get ``exit_code``); calling it again does nothing.

        Every backend is closed even if one fails; the first failure is raised after.
        """
        if getattr(self, "_finished", True):
            return
        self._finished = True
        at_exit = getattr(self, "_at_exit", None)
        if at_exit is not None:
            atexit.unregister(at_exit)
        error: BaseException | None = None
        for name, logger in self.logger.items():
            try:
                if name in self._verl:
                    self._verl[name].finish(exit_code=exit_code)
                else:
                    logger.close()
            except Exception as exc:
                error = error or exc
        for name, verl_tracking in self._verl.items():  # made before a later backend failed
            if name not in self.logger:
                verl_tracking.finish(exit_code=exit_code)
        if error is not None:
            raise error

    close = finish

    def __enter__(self) -> Tracking:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # verl's Tracking finishes its runs when collected. During interpreter shutdown the
        # exit hook has done it, and the backends' clients may be gone: touch nothing.
        if _finalizing():
            return
        try:  # noqa: SIM105 (no module global here: contextlib may be gone at exit)
            self.finish()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"Tracking(project_name={self.project_name!r}, experiment_name="
            f"{self.experiment_name!r}, backends={list(self.logger)!r})"
        )


def _finish_at_exit(ref: weakref.ref[Tracking]) -> None:
    tracking = ref()
    if tracking is not None:
        tracking.finish()


def _flag(value: object) -> float | None:
    """A boolean (Python, numpy or a 0-d tensor) as 1.0 or 0.0; None for anything else."""
    if isinstance(value, bool):
        return float(value)
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    is_zero_d = dtype is not None and shape is not None and len(tuple(shape)) == 0
    if is_zero_d and str(dtype) in ("bool", "torch.bool"):
        return float(bool(value))
    return None


def _verl_backend(name: str, project_name: str, experiment_name: str, config: Any) -> Any:
    """verl's own ``Tracking`` running the one backend ``name`` (a :data:`VERL_BACKENDS` name)."""
    verl_class = _original.get("class")
    if verl_class is None:
        try:
            verl_class = importlib.import_module("verl.utils.tracking").Tracking
        except ImportError as exc:
            raise ModuleNotFoundError(
                f"metricsync.integrations.verl.Tracking: the {name!r} backend is verl's own "
                f"code, and verl cannot be imported ({exc}); install verl, or use metricsync's "
                f"backends ({', '.join(sorted(BACKEND_NAMES))})",
                name="verl",
            ) from exc
    try:
        return verl_class(project_name, experiment_name, [name], config)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"verl's {name!r} backend needs the {exc.name} package, which is not installed ({exc})",
            name=exc.name,
        ) from exc


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
