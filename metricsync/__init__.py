"""metricsync: exact, mergeable training metrics for distributed jobs.

Record on every rank, merge exactly, sync with a constant number of
collectives, log anywhere.

>>> import metricsync as ms
>>> m = ms.Metrics({"response_length": ms.Spec(("mean", "max"))})
>>> m.record("response_length", [120, 80, 400])
>>> m.compute()
{'response_length/mean': 200.0, 'response_length/max': 400.0}
"""

from __future__ import annotations

from .collect import collect
from .errors import CodecError, MetricsyncError, SpecMismatchError, SyncError
from .metrics import Metrics, merge
from .spec import Spec
from .tracker import Tracker

__all__ = [
    "CodecError",
    "Metrics",
    "MetricsyncError",
    "Spec",
    "SpecMismatchError",
    "SyncError",
    "Tracker",
    "collect",
    "merge",
]
__version__ = "0.1.0"
