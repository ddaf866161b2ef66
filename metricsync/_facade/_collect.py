"""Merging the :class:`~metricsync.Metrics` that Ray tasks and actors return.

:func:`collect` resolves ``ObjectRef`` results with ``ray.get`` and merges them, each operand
one rank (``None`` skipped, for workers that are not rank 0 of their DP group). Ray is imported
only when an ``ObjectRef`` is present.

>>> import metricsync as ms
>>> a, b = ms.Metrics(), ms.Metrics()
>>> a.record("loss", [1.0, 2.0]); b.record("loss", 6.0)
>>> collect([a, None, b]).compute()
{'loss': 3.0}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._state._errors import SyncError
from ._metrics import Metrics, merge

__all__ = ["collect"]


def _looks_like_ref(item: object) -> bool:
    cls = type(item)
    return cls.__name__ == "ObjectRef" and cls.__module__.split(".")[0] == "ray"


def _check(index: int, item: object, where: str) -> None:
    if item is not None and not isinstance(item, Metrics):
        raise TypeError(
            f"collect: item {index} {where} a {type(item).__name__}; "
            "expected a metricsync.Metrics, a Ray ObjectRef to one, or None"
        )


def collect(results: Iterable[Any], *, timeout: float | None = None) -> Metrics:
    """A new :class:`~metricsync.Metrics` merging ``results`` (inputs unchanged).

    Args:
        results: ``Metrics``, Ray ``ObjectRef`` s resolving to a ``Metrics``
            (or ``None``), or ``None`` (skipped), in any mix.
        timeout: seconds to wait for all ``ObjectRef`` s together; None waits
            forever.

    Raises:
        TypeError: an item (or what a ref resolves to) is something else.
        SyncError: the refs did not resolve within ``timeout``.
        SpecMismatchError: two results give a name different specs.
    """
    if isinstance(results, Metrics) or _looks_like_ref(results):
        raise TypeError("collect takes a list of Metrics or ObjectRefs; wrap a single one in [ ]")
    items = list(results)
    ref_positions = []
    for index, item in enumerate(items):
        if _looks_like_ref(item):
            ref_positions.append(index)
        else:
            _check(index, item, "is")
    if ref_positions:
        import ray
        from ray.exceptions import GetTimeoutError

        refs = [items[i] for i in ref_positions]
        try:
            resolved = ray.get(refs, timeout=timeout)
        except GetTimeoutError as exc:
            raise SyncError(
                f"collect: {len(refs)} Ray result(s) not all ready within {timeout} s"
            ) from exc
        for index, value in zip(ref_positions, resolved):
            _check(index, value, "resolved to")
            items[index] = value
    return merge(item for item in items if item is not None)
