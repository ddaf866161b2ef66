"""A collect function for verl's single controller: what workers return, merged on the driver.

verl's ``register(dispatch_mode=...)`` pairs a dispatch function with a
collect function that turns the list of worker outputs into the driver's
result. For ``ONE_TO_ALL``, ``ALL_TO_ALL``, ``DP_COMPUTE`` and
``DP_COMPUTE_METRIC`` verl returns the list itself, and ``metricsync.collect``
merges it. For ``DP_COMPUTE_PROTO`` verl concatenates ``DataProto`` outputs:
a :class:`metricsync.Metrics` under ``meta_info["metrics"][name]`` becomes a
list (one per worker, which ``metricsync.collect`` and
:func:`~metricsync.verl_compat.reduce_metrics` merge), and one directly under
``meta_info[name]`` fails verl's equality check. :func:`collect_metrics` merges
both forms.

verl 0.9.1's engine workers register ``train_batch``/``train_mini_batch`` with
``make_nd_compute_dataproto_dispatch_fn(mesh_name)``: the data goes to each
worker by its DP rank in a DP x TP x PP mesh, and the collect keeps only the
workers its collect mask marks (one per DP rank). There the metrics reach the
driver through verl's own glue: each worker gathers its metrics dict over its
DP group (``allgather_dict_into_dict``, one sync after :func:`install`), and
verl's collect keeps the first marked worker's dict, which holds the whole
group. For workers that return a :class:`metricsync.Metrics` per DP rank
instead, :func:`make_nd_collect_metrics` is that dispatch with a collect that
honours the mask and merges what the marked workers returned: each DP rank
once, TP and PP replicas neither counted twice nor lost.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import metricsync as ms

__all__ = ["collect_metrics", "collect_nd_metrics", "make_nd_collect_metrics"]


def _is_ref(item: object) -> bool:
    cls = type(item)
    return cls.__name__ == "ObjectRef" and cls.__module__.split(".")[0] == "ray"


def _is_proto(item: object) -> bool:
    return isinstance(getattr(item, "meta_info", None), dict) and hasattr(type(item), "concat")


def _slots(meta_info: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(dict, key) of each ``meta_info`` entry and each ``meta_info["metrics"]`` entry."""
    slots = [(meta_info, key) for key in meta_info]
    inner = meta_info.get("metrics")
    if isinstance(inner, dict):
        slots += [(inner, key) for key in inner]
    return slots


def _take_metrics(metas: list[dict[str, Any]]) -> dict[tuple[bool, str], list[Any]]:
    """Move each entry that holds a ``Metrics`` in some worker's ``meta_info`` out of all of them.

    Keys: ``(inside meta_info["metrics"], key)``; values: what each worker held (None skipped later).
    """
    paths = {
        (where is not meta, key)
        for meta in metas
        for where, key in _slots(meta)
        if isinstance(where[key], ms.Metrics)
    }
    taken: dict[tuple[bool, str], list[Any]] = {path: [] for path in paths}
    for meta in metas:
        for inside, key in paths:
            where = meta.get("metrics") if inside else meta
            if isinstance(where, dict) and key in where:
                taken[(inside, key)].append(where.pop(key))
    return taken


def collect_metrics(worker_group: Any, output: Any) -> Any:
    """Merge what verl's workers returned: pass it as ``collect_fn`` to verl's ``register``.

    ``output`` is the list of the workers' results (or one result, for
    ``execute_mode=Execute.RANK_ZERO``), resolved or as Ray ``ObjectRef`` s.

    - ``Metrics`` and ``None`` (a worker that returns nothing, for instance
      every rank but 0 after an in-worker ``sync``): one merged
      :class:`metricsync.Metrics`, each worker counting as one rank.
    - ``DataProto``: verl's concatenation of them, in which every ``Metrics``
      found in a ``meta_info`` (directly, or inside ``meta_info["metrics"]``)
      is replaced by one merged ``Metrics`` under the same key.

    ``worker_group`` is unused (verl passes it); the function also works on
    a list the driver already holds.

    >>> import metricsync as ms
    >>> a, b = ms.Metrics(), ms.Metrics()
    >>> a.record("loss", [1.0, 2.0]); b.record("loss", 6.0)
    >>> collect_metrics(None, [a, None, b]).compute()
    {'loss': 3.0}
    """
    items = list(output) if isinstance(output, (list, tuple)) else [output]
    refs = [i for i, item in enumerate(items) if _is_ref(item)]
    if refs:
        import ray

        for i, value in zip(refs, ray.get([items[i] for i in refs])):
            items[i] = value
    if all(item is None or isinstance(item, ms.Metrics) for item in items):
        return ms.collect(items)
    if all(_is_proto(item) for item in items):
        taken = _take_metrics([item.meta_info for item in items])
        merged = type(items[0]).concat(items)
        for (inside, key), metrics in taken.items():
            target = merged.meta_info.setdefault("metrics", {}) if inside else merged.meta_info
            target[key] = ms.collect(metrics)
        return merged
    kinds = sorted({type(item).__name__ for item in items})
    raise TypeError(
        f"collect_metrics: expected worker results that are all metricsync.Metrics (or None) "
        f"or all DataProto, got {', '.join(kinds)}"
    )


def _collect_mask(worker_group: Any, mesh_name: str) -> list[bool]:
    """verl's collect mask of ``mesh_name``: which workers answer for their DP rank.

    Read and cached as verl's own nd collect does (``_collect_info``, filled
    by querying the workers' registered ``_query_collect_info``).
    """
    cache = getattr(worker_group, "_collect_info", None)
    if isinstance(cache, dict) and mesh_name in cache:
        return list(cache[mesh_name])
    mask = list(worker_group._query_collect_info(mesh_name))
    if isinstance(cache, dict):
        cache[mesh_name] = mask
    return mask


def collect_nd_metrics(mesh_name: str, worker_group: Any, output: Any) -> Any:
    """:func:`collect_metrics` over the workers that verl's collect mask of ``mesh_name`` marks.

    ``output`` holds one result per worker (as verl's nd collect gets it);
    the unmarked workers' results (TP/PP replicas of a DP rank) are dropped
    before the merge, so each DP rank counts once.
    """
    items = list(output) if isinstance(output, (list, tuple)) else [output]
    mask = _collect_mask(worker_group, mesh_name)
    if len(mask) != len(items):
        raise ValueError(
            f"collect_nd_metrics({mesh_name!r}): {len(items)} worker results but a collect "
            f"mask of {len(mask)} workers"
        )
    return collect_metrics(worker_group, [item for item, keep in zip(items, mask) if keep])


def make_nd_collect_metrics(mesh_name: str) -> dict[str, Any]:
    """verl's ``make_nd_compute_dataproto_dispatch_fn(mesh_name)`` with :func:`collect_nd_metrics`.

    Pass it as ``register(dispatch_mode=...)``: the data is dispatched by DP
    rank exactly as verl does; what the marked workers return (``Metrics``,
    ``None`` or ``DataProto``) is merged as :func:`collect_metrics` does.
    Needs verl.
    """
    from verl.single_controller.base.decorator import dispatch_lazy_compute_data_proto

    return {
        "dispatch_fn": partial(dispatch_lazy_compute_data_proto, mesh_name),
        "collect_fn": partial(collect_nd_metrics, mesh_name),
    }
