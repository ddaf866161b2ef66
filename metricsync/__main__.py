"""``python -m metricsync``: the same program as the ``metricsync`` command (see :mod:`metricsync._cli._cli`)."""

from __future__ import annotations

import sys

from ._cli._cli import main

if __name__ == "__main__":
    sys.exit(main())
