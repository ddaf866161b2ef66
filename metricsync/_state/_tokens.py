"""Tokens that stand for a sequence of changes, shared by everything that made the same ones.

Each change derives the next token from the last, so tables or rule sets built by the same
changes share caches without comparing their contents.

>>> start = object()
>>> derived(start, "a", 1) is derived(start, "a", 1), derived(start, "a", 1) is derived(start, "b")
(True, False)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, TypeVar

from ._lru import LRU

__all__ = [
    "EMPTY_TABLE",
    "Kept",
    "derived",
    "kept",
    "kept_if_any",
    "latest_kept",
    "remember",
    "slot_token",
    "token_of",
]

V = TypeVar("V")

#: (token, change ...) -> the token after that change
#: (a bound: past it the least recently used are forgotten, and tables made by those
#: changes again get new tokens and rework what is kept per token)
_DERIVED: LRU[tuple[Hashable, ...], object] = LRU(1 << 16)


def derived(token: object, *change: Hashable) -> object:
    """The token after ``change`` to what ``token`` stands for."""
    key = (token, *change)
    found = _DERIVED.get(key)
    return _DERIVED.setdefault(key, object()) if found is None else found


def remember(kept: dict[Any, V], key: Any, value: V, bound: int) -> V:
    """Keep ``value`` under ``key`` in ``kept`` (what is worked out per token), which
    starts over once it holds ``bound`` entries; what it holds there is returned (another
    thread's value, where one came first).

    >>> kept = {}
    >>> remember(kept, "a", 1, 2), remember(kept, "a", 5, 2), remember(kept, "b", 2, 2), kept
    (1, 1, 2, {'a': 1, 'b': 2})
    >>> remember(kept, "c", 3, 2), kept
    (3, {'c': 3})
    """
    if len(kept) >= bound:
        kept.clear()
    return kept.setdefault(key, value)


class Kept:
    """What the tables of one token share, each part worked out when first asked: the
    fold's ``SpecInfo`` of their specs (:mod:`metricsync._state._specinfo`) and the output
    ``Plan`` of their names and specs (:mod:`metricsync._state._stats`); typed ``Any``
    here, as this module sits below both."""

    __slots__ = ("info", "plan")

    def __init__(self) -> None:
        self.info: Any = None
        self.plan: Any = None


#: table token (or a key that stands for exactly some specs) -> what its tables share
#: (a bound: the tables of the latest tokens)
_KEPT: LRU[object, Kept] = LRU(16)


def kept(token: object) -> Kept:
    """What the tables of ``token`` share (nothing yet, the first time it is asked)."""
    found = _KEPT.get(token)
    return _KEPT.setdefault(token, Kept()) if found is None else found


def kept_if_any(token: object) -> Kept | None:
    """What the tables of ``token`` share, if anything was kept for it."""
    return _KEPT.get(token)


def latest_kept() -> Kept | None:
    """What was kept for the token asked last, or None."""
    return _KEPT.latest()


EMPTY_TABLE = object()  #: the token of every state table without slots


def slot_token(token: object, slot: int, name: str, spec: Hashable) -> object:
    """The token of a state table of token ``token`` whose ``slot`` now holds ``name``
    with ``spec``: tables of the same names and specs (a ``Metrics`` made anew each step)
    share what is cached by token (the output plan, the fold's spec info, placements in a
    layout, the slots one table's names have in another)."""
    return derived(token, slot, name, spec)


def token_of(names: Sequence[str], specs: Sequence[Hashable]) -> object:
    """The token a state table gets by opening ``names`` with ``specs`` in this order: a
    decoded table shares it with the tables it was encoded from.

    >>> from metricsync._state._spec import Spec
    >>> from metricsync._state._table import StateTable
    >>> t = StateTable(); t.slot("a", Spec()); t.slot("b", Spec("max"))
    0
    1
    >>> token_of(["a", "b"], [Spec(), Spec("max")]) is t.token
    True
    """
    token = EMPTY_TABLE
    for slot, (name, spec) in enumerate(zip(names, specs)):
        token = slot_token(token, slot, name, spec)
    return token
