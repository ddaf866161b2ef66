"""The sync benchmark's helpers (its progress bar is ``_progress.Progress``, tested with it)."""

from __future__ import annotations

import pytest

from metricsync._cli._baselines import olmo_divide_factor


@pytest.mark.parametrize(
    ("world", "factor"), [(1, 1.0), (2, 2.0), (4, 2.0), (8, 4.0), (16, 4.0), (6, 4.0), (64, 8.0)]
)
def test_olmo_divide_factor_matches_values_worked_by_hand(world: int, factor: float) -> None:
    assert olmo_divide_factor(world) == factor
