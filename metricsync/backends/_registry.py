"""Backend names and their factories: built-in, registered in code, or installed.

A factory is called as ``factory(run_dir, **options)`` and returns a
:class:`~metricsync.backends.Backend`; ``options`` are the Tracker's backend
options this factory accepts. Names resolve in this order:

1. the built-in backends (their modules, and the optional packages behind
   them, are imported only when one is created);
2. names added with :func:`register_backend`;
3. entry points of the group ``metricsync.backends`` in installed
   distributions, loaded only when their name is used. A package declares
   one in its ``pyproject.toml``::

       [project.entry-points."metricsync.backends"]
       clearml = "my_package.metricsync_backend:ClearMLBackend"

What a third-party factory accepts is read from its signature: every named
parameter after the first (the run directory), or every option when it
takes ``**kwargs``.

>>> class Rows:
...     def __init__(self, run_dir, *, prefix=""):
...         self.prefix = prefix
...     def log(self, values, step, formats): print(self.prefix, step, dict(values))
...     def close(self): pass
>>> register_backend("rows", Rows)
>>> backend_options("rows")
frozenset({'prefix'})
>>> create_backend("rows", "unused", {"prefix": ">", "project": "ignored"}).log({"a": 1.0}, 3, {})
> 3 {'a': 1.0}
>>> unregister_backend("rows")
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from ._protocol import Backend

__all__ = [
    "BACKEND_OPTIONS",
    "ENTRY_POINT_GROUP",
    "BackendFactory",
    "available_backends",
    "backend_factory",
    "backend_options",
    "create_backend",
    "register_backend",
    "unregister_backend",
]

ENTRY_POINT_GROUP = "metricsync.backends"
"""The entry-point group third-party packages register backends in."""

BackendFactory = Callable[..., Backend]
"""``factory(run_dir, **options) -> Backend``."""

BACKEND_OPTIONS: dict[str, frozenset[str]] = {
    "console": frozenset({"console_keys", "console_width", "console_logger"}),
    "jsonl": frozenset({"fsync"}),
    "tensorboard": frozenset({"flush_secs", "config", "double_precision"}),
    "wandb": frozenset({"project", "name", "mode", "entity", "group", "tags", "config"}),
    "mlflow": frozenset({"tracking_uri", "experiment", "name", "tags", "config"}),
    "swanlab": frozenset({"project", "name", "mode", "workspace", "group", "tags", "config"}),
    "trackio": frozenset({"project", "name", "group", "config"}),
}
"""Keyword options each built-in backend accepts (passed through ``Tracker(**backend_options)``)."""


def _builtin(name: str, run_dir: Path, options: dict[str, Any]) -> Backend:
    if name == "console":
        from ._console import ConsoleBackend

        return ConsoleBackend(
            keys=options.get("console_keys"),
            width=options.get("console_width"),
            logger=options.get("console_logger"),
        )
    if name == "jsonl":
        from ._jsonl import JsonlBackend

        return JsonlBackend(run_dir, **options)
    if name == "tensorboard":
        from ._tensorboard import TensorBoardBackend

        return TensorBoardBackend(run_dir, **options)
    if name == "wandb":
        from ._wandb import WandbBackend

        return WandbBackend(run_dir, **options)
    if name == "mlflow":
        from ._mlflow import MlflowBackend

        return MlflowBackend(run_dir, **options)
    if name == "swanlab":
        from ._swanlab import SwanLabBackend

        return SwanLabBackend(run_dir, **options)
    from ._trackio import TrackioBackend

    return TrackioBackend(run_dir, **options)


_registered: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make ``factory`` available as the backend ``name`` in this process.

    A built-in name cannot be taken; registering a name again replaces the
    earlier factory. Installed packages register through the entry-point
    group ``metricsync.backends`` instead.

    >>> register_backend("jsonl", dict)
    Traceback (most recent call last):
    ...
    ValueError: 'jsonl' is a built-in backend and cannot be registered again
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"expected a non-empty backend name, got {name!r}")
    if name in BACKEND_OPTIONS:
        raise ValueError(f"{name!r} is a built-in backend and cannot be registered again")
    if not callable(factory):
        raise TypeError(f"expected a callable factory for {name!r}, got {type(factory).__name__}")
    _registered[name] = factory


def unregister_backend(name: str) -> None:
    """Forget a name added with :func:`register_backend` (no error when absent).

    >>> unregister_backend("never-registered")
    """
    _registered.pop(name, None)


def _entry_points(name: str | None = None) -> list[metadata.EntryPoint]:
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    if name is not None:
        found = found.select(name=name)
    return list(found)


def available_backends() -> tuple[str, ...]:
    """Every backend name that can be used now: built-in, registered and installed.

    >>> {"console", "jsonl", "swanlab", "tensorboard", "trackio"} <= set(available_backends())
    True
    """
    names = set(BACKEND_OPTIONS) | set(_registered) | {ep.name for ep in _entry_points()}
    return tuple(sorted(names))


def _unknown(name: object) -> ValueError:
    return ValueError(
        f"expected a backend name among {', '.join(available_backends())} or a backend "
        f"object or factory, got {name!r}"
    )


def backend_factory(name: str) -> BackendFactory:
    """The factory of a registered or installed backend (loading its entry point).

    Built-in names are created by :func:`create_backend` and have no
    separate factory object; asking for one raises ``ValueError``, as does
    an unknown name or a name that two installed distributions declare.
    """
    if name in _registered:
        return _registered[name]
    if name in BACKEND_OPTIONS:
        raise ValueError(f"{name!r} is a built-in backend; use create_backend({name!r}, ...)")
    found = _entry_points(name)
    if not found:
        raise _unknown(name)
    if len(found) > 1:
        owners = sorted(str(getattr(ep.dist, "name", "?")) for ep in found)
        raise ValueError(
            f"backend {name!r} is declared by several installed distributions "
            f"({', '.join(owners)}); expected one"
        )
    loaded = found[0].load()
    if not callable(loaded):
        raise TypeError(
            f"entry point {found[0].value!r} of backend {name!r} is not callable: "
            f"{type(loaded).__name__}"
        )
    return loaded


def _signature_options(factory: Callable[..., Any]) -> frozenset[str] | None:
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if parameters and parameters[0].kind in positional:
        parameters = parameters[1:]  # the run directory
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.kind in named)


def backend_options(name: str) -> frozenset[str] | None:
    """The Tracker options backend ``name`` accepts; None when it takes any (``**kwargs``).

    >>> sorted(backend_options("trackio"))
    ['config', 'group', 'name', 'project']
    """
    if name in BACKEND_OPTIONS:
        return BACKEND_OPTIONS[name]
    return _signature_options(backend_factory(name))


def create_backend(
    name: str,
    run_dir: str | os.PathLike[str],
    options: Mapping[str, Any] | None = None,
    *,
    console_keys: str | Sequence[str] | None = None,
) -> Backend:
    """Construct the backend called ``name`` writing under ``run_dir``.

    ``options`` may hold any Tracker backend option; those that this backend
    does not accept are left out (they belong to another backend).

    >>> create_backend("console", "unused", console_keys="loss").log({"loss": 0.5}, 1, {})
    step 1 | loss      0.5
    >>> create_backend("nope", "runs")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: expected a backend name among console, jsonl, mlflow, ... got 'nope'
    """
    given = dict(options or {})
    if console_keys is not None:
        given["console_keys"] = console_keys
    directory = Path(run_dir)
    if name in BACKEND_OPTIONS:
        accepted = BACKEND_OPTIONS[name]
        mine = {k: v for k, v in given.items() if k in accepted and v is not None}
        return _builtin(name, directory, mine)
    factory = backend_factory(name)
    accepted_or_all = _signature_options(factory)
    mine = {
        k: v
        for k, v in given.items()
        if k != "console_keys" and (accepted_or_all is None or k in accepted_or_all)
    }
    made = factory(directory, **mine)
    if not (callable(getattr(made, "log", None)) and callable(getattr(made, "close", None))):
        raise TypeError(
            f"the factory of backend {name!r} returned {type(made).__name__}, expected an "
            "object with log(values, step, formats) and close()"
        )
    return made
