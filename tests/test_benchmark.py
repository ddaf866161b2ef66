"""The sync benchmark's helpers: the progress bar only on request, silent without tqdm."""

from __future__ import annotations

import sys

import pytest

from metricsync._baselines import olmo_divide_factor
from metricsync._benchmark import _progress


def _walk(enabled: bool) -> None:
    with _progress(enabled, 3, "phases") as tick:
        for what in ("a", "b", "c"):
            tick(what)


def test_no_bar_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    _walk(False)
    assert capsys.readouterr() == ("", "")


def test_without_tqdm_the_bar_is_silently_left_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # makes `from tqdm import tqdm` fail
    _walk(True)
    assert capsys.readouterr() == ("", "")


def test_with_tqdm_the_bar_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    _walk(True)
    out, err = capsys.readouterr()
    assert out == ""
    assert "phases" in err and "/3" in err


@pytest.mark.parametrize(
    ("world", "factor"), [(1, 1.0), (2, 2.0), (4, 2.0), (8, 4.0), (16, 4.0), (6, 4.0), (64, 8.0)]
)
def test_olmo_divide_factor_matches_values_worked_by_hand(world: int, factor: float) -> None:
    assert olmo_divide_factor(world) == factor
