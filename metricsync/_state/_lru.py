"""The one bounded cache of the package: at most ``maxsize`` entries, least recently used out.

Every process-wide cache of a derived value is an :class:`LRU` (or a function wrapped
by :func:`lru`), so none grows with the keys a program makes (specs, accuracies, tokens).

>>> cache = LRU[str, int](2)
>>> cache.put("a", 1); cache.put("b", 2); cache.get("a")
1
>>> cache.setdefault("c", 3), cache.setdefault("c", 4)
(3, 3)
>>> cache.get("b") is None, sorted(cache.keys()), len(cache)
(True, ['a', 'c'], 2)
>>> @lru(4)
... def square(x: int) -> int:
...     return x * x
>>> [square(x) for x in range(10)][-1], len(square.cache)
(81, 4)
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["LRU", "Cached", "lru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A thread-safe map of at most ``maxsize`` entries; a ``put`` past it drops the least
    recently used one. Each operation is O(1)."""

    __slots__ = ("_data", "_lock", "maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"an LRU cache holds at least one entry, got maxsize={maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept under ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` (in place of what was kept there)."""
        with self._lock:
            self._data[key] = value
            self._evict(key)

    def setdefault(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key`` unless something is kept there already, and return
        what is kept (the value another thread kept first, if one did)."""
        with self._lock:
            kept = self._data.setdefault(key, value)
            self._evict(key)
            return kept

    def _evict(self, key: K) -> None:
        self._data.move_to_end(key)
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def latest(self) -> V | None:
        """The most recently used value, or None when empty."""
        with self._lock:
            return next(reversed(self._data.values()), None)

    def keys(self) -> Iterator[K]:
        """The keys, least recently used first (a snapshot)."""
        with self._lock:
            return iter(list(self._data))

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class Cached(Generic[K, V]):
    """A one-argument function whose results an :class:`LRU` keeps (see :func:`lru`)."""

    def __init__(self, function: Callable[[K], V], maxsize: int) -> None:
        self.function = function
        self.cache: LRU[K, V] = LRU(maxsize)
        functools.update_wrapper(self, function)

    def __call__(self, key: K) -> V:
        value = self.cache.get(key)
        if value is None:
            value = self.cache.setdefault(key, self.function(key))
        return value


def lru(maxsize: int) -> Callable[[Callable[[K], V]], Cached[K, V]]:
    """Decorate a one-argument function (of a hashable argument, returning a value that is
    not None) to keep its latest ``maxsize`` results."""

    def wrap(function: Callable[[K], V]) -> Cached[K, V]:
        return Cached(function, maxsize)

    return wrap
