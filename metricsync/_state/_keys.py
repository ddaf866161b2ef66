"""Output keys two metrics would share: a metric named like another's derived key.

``x/max`` beside ``x`` of statistics ``("mean", "max")`` would report the same key; wherever
such names meet (record, ``define``, merge, sync, decode) they are refused, naming both.

>>> from metricsync._state._spec import Spec
>>> specs = {"x": Spec(("mean", "max"))}
>>> clash("x/max", Spec(), specs.get)
('x', 'x/max')
>>> clash("x/min", Spec(), specs.get) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._errors import SpecMismatchError
from ._spec import Spec

__all__ = ["Lookup", "check_table", "clash", "clash_error", "first_clash", "table_clash"]

Lookup = Callable[[str], "Spec | None"]


def _derived(spec: Spec) -> tuple[str, ...]:
    """The suffixes (``/max``) of a spec's keys other than the bare name."""
    keys = spec.output_keys("") + spec.extra_keys("")
    return tuple(key for key in keys if key)


def clash(name: str, spec: Spec, lookup: Lookup) -> tuple[str, str] | None:
    """``(other metric, shared key)`` where a metric ``name`` of ``spec`` would report a key
    that another reports, with ``lookup`` giving the other metrics' specs; else None."""
    if len(spec.reduce) == 1 and "/" in name:  # its name is a key: another's derived one?
        parent, _, stat = name.rpartition("/")
        other = lookup(parent)
        if other is not None and "/" + stat in _derived(other):
            return parent, name
    for suffix in _derived(spec):  # one of its derived keys: another's name?
        key = name + suffix
        other = lookup(key)
        if other is not None and len(other.reduce) == 1:
            return key, key
    return None


def clash_error(name: str, spec: Spec, other: str, key: str) -> SpecMismatchError:
    """The error naming both metrics and the key they would share."""
    return SpecMismatchError(
        f"metrics {name!r} ({spec!r}) and {other!r} would both report the key {key!r} in "
        "compute(), one value replacing the other; rename one of them"
    )


def first_clash(names: Sequence[str], lookup: Lookup) -> tuple[str, str, str] | None:
    """``(name, other, key)`` of the first of ``names`` whose keys meet another's."""
    for name in names:
        spec = lookup(name)
        if spec is not None and (found := clash(name, spec, lookup)) is not None:
            return name, *found
    return None


def table_clash(names: Sequence[str], specs: Sequence[Spec]) -> tuple[str, str, str] | None:
    """``(name, other, key)`` where two metrics of a table would share a key, else None."""
    if not any("/" in name for name in names):  # no name can be another's derived key
        return None
    return first_clash(names, dict(zip(names, specs)).get)


def check_table(names: Sequence[str], specs: Sequence[Spec], distinct: bool) -> None:
    """``SpecMismatchError`` where two metrics of a table (names and specs) would share a
    key; ``distinct`` says whether the output keys of its plan are all different (then
    none is shared, and nothing is looked up)."""
    if distinct:
        return
    found = table_clash(names, specs)
    if found is not None:
        name, other, key = found
        raise clash_error(name, specs[list(names).index(name)], other, key)
