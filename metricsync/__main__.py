"""``python -m metricsync``: the same program as the ``metricsync`` command (see :mod:`metricsync.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
