"""The backend registry: entry points of installed distributions, registered names, factories.

The third-party backend is a real distribution on disk (a module and its
``.dist-info`` with ``entry_points.txt``) on ``sys.path``, found by
``importlib.metadata`` as pip-installed packages are.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest

from metricsync._log._logread import read_jsonl
from metricsync._tracking._tracker import Tracker
from metricsync.backends import (
    ENTRY_POINT_GROUP,
    available_backends,
    backend_factory,
    backend_options,
    create_backend,
    register_backend,
    unregister_backend,
)

PLUGIN = textwrap.dedent(
    """
    from pathlib import Path

    CREATED = []

    class Recording:
        def __init__(self, run_dir, *, project=None, config=None):
            self.run_dir = Path(run_dir)
            self.project = project
            self.config = config
            self.rows = []
            self.closed = False
            CREATED.append(self)

        def log(self, values, step, formats):
            self.rows.append((step, dict(values)))

        def close(self):
            self.closed = True

    def anything(run_dir, **options):
        backend = Recording(run_dir)
        backend.options = options
        return backend

    NOT_CALLABLE = 42

    def not_a_backend(run_dir):
        return "a string"
    """
)


def _install(root: Path, dist: str, module: str, entries: Mapping[str, str]) -> None:
    """Write ``module.py`` and ``dist-1.0.dist-info`` declaring ``entries`` under ``root``."""
    (root / f"{module}.py").write_text(PLUGIN)
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    root = tmp_path / "site"
    root.mkdir()
    _install(
        root,
        "metricsync_recording",
        "msync_recording_plugin",
        {
            "recording": "msync_recording_plugin:Recording",
            "anything": "msync_recording_plugin:anything",
            "broken": "msync_recording_plugin:NOT_CALLABLE",
            "wrong": "msync_recording_plugin:not_a_backend",
        },
    )
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield importlib.import_module("msync_recording_plugin")
    sys.modules.pop("msync_recording_plugin", None)


def test_an_installed_entry_point_is_a_backend_name(plugin: ModuleType, tmp_path: Path) -> None:
    assert {"recording", "anything"} <= set(available_backends())
    assert backend_options("recording") == {"project", "config"}
    run_dir = tmp_path / "run"
    with Tracker(
        ("jsonl", "recording"), run_dir=run_dir, project="p", config={"lr": 0.1}, fsync=False
    ) as tracker:
        assert tracker.backends == ("jsonl", "recording")
        tracker.log({"loss": 0.5}, step=3)
    [made] = plugin.CREATED
    assert made.run_dir == run_dir and made.project == "p" and made.config == {"lr": 0.1}
    assert made.rows == [(3, {"loss": 0.5})] and made.closed
    assert read_jsonl(run_dir)[1] == [(3, {"loss": 0.5})]


def test_a_factory_with_kwargs_gets_every_option(plugin: ModuleType, tmp_path: Path) -> None:
    assert backend_options("anything") is None
    with Tracker("anything", run_dir=tmp_path, whatever=1, project="p") as tracker:
        tracker.log({"a": 1.0}, step=1)
    [made] = plugin.CREATED
    assert made.options == {"whatever": 1, "project": "p"}


def test_third_party_names_are_created_only_on_writing_ranks(
    plugin: ModuleType, tmp_path: Path
) -> None:
    with Tracker("recording", run_dir=tmp_path, rank=1) as tracker:
        tracker.log({"a": 1.0}, step=1)
    assert plugin.CREATED == []
    with pytest.raises(TypeError, match="projcet"):  # options are still checked on every rank
        Tracker("recording", run_dir=tmp_path, rank=1, projcet="p")
    with Tracker("recording", run_dir=tmp_path, rank=2, rank_zero_only=False) as tracker:
        tracker.log({"a": 1.0}, step=1)
    [made] = plugin.CREATED
    assert made.run_dir == tmp_path / "rank2" and made.rows == [(1, {"a": 1.0})]


def test_broken_entry_points_raise_naming_them(plugin: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'broken' is not callable"):
        backend_factory("broken")
    with pytest.raises(TypeError, match="returned str"):
        create_backend("wrong", tmp_path)
    with pytest.raises(ValueError, match=r"recording.*got 'recordign'"):
        Tracker("recordign", run_dir=tmp_path)


def test_a_name_declared_twice_is_refused(
    plugin: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other-site"
    other.mkdir()
    _install(other, "metricsync_clash", "msync_clash_plugin", {"recording": "x:y"})
    monkeypatch.syspath_prepend(str(other))
    importlib.invalidate_caches()
    with pytest.raises(ValueError, match="metricsync_clash, metricsync_recording"):
        backend_factory("recording")


def test_registered_names_and_their_options(tmp_path: Path) -> None:
    made = []

    def factory(run_dir: Path, *, prefix: str = "") -> Recorder:
        made.append(Recorder(prefix))
        return made[-1]

    register_backend("test-recorder", factory)
    try:
        assert "test-recorder" in available_backends()
        with Tracker(("test-recorder",), run_dir=tmp_path, prefix=">") as tracker:
            tracker.log({"a": 2.0}, step=4)
        assert made[0].prefix == ">" and made[0].rows == [(4, {"a": 2.0})] and made[0].closed
        with pytest.raises(ValueError, match="built-in"):
            register_backend("tensorboard", factory)
        with pytest.raises(TypeError, match="callable"):
            register_backend("x", 3)  # type: ignore[arg-type]
    finally:
        unregister_backend("test-recorder")
    assert "test-recorder" not in available_backends()


class Recorder:
    instances: ClassVar[list[Recorder]] = []

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.closed = False
        Recorder.instances.append(self)

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        self.rows.append((step, dict(values)))

    def close(self) -> None:
        self.closed = True


class DirRecorder(Recorder):
    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = run_dir


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_factories_run_only_on_writing_ranks(tmp_path: Path, rank: int) -> None:
    Recorder.instances.clear()
    calls = []

    def no_args() -> Recorder:
        calls.append("no_args")
        return Recorder("lambda")

    with Tracker((no_args, DirRecorder), run_dir=tmp_path, rank=rank) as tracker:
        tracker.log({"a": 1.0}, step=1)
        assert tracker.backends == (("Recorder", "DirRecorder") if rank == 0 else ())
    if rank == 0:
        assert calls == ["no_args"]
        lam, with_dir = Recorder.instances
        assert isinstance(with_dir, DirRecorder) and with_dir.run_dir == tmp_path
        assert lam.rows == with_dir.rows == [(1, {"a": 1.0})]
        assert lam.closed and with_dir.closed
    else:
        assert calls == [] and Recorder.instances == []  # nothing created at all


def test_a_factory_gets_the_rank_directory_when_every_rank_writes(tmp_path: Path) -> None:
    Recorder.instances.clear()
    with Tracker(DirRecorder, run_dir=tmp_path, rank=2, rank_zero_only=False) as tracker:
        tracker.log({"a": 1.0}, step=1)
    [made] = Recorder.instances
    assert isinstance(made, DirRecorder) and made.run_dir == tmp_path / "rank2" and made.closed


def test_objects_handed_to_a_silent_rank_are_closed(tmp_path: Path) -> None:
    given = Recorder()
    with Tracker(("jsonl", given), run_dir=tmp_path, rank=1) as tracker:
        tracker.log({"a": 1.0}, step=1)
        assert not given.closed
    assert given.closed and given.rows == []


def test_a_factory_returning_something_else_raises_and_closes_the_rest(tmp_path: Path) -> None:
    first = Recorder()
    with pytest.raises(TypeError, match="returned int"):
        Tracker((first, lambda: 3), run_dir=tmp_path)
    assert first.closed


def test_two_backends_of_one_class_get_distinct_labels(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracker = Tracker((Recorder(), Recorder, lambda: Recorder()), run_dir=tmp_path)
    assert tracker.backends == ("Recorder", "Recorder#2", "Recorder#3")
    tracker.close()
