"""The backends a ``Tracker`` is given: entries checked, each made, one step fanned out to all.

A failing backend is reported and the others go on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from ..backends import BACKEND_OPTIONS, Backend, available_backends, backend_options, create_backend

__all__ = [
    "backend_entries",
    "call_factory",
    "check_options",
    "fan_out",
    "is_backend",
    "make_backend",
]


def is_backend(obj: object) -> bool:
    """A backend object: has ``log`` and ``close`` and is not a class (a class is a factory)."""
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "log", None))
        and callable(getattr(obj, "close", None))
    )


def call_factory(factory: Callable[..., Any], directory: Path) -> Backend:
    """``factory(directory)`` when it takes a required positional argument, else ``factory()``."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        wants_dir = True
    else:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wants_dir = any(p.kind in positional and p.default is p.empty for p in parameters)
    made = factory(directory) if wants_dir else factory()
    if not is_backend(made):
        name = getattr(factory, "__qualname__", type(factory).__name__)
        raise TypeError(
            f"backend factory {name} returned {type(made).__name__}, expected an object with "
            "log(values, step, formats) and close()"
        )
    return cast(Backend, made)


def check_options(names: list[str], options: Mapping[str, Any]) -> None:
    """Unknown names raise ValueError; options no chosen or built-in backend takes, TypeError."""
    known = set().union(*BACKEND_OPTIONS.values())
    takes_any = False
    for name in names:
        if name in BACKEND_OPTIONS:
            continue
        if name not in available_backends():
            raise ValueError(
                f"expected backend names among {', '.join(available_backends())} or backend "
                f"objects or factories, got {name!r}"
            )
        accepted = backend_options(name)
        if accepted is None:
            takes_any = True
        else:
            known |= accepted
    unknown = sorted(set(options) - known)
    if unknown and not takes_any:
        raise TypeError(
            f"unexpected backend option(s) {', '.join(unknown)}; "
            f"expected some of {', '.join(sorted(known))}"
        )


def backend_entries(backends: Any) -> list[Any]:
    """``Tracker(backends=...)`` as a list of names, backend objects and factories.

    >>> backend_entries("jsonl"), backend_entries(("console", "jsonl"))
    (['jsonl'], ['console', 'jsonl'])
    """
    if isinstance(backends, str) or is_backend(backends) or callable(backends):
        entries = [backends]
    else:
        entries = list(cast(Iterable[Any], backends))
    names = [e for e in entries if isinstance(e, str)]
    for entry in entries:
        if not isinstance(entry, str) and not is_backend(entry) and not callable(entry):
            raise TypeError(
                "expected backend names, objects with log(values, step, formats) and "
                f"close(), or factories returning one, got {type(entry).__name__}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"expected each backend once, got {names}")
    return entries


def fan_out(
    backends: Sequence[tuple[str, Any]],
    step: int,
    values: Mapping[str, float],
    formats: Mapping[str, str | None],
    histograms: Mapping[str, Any],
    report: Callable[[str, str, Exception], None],
) -> None:
    """Hand one step to every backend; ``report`` each failure and go on with the others."""
    for label, backend in backends:
        try:
            backend.log(dict(values), step, dict(formats))
        except Exception as exc:
            report(label, f"failed at step {step}", exc)
            continue
        log_histograms = getattr(backend, "log_histograms", None)
        if histograms and callable(log_histograms):
            try:
                log_histograms(dict(histograms), step)
            except Exception as exc:
                report(label, f"failed to log histograms at step {step}", exc)


def make_backend(
    entry: Any, directory: Path, options: dict[str, Any], console_keys: Any
) -> tuple[str, Backend]:
    """``(label, backend)`` for one entry: a name, a backend object or a factory."""
    if isinstance(entry, str):
        return entry, create_backend(entry, directory, options, console_keys=console_keys)
    backend = cast(Backend, entry) if is_backend(entry) else call_factory(entry, directory)
    return type(backend).__name__, backend
