"""Comparing computed numbers with the expected ones, NaN equal to NaN: what every test shares.

``same(got, want)`` compares two numbers, or two dicts of them (same keys), or two
lists or tuples of such, element by element. Exact by default; with ``rel`` and
``abs`` a finite ``got`` may differ from a finite ``want`` by ``max(rel * |want|,
abs)``. NaN equals only NaN and an infinity only itself, whatever the tolerance.
``assert_same`` asserts the same and names the first key or index that differs.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["assert_same", "same"]


def _number(got: Any, want: Any, rel: float, abs_: float) -> bool:
    got, want = float(got), float(want)
    if math.isnan(got) or math.isnan(want):
        return math.isnan(got) and math.isnan(want)
    if got == want:
        return True
    if math.isinf(got) or math.isinf(want):
        return False
    return math.fabs(got - want) <= max(rel * math.fabs(want), abs_)


def _difference(got: Any, want: Any, rel: float, abs_: float, where: str) -> str | None:
    """Where ``got`` and ``want`` first differ (``None``: nowhere)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            extra = sorted(map(str, got.keys() ^ want.keys())) if isinstance(got, dict) else got
            return f"{where or 'keys'}: {extra} (keys only on one side)"
        for key in want:
            found = _difference(got[key], want[key], rel, abs_, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return f"{where or 'length'}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            found = _difference(g, w, rel, abs_, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if _number(got, want, rel, abs_):
        return None
    return f"{where or 'value'}: got {got!r}, want {want!r}"


def same(got: Any, want: Any, *, rel: float = 0.0, abs: float = 0.0) -> bool:
    """``got`` equals ``want`` (numbers, or dicts or lists of them), NaN equal to NaN."""
    return _difference(got, want, rel, abs, "") is None


def assert_same(
    got: Any, want: Any, *, rel: float = 0.0, abs: float = 0.0, label: Any = ""
) -> None:
    """Assert :func:`same`, naming (after ``label``) the first key or index that differs."""
    found = _difference(got, want, rel, abs, "")
    assert found is None, f"{label}: {found}" if label != "" else found
