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

from ._facade._collect import collect
from ._facade._metrics import Metrics, merge
from ._state._errors import CodecError, MetricsyncError, SpecMismatchError, SyncError
from ._state._histogram import Histogram
from ._state._spec import Spec
from ._sync._async import SyncHandle, bookkeeping_group
from ._tracking._tracker import Tracker
from ._version import __version__ as __version__

__all__ = [
    "CodecError",
    "Histogram",
    "Metrics",
    "MetricsyncError",
    "Spec",
    "SpecMismatchError",
    "SyncError",
    "SyncHandle",
    "Tracker",
    "bookkeeping_group",
    "collect",
    "merge",
]

for _public in (
    CodecError,
    Histogram,
    Metrics,
    MetricsyncError,
    Spec,
    SpecMismatchError,
    SyncError,
    SyncHandle,
    Tracker,
):
    _public.__module__ = __name__  # tracebacks and reprs show metricsync.X, the public path
del _public
