"""The sync path a test's ranks take: tests that use ``sync_path`` run on both.

The ranks are spawned processes, so they inherit the environment variable set here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metricsync._allreduce import ENV


@pytest.fixture(params=["gather", "reduce"])
def sync_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Force every sync of the test's ranks through one path (see ``_allreduce.choose``)."""
    monkeypatch.setenv(ENV, request.param)
    yield request.param
