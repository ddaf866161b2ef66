"""The public surface: a pinned ``__all__``, the public modules, and nothing else public by name."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import types
from pathlib import Path

import metricsync as ms

PUBLIC_NAMES = [
    "CodecError",
    "Histogram",
    "Metrics",
    "MetricsyncError",
    "Spec",
    "SpecMismatchError",
    "SyncError",
    "SyncHandle",
    "Tracker",
    "bookkeeping_group",
    "collect",
    "merge",
]
#: modules users import; every other module of the package is private (``_``-prefixed)
PUBLIC_MODULES = {
    "metricsync",
    "metricsync.backends",
    "metricsync.integrations",
    "metricsync.integrations.accelerate",
    "metricsync.integrations.lightning",
    "metricsync.integrations.transformers",
    "metricsync.integrations.verl",
    "metricsync.testing",
    "metricsync.verl_compat",
}
PACKAGE = Path(ms.__file__).parent


def _all_modules() -> set[str]:
    names = {"metricsync"}
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="metricsync."):
        names.add(info.name)
    return names


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert ms.__all__ == PUBLIC_NAMES
    for name in PUBLIC_NAMES:
        assert getattr(ms, name) is not None
    assert callable(ms.collect) and not isinstance(ms.collect, types.ModuleType)
    assert callable(ms.merge) and not isinstance(ms.merge, types.ModuleType)


def test_public_classes_report_the_public_module() -> None:
    for name in PUBLIC_NAMES:
        value = getattr(ms, name)
        if isinstance(value, type):
            assert value.__module__ == "metricsync", name


def test_every_module_is_public_by_list_or_private_by_name() -> None:
    modules = _all_modules()
    assert modules >= PUBLIC_MODULES
    for name in modules - PUBLIC_MODULES:
        parts = name.split(".")
        assert any(part.startswith("_") for part in parts[1:]), f"{name} looks public"


def test_no_implementation_module_is_importable_by_its_old_public_name() -> None:
    for old in ("collect", "sync", "state", "metrics", "codec", "spec", "tracker", "sketch"):
        assert importlib.util.find_spec(f"metricsync.{old}") is None, old


def test_syncing_does_not_turn_a_public_name_into_a_module() -> None:
    m = ms.Metrics()
    m.record("x", 1.0)
    m.sync().compute()
    m.sync(async_op=True).wait()
    assert not hasattr(ms, "sync")
    assert callable(ms.collect) and not isinstance(ms.collect, types.ModuleType)
    for name in PUBLIC_NAMES:
        assert not isinstance(getattr(ms, name), types.ModuleType), name


def test_the_public_modules_import() -> None:
    for name in sorted(PUBLIC_MODULES):
        if name.startswith("metricsync.integrations."):
            continue  # they need their trainer's package; tests/integrations covers them
        importlib.import_module(name)
