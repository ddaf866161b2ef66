"""verl's ``reduce_metrics``: each entry of a metrics dict reduced to one number, in place."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np

import metricsync as ms

from ._metric import AggregationType, Metric, WeightedMean
from ._mixed import refuse_verl_metric

__all__ = ["reduce_metrics"]

# Resolves names that no user spec matches: "*" is the shortest glob, so any other wins.
_NO_SPEC = ms.Spec("p0.0001", across="max", nan="error")


def key_rule(key: str) -> AggregationType:
    """verl's guess from the key name: "max" anywhere -> max, else "min" -> min, else mean."""
    if "max" in key:
        return AggregationType.MAX
    if "min" in key:
        return AggregationType.MIN
    return AggregationType.MEAN


def leaves(value: Any) -> list[Any]:
    """The items of a (nested) list or tuple, in order; a non-list is its own leaf."""
    if not isinstance(value, (list, tuple)):
        return [value]
    return [leaf for item in value for leaf in leaves(item)]


def _reduce_metric_list(key: str, items: list[Metric]) -> np.float64:
    kind = items[0].aggregation
    if kind is AggregationType.SUM:
        raise ValueError(
            f"reduce_metrics: {key!r} holds a list of {len(items)} SUM Metrics; it cannot tell "
            "gradient-accumulation micro-batches (to be added) from DP ranks (to be averaged). "
            "verl's own append_to_dict builds such a list of micro-batches when verl's modules "
            "were not switched: call metricsync.verl_compat.install() first. For one Metric per "
            "DP rank, call Metric.aggregate_dp(list)."
        )
    # MEAN, MIN, MAX: pooling every value is right whether the items are ranks or micro-batches.
    pooled = Metric(kind, keep_values=False)
    for item in items:
        pooled.extend(item)
    return pooled.aggregate()


def reduce_metrics(
    metrics: MutableMapping[str, Any], specs: Mapping[str, ms.Spec] | None = None
) -> MutableMapping[str, Any]:
    """Reduce each entry of ``metrics`` to a number, in place; returns ``metrics`` (as verl).

    - a :class:`Metric`: its :meth:`~Metric.aggregate`;
    - a (nested) list of ``MEAN``/``MIN``/``MAX`` :class:`Metric` objects: all
      their values pooled (a list of ``SUM`` metrics is ambiguous and raises);
    - a :class:`metricsync.Metrics`, or a list of them (one per worker, ``None``
      skipped): merged, and the entry is replaced by its ``compute()`` keys;
    - plain values (numbers, tensors, arrays, nested lists of them): verl's
      key-name rule: a key containing ``"max"`` takes the max, else one
      containing ``"min"`` the min, else the mean. Beware:
      ``"actor/minibatch_loss"`` and ``"timing/step"`` contain "min", so verl's
      rule takes their minimum. ``specs`` (names or globs to
      :class:`~metricsync.Spec`) overrides the rule; a spec with several
      statistics yields ``key/stat`` entries.

    Results are numpy float64. Empty lists give verl's numbers: NaN for a
    mean, ``ValueError`` for min/max (NaN for a user spec).

    >>> out = reduce_metrics({
    ...     "loss": [1.0, 2.0, 3.0],
    ...     "max_reward": [5.0, 8.0, 6.0],
    ...     "min_error": [0.1, 0.05, 0.2],
    ...     "actor/pg_loss": Metric("sum", [0.5, 0.25]),
    ... })
    >>> {k: float(v) for k, v in out.items()}
    {'loss': 2.0, 'max_reward': 8.0, 'min_error': 0.05, 'actor/pg_loss': 0.75}
    >>> reduce_metrics({"actor/minibatch_loss": [1.0, 3.0]}, specs={"actor/*": ms.Spec("mean")})
    {'actor/minibatch_loss': np.float64(2.0)}
    """
    rules = ms.Metrics({"*": _NO_SPEC, **dict(specs or {})})
    out: dict[str, Any] = {}
    for key, value in list(metrics.items()):
        refuse_verl_metric(value, f"reduce_metrics[{key!r}]")
        if isinstance(value, Metric):
            out[key] = value.aggregate()
            continue
        items = leaves(value)
        for item in items:
            refuse_verl_metric(item, f"reduce_metrics[{key!r}]")
        if any(isinstance(item, ms.Metrics) for item in items) and all(
            item is None or isinstance(item, ms.Metrics) for item in items
        ):
            merged = ms.collect(items)
            out.update((name, np.float64(v)) for name, v in merged.compute().items())
            continue
        if items and all(isinstance(item, WeightedMean) for item in items):
            weights = [item.weight for item in items]
            pooled = Metric(AggregationType.MEAN, [float(i) for i in items], weight=weights)
            out[key] = pooled.aggregate()
            continue
        n_metrics = sum(isinstance(item, Metric) for item in items)
        if n_metrics:
            if n_metrics != len(items):
                raise ValueError(f"reduce_metrics: {key!r} mixes Metric objects and plain values")
            out[key] = _reduce_metric_list(key, items)
            continue
        spec = rules.spec(key)
        if spec != _NO_SPEC:
            store = ms.Metrics({key: spec})
            for item in items:
                store.record(key, item)
            computed = store.compute()
            out.update((k, np.float64(computed.get(k, np.nan))) for k in spec.output_keys(key))
        else:
            try:
                out[key] = Metric._aggregate(items, key_rule(key))
            except (TypeError, ValueError) as exc:  # a None, a string ...: name the key
                raise type(exc)(f"reduce_metrics[{key!r}]: {exc}") from exc
    metrics.clear()
    metrics.update(out)
    return metrics
