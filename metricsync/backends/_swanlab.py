"""The ``swanlab`` backend: a SwanLab run.

``swanlab.init`` gets ``log_dir=run_dir/swanlog`` unless ``$SWANLAB_LOG_DIR``
(or the older ``$SWANLAB_LOGDIR``) is set, in which case SwanLab's own
setting stands. The mode comes from the ``mode`` option or, failing that,
SwanLab's own ``SWANLAB_MODE``: ``offline`` writes the run under the log
directory without touching the network (``swanlab sync`` uploads it later),
``local`` keeps it for the local dashboard, ``disabled`` writes nothing.
``project``, ``name`` (the experiment name), ``workspace``, ``group``,
``tags`` and ``config`` (the run's hyperparameters) are passed through when
given. Each step is one ``run.log(values, step=step)``.

SwanLab holds one run per process. When one is already active (the user
called ``swanlab.init`` with settings of their own, say, or set them with
``swanlab.merge_settings``), the backend logs into it, adds ``config`` to its
config, and leaves it open at ``close()``; otherwise ``close()`` finishes the
run it started.

>>> import tempfile
>>> backend = SwanLabBackend(tempfile.mkdtemp(), mode="disabled")
>>> backend.log({"loss": 0.5}, 1, {})
>>> backend.close()
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._config import as_config
from ._protocol import missing_package

__all__ = ["SwanLabBackend"]

_LOG_DIR_VARIABLES = ("SWANLAB_LOG_DIR", "SWANLAB_LOGDIR")


class SwanLabBackend:
    """Log every step to a SwanLab run (raises ``ImportError`` naming ``metricsync[swanlab]``).

    >>> import tempfile
    >>> SwanLabBackend(tempfile.mkdtemp(), mode="disabled", project="demo").close()
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        project: str | None = None,
        name: str | None = None,
        mode: str | None = None,
        workspace: str | None = None,
        group: str | None = None,
        tags: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import swanlab
        except ImportError as exc:
            raise ImportError(missing_package("swanlab", "swanlab", "swanlab")) from exc
        hyper = as_config(config) if config is not None else None
        self._closed = False
        self._owned = not swanlab.has_run()
        if not self._owned:
            self._run: Any = swanlab.get_run()
            if hyper:
                self._run.config.update(hyper)
            return
        given: dict[str, Any] = {
            "project": project,
            "name": name,
            "mode": mode,
            "workspace": workspace,
            "group": group,
            "tags": list(tags) if tags is not None else None,
            "config": hyper,
        }
        if not any(os.environ.get(variable) for variable in _LOG_DIR_VARIABLES):
            directory = Path(run_dir) / "swanlog"
            directory.mkdir(parents=True, exist_ok=True)
            given["log_dir"] = str(directory)
        self._run = swanlab.init(**{k: v for k, v in given.items() if v is not None})

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """One ``run.log`` call for the whole step."""
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        """Finish the run this backend started; calling it again does nothing."""
        if not self._closed:
            self._closed = True
            if self._owned:
                self._run.finish()
