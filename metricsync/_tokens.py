"""Tokens that stand for a sequence of changes, shared by everything that made the same ones.

A state table's token stands for its names and specs, a rule table's for its
rules: each change derives the next token from the last one and the change, and
the same change to the same token gives the same object. So two tables built by
the same changes from nothing share their token, and whatever is kept per token
(an output plan, a placement in a layout, a merge's agreement) is worked out
once for both.

>>> start = object()
>>> derived(start, "a", 1) is derived(start, "a", 1), derived(start, "a", 1) is derived(start, "b")
(True, False)
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["derived"]

#: (token, change ...) -> the token after that change
_DERIVED: dict[tuple[Hashable, ...], object] = {}
_BOUND = 1 << 16  #: tokens kept; past it the memory starts over and later tables rework


def derived(token: object, *change: Hashable) -> object:
    """The token after ``change`` to what ``token`` stands for."""
    key = (token, *change)
    found = _DERIVED.get(key)
    if found is None:
        if len(_DERIVED) >= _BOUND:
            _DERIVED.clear()
        found = _DERIVED.setdefault(key, object())
    return found
