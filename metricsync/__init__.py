"""metricsync: exact, mergeable training metrics for distributed jobs."""

from __future__ import annotations

from .errors import CodecError, MetricsyncError, SpecMismatchError, SyncError

__all__ = ["CodecError", "MetricsyncError", "SpecMismatchError", "SyncError"]
__version__ = "0.1.0"
