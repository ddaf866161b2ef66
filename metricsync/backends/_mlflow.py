"""The ``mlflow`` backend: one MLflow run, written through ``MlflowClient``.

Tracking URI: the ``tracking_uri`` option, else ``$MLFLOW_TRACKING_URI``,
else a SQLite store in the run directory, ``sqlite:///<abs run_dir>/mlflow.db``
(MLflow 3 refuses new ``file:`` stores unless ``MLFLOW_ALLOW_FILE_STORE=true``;
a ``file:`` URI still works when that variable is set). The run goes into the
experiment ``experiment`` (default ``"metricsync"``, created if missing) and is
named ``name``. The client API is used instead of ``mlflow.start_run``, so the
process's global active run is left alone. ``config`` becomes the run's
params (nested keys joined with ``/``, values as text cut at 6000
characters, MLflow's limit).

MLflow accepts metric names of letters, digits, ``_ - . : /`` and spaces, and
rejects names that are not normalized paths; :func:`mlflow_key` replaces any
other character with ``_`` and drops empty, ``.`` and ``..`` path segments
(``"acc@1"`` is logged as ``"acc_1"``). A name longer than MLflow's 250
characters is cut and ends in ``_`` and 8 hex digits of the key's hash; so does
a name another key of the run already took (``"acc#1"`` beside ``"acc@1"``),
with a warning, so no two keys share a metric and no key fails the step.

>>> mlflow_key("actor/acc@1"), mlflow_key("/a//b/"), mlflow_key("x/../y")
('actor/acc_1', 'a/b', 'x/__/y')
>>> len(mlflow_key("x" * 300))
250
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._config import as_config, flat_config
from ._protocol import missing_package

__all__ = ["MlflowBackend", "mlflow_key"]

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")
_BATCH = 1000  # MLflow's limit of metrics per log_batch call
_PARAM_BATCH = 100  # ... and of params per call
_PARAM_LENGTH = 6000  # the longest param value MLflow stores
_KEY_LENGTH = 250  # the longest metric name MLflow stores


def mlflow_key(key: str) -> str:
    """The MLflow metric name for ``key`` (see the module docstring).

    >>> mlflow_key("eval/acc top-1"), mlflow_key("loss (ema)")
    ('eval/acc top-1', 'loss _ema_')
    """
    parts = [p for p in _BAD_CHARS.sub("_", key).split("/") if p not in ("", ".")]
    name = "/".join(p.replace(".", "_") if p == ".." else p for p in parts) or "_"
    return name if len(name) <= _KEY_LENGTH else _tagged(name, key)


def _tagged(name: str, key: str) -> str:
    """``name`` cut to fit, ending in ``_`` and 8 hex digits of ``key``'s hash."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return name[: _KEY_LENGTH - 9].rstrip("/") + "_" + digest


class MlflowBackend:
    """Log every step to a new MLflow run (raises ``ImportError`` naming ``metricsync[mlflow]``).

    >>> import tempfile
    >>> from mlflow.tracking import MlflowClient
    >>> uri = "sqlite:///" + tempfile.mkdtemp() + "/mlflow.db"
    >>> backend = MlflowBackend("unused", tracking_uri=uri, name="demo")
    >>> backend.log({"loss": 0.5, "acc@1": 0.25}, 1, {})
    >>> backend.close()
    >>> client = MlflowClient(backend.tracking_uri)
    >>> [(m.step, m.value) for m in client.get_metric_history(backend.run_id, "acc_1")]
    [(1, 0.25)]
    >>> backend = MlflowBackend("unused", tracking_uri=uri, config={"optim": {"lr": 3e-4}})
    >>> backend.close()
    >>> client.get_run(backend.run_id).data.params
    {'optim/lr': '0.0003'}
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        tracking_uri: str | None = None,
        experiment: str = "metricsync",
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ImportError(missing_package("mlflow", "mlflow", "mlflow")) from exc
        if tracking_uri is None:
            tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            directory = Path(run_dir).resolve()
            directory.mkdir(parents=True, exist_ok=True)
            tracking_uri = f"sqlite:///{directory / 'mlflow.db'}"
        self.tracking_uri = tracking_uri
        self._metric = Metric
        self._client: Any = MlflowClient(tracking_uri=tracking_uri)
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else self._client.create_experiment(experiment)
        )
        run = self._client.create_run(experiment_id, run_name=name, tags=dict(tags or {}))
        self.run_id: str = run.info.run_id
        self._keys: dict[str, str] = {}
        self._taken: set[str] = set()  # the names of self._keys
        self._closed = False
        if config is not None:
            params = [
                Param(mlflow_key(key), str(value)[:_PARAM_LENGTH])
                for key, value in flat_config(as_config(config)).items()
            ]
            try:
                for start in range(0, len(params), _PARAM_BATCH):
                    batch = params[start : start + _PARAM_BATCH]
                    self._client.log_batch(self.run_id, params=batch)
            except BaseException:
                self._closed = True
                self._client.set_terminated(self.run_id, status="FAILED")
                raise

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """One ``log_batch`` call (per 1000 metrics) for the whole step."""
        now = int(time.time() * 1000)
        metrics = []
        for key, value in values.items():
            name = self._keys.get(key)
            if name is None:
                name = self._keys[key] = self._name_for(key)
            metrics.append(self._metric(name, value, now, step))
        for start in range(0, len(metrics), _BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[start : start + _BATCH])

    def _name_for(self, key: str) -> str:
        name = mlflow_key(key)
        if name in self._taken:  # another key of this run is logged under it
            renamed = _tagged(name, key)
            warnings.warn(
                f"metricsync: MLflow metric {key!r} is logged as {renamed!r}: "
                f"{name!r} is another key's name in this run",
                UserWarning,
                stacklevel=3,
            )
            name = renamed
        self._taken.add(name)
        return name

    def close(self) -> None:
        """Mark the run finished; calling it again does nothing."""
        if not self._closed:
            self._closed = True
            self._client.set_terminated(self.run_id)
