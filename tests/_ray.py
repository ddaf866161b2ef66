"""A local Ray cluster for a test module: on 127.0.0.1, no dashboard, no usage stats.

``conftest.py`` runs every test file that names :func:`local_ray` (or starts Ray
itself) in one pytest worker, so two clusters never share the machine's cores.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any


@contextlib.contextmanager
def local_ray(
    num_cpus: int = 2,
    *,
    by_value: ModuleType | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> Iterator[Any]:
    """``ray.init`` on loopback, then ``ray.shutdown`` after the block; yields the ``ray`` module.

    ``by_value``: a module whose functions and classes the workers cannot import by
    name (a test module), shipped by value while the cluster runs.
    """
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if by_value is not None:
        ray.cloudpickle.register_pickle_by_value(by_value)
    try:
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            **({} if runtime_env is None else {"runtime_env": runtime_env}),
        )
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        if by_value is not None:
            ray.cloudpickle.unregister_pickle_by_value(by_value)
