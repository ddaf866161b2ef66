"""The ``Tracker``: computed metrics fanned out to the public ``metricsync.backends``
from rank 0, written in ``log`` order by a background writer."""
