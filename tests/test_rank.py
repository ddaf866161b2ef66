"""detect_rank over combinations of launcher variables, against the rule written out by hand."""

from __future__ import annotations

import itertools
import tempfile

import pytest

from metricsync._tracking._rank import detect_rank
from metricsync._tracking._tracker import Tracker

VARIABLES = ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "LOCAL_RANK")


def expected_rank(env: dict[str, str]) -> int:
    """The rule, spelled out: the first global-rank variable set, else LOCAL_RANK, else 0."""
    if env.get("RANK"):
        return int(env["RANK"])
    if env.get("SLURM_PROCID"):
        return int(env["SLURM_PROCID"])
    if env.get("JSM_NAMESPACE_RANK"):
        return int(env["JSM_NAMESPACE_RANK"])
    if env.get("LOCAL_RANK"):
        return int(env["LOCAL_RANK"])
    return 0


# every subset of the four variables, each unset, empty, 0 or a distinct non-zero value
CHOICES = [None, "", "0", "3"]
COMBINATIONS = [
    {
        name: (value if value in (None, "", "0") else str(int(value) + i))
        for i, (name, value) in enumerate(zip(VARIABLES, values))
        if value is not None
    }
    for values in itertools.product(CHOICES, repeat=len(VARIABLES))
]


@pytest.mark.parametrize(
    "env", COMBINATIONS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "none"
)
def test_every_combination_follows_the_rule(env: dict[str, str]) -> None:
    cleaned = {k: v for k, v in env.items() if v is not None}
    assert detect_rank(environ=cleaned) == expected_rank(cleaned)


def test_the_process_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert detect_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert detect_rank() == 1  # a second local process without a global rank is not rank 0
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert detect_rank() == 0  # the global rank wins over the local one
    monkeypatch.setenv("RANK", "6")
    assert detect_rank() == 6
    assert detect_rank(2) == 2  # an explicit rank wins over everything


def test_a_local_rank_other_than_zero_keeps_the_tracker_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    run_dir = tempfile.mkdtemp()
    with Tracker("jsonl", run_dir=run_dir) as tracker:
        tracker.log({"a": 1.0}, step=1)
        assert tracker.rank == 1 and tracker.backends == ()


@pytest.mark.parametrize("name", VARIABLES)
@pytest.mark.parametrize("bad", ["x", "1.5", "-1"])
def test_malformed_variables_raise_naming_them(name: str, bad: str) -> None:
    with pytest.raises(ValueError, match=f"\\${name}"):
        detect_rank(environ={name: bad})


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_a_bad_explicit_rank_raises(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        detect_rank(bad)  # type: ignore[arg-type]
