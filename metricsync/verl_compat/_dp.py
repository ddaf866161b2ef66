"""The helpers verl's workers call on their metrics dicts, on metricsync.

verl 0.9.1's workers collect each micro-batch's metrics with
``verl.utils.py_functional.append_to_dict``, gather the dict over the
data-parallel (DP) group with ``verl.utils.torch_functional.allgather_dict_into_dict``
(a pickled ``all_gather_object``) and reduce each key with
``Metric.aggregate_dp``. The two functions here keep verl's signatures;
:func:`~metricsync.verl_compat.install` puts them in verl's place.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import metricsync as ms

from ._metric import SPECS, AggregationType, Metric, WeightedMean, from_summary, summary
from ._mixed import refuse_verl_metric
from ._reduce import key_rule, leaves

__all__ = ["allgather_dict_into_dict", "append_to_dict"]

_KINDS = {spec: kind for kind, spec in SPECS.items()}


def append_to_dict(
    data: MutableMapping[str, Any], new_data: Mapping[str, Any], prefix: str = ""
) -> None:
    """Append each value of ``new_data`` to ``data[prefix + key]``, in place (verl's helper).

    A :class:`Metric` value goes into a :class:`Metric` of the same
    aggregation (its values pooled: one per micro-batch); a
    :class:`~metricsync.verl_compat.WeightedMean` (what ``Metric.aggregate_dp``
    gives a token-weighted metric, one per mini-batch in verl's worker) goes
    into a ``MEAN`` Metric with its weight; a list extends a list; anything
    else is appended to a list. verl's own ``Metric`` raises
    :class:`~metricsync.verl_compat.MixedMetricError`.

    >>> acc = {}
    >>> for loss in (0.5, 0.25):   # two gradient-accumulation micro-batches
    ...     append_to_dict(acc, {"actor/pg_loss": Metric("sum", loss), "actor/clipfrac": 0.1})
    >>> float(acc["actor/pg_loss"].aggregate()), acc["actor/clipfrac"]
    (0.75, [0.1, 0.1])
    """
    for key, value in new_data.items():
        new_key = key if key.startswith(prefix) else f"{prefix}{key}"
        refuse_verl_metric(value, f"append_to_dict[{new_key!r}]")
        if isinstance(value, WeightedMean):
            value = Metric(AggregationType.MEAN, float(value), weight=value.weight)
            value.key = new_key
        if new_key not in data:
            data[new_key] = value.init_list() if isinstance(value, Metric) else []
            if isinstance(value, Metric):
                data[new_key].key = new_key  # named in messages, here and after a gather
        target = data[new_key]
        refuse_verl_metric(target, f"append_to_dict[{new_key!r}]")
        if isinstance(value, list):
            target.extend(value)
        else:
            target.append(value)


def _pooled(key: str, value: Any) -> Metric:
    """``value`` (a Metric, or values and Metrics in lists) as one Metric without a values list."""
    if isinstance(value, Metric):
        items: list[Any] = [value]
    else:
        items = leaves(value)
    for item in items:
        refuse_verl_metric(item, f"allgather_dict_into_dict[{key!r}]")
    metrics = [item for item in items if isinstance(item, Metric)]
    if metrics and len(metrics) != len(items):
        raise ValueError(f"allgather_dict_into_dict: {key!r} mixes Metric objects and plain values")
    kind = metrics[0].aggregation if metrics else key_rule(key)
    pooled = Metric(kind, keep_values=False)
    pooled.extend(items)
    pooled.key = key
    return pooled


def allgather_dict_into_dict(
    data: Mapping[str, Any], group: Any = None, *, timeout: float | None = None
) -> dict[str, list[Any]]:
    """Combine a metrics dict over a DP ``group`` with one metricsync sync (verl's helper).

    Every rank of ``group`` must call it. Each value is a :class:`Metric`, a
    (nested) list of values or of Metrics, or a single value; plain values
    take verl's key-name rule (max / min / mean). Each key comes back as a
    :class:`Metric` holding the whole group's state, which the caller's
    ``Metric.aggregate_dp`` reads as verl's number:

    - a Metric value -> ``[metric]``; a list -> ``[[metric]]``; a single
      value -> ``[metric]`` (verl returns one entry per rank; code that
      indexes ranks must read the entry with ``Metric.aggregate_dp``);
    - ranks may hold different keys (the union comes back) and different
      numbers of micro-batches.

    No pickle travels: verl's version is an ``all_gather_object`` of the dict.
    Without an initialized process group the result holds this rank alone.

    >>> out = allgather_dict_into_dict({"pg_loss": Metric("sum", [0.5, 0.25]), "clip": [0.1, 0.3]})
    >>> float(Metric.aggregate_dp(out["pg_loss"])), float(Metric.aggregate_dp(out["clip"][0]))
    (0.75, 0.2)
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"allgather_dict_into_dict expects a dict, got {type(data).__name__}")
    store = ms.Metrics()
    nested: dict[str, bool] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise TypeError(f"allgather_dict_into_dict: keys must be strings, got {key!r}")
        pooled = _pooled(key, value)
        name = _internal(key)
        store.define(name, SPECS[pooled.aggregation])
        local = summary(pooled)
        if local is None and pooled.aggregation is AggregationType.SUM:
            local = (0.0, 1.0)  # an empty rank's sum is 0.0, and the rank counts
        if local is not None:
            store.record(name, local[0], weight=local[1])
        if _is_metric_valued(value):  # what verl's aggregate_dp checks: each rank's count
            hexed = name[1:]
            store.define(f"f{hexed}", _FEWEST)
            store.define(f"m{hexed}", _MOST)
            store.define(f"w{hexed}", _MOST)
            if pooled._n:
                store.record(f"f{hexed}", pooled._n)
                store.record(f"m{hexed}", pooled._n)
            store.record(f"w{hexed}", float(pooled._weighted))
        nested[key] = isinstance(value, (list, tuple))
    synced = store.sync(group, timeout=timeout)
    computed = synced.compute()
    out: dict[str, list[Any]] = {}
    theirs = (_external(name) for name in synced.names if name.startswith("k"))
    for key in [*nested, *(key for key in theirs if key not in nested)]:
        name = _internal(key)
        kind = _KINDS.get(synced.spec(name), AggregationType.MEAN)
        if kind is AggregationType.MEAN:
            value, weight = computed.get(f"{name}/mean"), computed.get(f"{name}/count", 0.0)
        else:
            value, weight = computed.get(name), 1.0
        metric = from_summary(kind, value, weight)
        metric.key = key
        hexed = name[1:]
        if f"w{hexed}" in computed:  # Metric-valued on some rank: verl's count check applies
            metric._weighted = bool(computed[f"w{hexed}"])
            fewest, most = computed.get(f"f{hexed}", 0.0), computed.get(f"m{hexed}", 0.0)
            metric._counts = (int(fewest), int(most))
        else:  # plain values: verl pools them (its worker chains the ranks' lists)
            metric._counts = (0, 0)
        out[key] = [[metric]] if nested.get(key, False) else [metric]
    return out


_FEWEST = ms.Spec("min")
_MOST = ms.Spec("max")


def _is_metric_valued(value: Any) -> bool:
    return isinstance(value, Metric) or (
        isinstance(value, (list, tuple)) and any(isinstance(v, Metric) for v in leaves(value))
    )


def _internal(key: str) -> str:
    """The metric name a key travels under: its UTF-8 bytes in hex after a letter. No key
    is empty, none holds a glob character, and none is another's output key (``/`` never
    occurs in one), whatever verl's keys are: ``"score"`` and ``"score/mean"`` stay apart.

    >>> _internal("a/*"), _external(_internal("a/*")), _internal("")
    ('k612f2a', 'a/*', 'k')
    """
    return "k" + key.encode("utf-8", "surrogatepass").hex()


def _external(name: str) -> str:
    return bytes.fromhex(name[1:]).decode("utf-8", "surrogatepass")
