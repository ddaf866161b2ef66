"""The sync path a test's ranks take: tests that use ``sync_path`` run on both.

The ranks are spawned processes, so they inherit the environment variable set here.
The reduce path's runs are marked slow: ``make test`` runs the gather path's and
``tests/distributed/test_sync_paths.py`` (both paths, compared), ``make test-slow`` the
rest (CI runs both).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metricsync._sync._allreduce import ENV


@pytest.fixture(params=["gather", pytest.param("reduce", marks=pytest.mark.slow)])
def sync_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Force every sync of the test's ranks through one path (see ``_allreduce.choose``)."""
    monkeypatch.setenv(ENV, request.param)
    yield request.param
