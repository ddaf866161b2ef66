"""verl's metric names (``AggregationType``, ``Metric``, ``reduce_metrics``) backed by metricsync.

A verl-style codebase switches by changing one import::

    # from verl.utils.metric import AggregationType, Metric, reduce_metrics
    from metricsync.verl_compat import AggregationType, Metric, reduce_metrics

Meaning of the aggregation types, as in verl:

- ``MEAN``: the mean of the values (weighted when weights are given); across
  data-parallel (DP) ranks, the mean over every value of every rank.
- ``SUM``: on one rank, the sum over its values (one per gradient-accumulation
  micro-batch, typically); across DP ranks, the mean of the ranks' sums.
- ``MIN`` / ``MAX``: the smallest / largest value of every rank.

Each :class:`Metric` holds a one-name :class:`metricsync.Metrics` whose spec
encodes the aggregation (``SUM`` is ``Spec("sum", across="mean")``), so
``Metric.aggregate_dp`` is a metricsync merge and :meth:`Metric.sync` is a
metricsync sync: exact, constant memory, and tensors stay on their device.

>>> ranks = [Metric("sum"), Metric("sum")]
>>> ranks[0].extend([1.0, 2.0])          # rank 0: two micro-batches
>>> ranks[1].extend([3.0, 4.0, 5.0])     # rank 1: three micro-batches
>>> Metric.aggregate_dp(ranks)           # mean of the rank sums (3 and 12)
7.5

Where this differs from verl
----------------------------

Every difference is deliberate; each fixes a known defect or follows from
storing mergeable state instead of a list of values.

1. **Unequal micro-batch counts work.** verl stacks the ranks' value lists
   into one array and raises ``ValueError`` when ranks hold different numbers
   of values. Here ``SUM`` averages each rank's own sum, ``MEAN`` pools every
   value of every rank, ``MIN``/``MAX`` take the extreme of all values; for
   equal counts the results are verl's.
2. **Tensors are never ``.item()``-ed.** verl calls ``.item()`` on every
   appended tensor (one device-to-host stall per metric per micro-batch).
   Here a tensor is accumulated on its own device and read once, in
   :meth:`Metric.aggregate`. A tensor or array of any shape is accepted and
   each element is one value (verl rejects tensors with more than one
   element).
3. **Optional weights.** ``append(value, weight=w)``: ``MEAN`` becomes the
   weighted mean ``sum(w*x) / sum(w)`` (a token-weighted mean when ``w`` is
   the token count), ``SUM`` adds ``w*x``, ``MIN``/``MAX`` consider values
   with ``w > 0`` only. verl has no weights.
4. **No ``values`` list.** Memory is constant per metric; the state is
   metricsync's (:attr:`Metric.state`), and pickling (Ray) goes through
   metricsync's binary format.
5. **Empty metrics.** :meth:`Metric.aggregate` of a metric without values
   returns NaN (verl's result depends on numpy: NaN with a warning for a mean,
   an exception for min/max). In :meth:`Metric.aggregate_dp` a rank without
   values is left out of the DP mean (metricsync's ``across`` rule; verl's
   array form raises). An empty list of metrics raises ``ValueError`` as in
   verl.
6. **Mismatched aggregations raise.** ``aggregate_dp`` over metrics whose
   aggregation types differ raises ``ValueError`` (verl uses the first one).
7. **Input errors.** A value that is not a real number, array or tensor
   raises ``TypeError`` (verl: ``ValueError``); an unknown aggregation name
   raises ``ValueError`` as in verl.
8. **reduce_metrics returns a new dict** and leaves its argument unchanged
   (verl overwrites the lists in place and returns the same dict). Values are
   Python floats. An empty list gives NaN whatever the key (verl raises for
   "max"/"min" keys). A list whose items are all :class:`Metric` objects
   (one per DP rank) is reduced with :meth:`Metric.aggregate_dp`. The
   optional ``specs`` argument gives plain lists an explicit
   :class:`~metricsync.Spec` instead of the key-name guess.
9. **Extras.** verl's newer names ``accumulate`` and ``union`` are provided
   too, and :meth:`Metric.sync` combines a metric over a torch.distributed
   group with verl's DP meaning.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

from ._metrics import Metrics, merge
from ._spec import Spec, SpecTable

__all__ = ["AggregationType", "Metric", "reduce_metrics"]

_NAME = "value"


class AggregationType(Enum):
    """How a :class:`Metric` combines its values: ``MEAN``, ``SUM``, ``MIN`` or ``MAX``.

    >>> AggregationType("sum") is AggregationType.SUM
    True
    """

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_SPECS = {
    AggregationType.MEAN: Spec("mean"),
    AggregationType.SUM: Spec("sum", across="mean"),
    AggregationType.MIN: Spec("min"),
    AggregationType.MAX: Spec("max"),
}


def _aggregation(aggregation: str | AggregationType) -> AggregationType:
    if isinstance(aggregation, AggregationType):
        return aggregation
    if not isinstance(aggregation, str):
        raise TypeError(
            "aggregation must be an AggregationType or one of 'mean', 'sum', 'min', 'max', "
            f"got {type(aggregation).__name__}"
        )
    try:
        return AggregationType(aggregation)
    except ValueError:
        raise ValueError(
            f"unsupported aggregation type {aggregation!r}: expected 'mean', 'sum', 'min' or 'max'"
        ) from None


def _rebuild(aggregation: str, data: bytes) -> Metric:
    metric = Metric(aggregation)
    metric._state = Metrics.from_bytes(data)
    return metric


class Metric:
    """One metric's values on one rank, combined by an :class:`AggregationType`.

    Args:
        aggregation: ``"mean"``, ``"sum"``, ``"min"``, ``"max"`` or an
            :class:`AggregationType`.
        value: optional first value(s): a number, tensor, array, list of them,
            or another :class:`Metric`.
        weight: optional weight of ``value`` (see :meth:`append`).

    >>> m = Metric("mean", 1.0)
    >>> m.append(2.0)
    >>> m.append(3.0)
    >>> m.aggregate()
    2.0
    >>> tokens = Metric(AggregationType.MEAN)
    >>> tokens.append(2.0, weight=100)   # micro-batch mean over 100 tokens
    >>> tokens.append(1.0, weight=300)   # ... and over 300 tokens
    >>> tokens.aggregate()               # the token-weighted mean
    1.25
    """

    __slots__ = ("_state", "aggregation")

    aggregation: AggregationType
    _state: Metrics

    def __init__(
        self,
        aggregation: str | AggregationType,
        value: Any = None,
        *,
        weight: Any = None,
    ) -> None:
        self.aggregation = _aggregation(aggregation)
        self._state = Metrics({_NAME: _SPECS[self.aggregation]})
        if value is not None:
            self.append(value, weight=weight)

    # ------------------------------------------------------------ recording

    def append(self, value: Any, *, weight: Any = None) -> None:
        """Add ``value``: a number, tensor or array (each element one value).

        A :class:`Metric` is merged in (see :meth:`extend`); a list or tuple
        adds each item. Tensors stay on their device; nothing is read from it
        here. ``weight`` is a scalar or an array broadcastable to ``value``.

        >>> m = Metric("max")
        >>> m.append([3.0, 7.0])
        >>> m.append(5.0)
        >>> m.aggregate()
        7.0
        """
        if isinstance(value, Metric):
            if weight is not None:
                raise TypeError("a weight cannot be given when appending a Metric")
            self.extend(value)
        elif isinstance(value, (list, tuple)):
            self.extend(value, weights=None if weight is None else [weight] * len(value))
        else:
            self._state.record(_NAME, value, weight=weight)

    def extend(
        self, values: Metric | Iterable[Any], *, weights: Iterable[Any] | None = None
    ) -> None:
        """Add several values (optionally with one weight each), or merge another Metric.

        Merging a :class:`Metric` pools its values with this metric's, as if
        they had been appended here; its aggregation must be the same.

        >>> a, b = Metric("sum", [1.0, 2.0]), Metric("sum", 3.0)
        >>> a.extend(b)
        >>> a.aggregate()
        6.0
        >>> a.extend(Metric("mean"))
        Traceback (most recent call last):
        ...
        ValueError: aggregation type mismatch: sum != mean
        """
        if isinstance(values, Metric):
            if weights is not None:
                raise TypeError("weights cannot be given when extending with a Metric")
            self._pool(values)
            return
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(
                f"extend takes a Metric or an iterable of values, got {type(values).__name__}"
            )
        items = list(values)
        if weights is None:
            for item in items:
                self.append(item)
            return
        ws = list(weights)
        if len(ws) != len(items):
            raise ValueError(f"extend got {len(items)} values but {len(ws)} weights")
        for item, w in zip(items, ws):
            self.append(item, weight=w)

    def accumulate(self, value: Any) -> None:
        """verl's newer name for adding values: same as :meth:`append`."""
        self.append(value)

    def _pool(self, other: Metric) -> None:
        if other.aggregation is not self.aggregation:
            raise ValueError(
                f"aggregation type mismatch: {self.aggregation.value} != {other.aggregation.value}"
            )
        if self.aggregation is AggregationType.SUM:
            # ``across="mean"`` would count ``other`` as another rank; pool its sum instead.
            if _NAME in other._state:
                self._state.record(_NAME, other.aggregate())
        else:
            self._state.merge(other._state)

    # ------------------------------------------------------------ results

    def aggregate(self) -> float:
        """This metric's value as a Python float (NaN when it holds no values).

        >>> Metric("sum", [1.0, 2.0, 3.0, 4.0]).aggregate()
        10.0
        >>> Metric("min").aggregate()
        nan
        """
        return self._state.compute().get(_NAME, math.nan)

    @classmethod
    def aggregate_dp(cls, metric_lists: Sequence[Metric]) -> float:
        """Combine one :class:`Metric` per data-parallel rank into one float.

        ``SUM``: the mean over ranks of each rank's sum. ``MEAN``: the mean of
        every value of every rank (weighted when weights were given).
        ``MIN``/``MAX``: over every value. Ranks may hold different numbers of
        values; ranks holding none are left out.

        >>> ranks = [Metric("mean", [1.0, 2.0]), Metric("mean", [3.0, 4.0])]
        >>> Metric.aggregate_dp(ranks)
        2.5
        >>> Metric.aggregate_dp([Metric("max", [1.0, 2.0]), Metric("max", [3.0])])
        3.0
        """
        metrics = list(metric_lists)
        if not metrics:
            raise ValueError("cannot aggregate an empty list of metrics")
        for item in metrics:
            if not isinstance(item, Metric):
                raise TypeError(f"aggregate_dp takes Metric objects, got {type(item).__name__}")
        kinds = {m.aggregation for m in metrics}
        if len(kinds) > 1:
            names = ", ".join(sorted(k.value for k in kinds))
            raise ValueError(f"aggregation type mismatch across ranks: {names}")
        return merge(m._state for m in metrics).compute().get(_NAME, math.nan)

    @classmethod
    def union(cls, *metrics: Metric) -> Metric:
        """A new Metric pooling the values of ``metrics`` (verl's newer name).

        >>> Metric.union(Metric("mean", 1.0), Metric("mean", [2.0, 3.0])).aggregate()
        2.0
        """
        if not metrics:
            raise ValueError("cannot union an empty set of metrics")
        result = cls(metrics[0].aggregation)
        for metric in metrics:
            result.extend(metric)
        return result

    def sync(self, group: Any = None, *, timeout: float | None = None) -> Metric:
        """This metric combined over a torch.distributed ``group`` (every rank must call it).

        The result's :meth:`aggregate` equals :meth:`aggregate_dp` over the
        ranks' metrics; without an initialized process group, a copy.
        """
        result = type(self)(self.aggregation)
        result._state = self._state.sync(group, timeout=timeout)
        return result

    # ------------------------------------------------------------ helpers

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], aggregation: str | AggregationType
    ) -> dict[str, Metric]:
        """One Metric per key of ``data``, each holding that key's value.

        >>> m = Metric.from_dict({"loss": 1.5, "clipfrac": 0.25}, aggregation="mean")
        >>> {k: v.aggregate() for k, v in m.items()}
        {'loss': 1.5, 'clipfrac': 0.25}
        """
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """A new, empty Metric with the same aggregation.

        >>> Metric("max", 3.0).init_list().aggregation
        <AggregationType.MAX: 'max'>
        """
        return type(self)(self.aggregation)

    @property
    def state(self) -> Metrics:
        """The metricsync :class:`~metricsync.Metrics` behind this metric (one name, ``"value"``)."""
        return self._state

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.aggregation.value, self._state.to_bytes()))

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r})"


def _key_rule(key: str) -> Spec:
    """verl's guess from the key name: "max" anywhere -> max, else "min" -> min, else mean."""
    if "max" in key:
        return _SPECS[AggregationType.MAX]
    if "min" in key:
        return _SPECS[AggregationType.MIN]
    return _SPECS[AggregationType.MEAN]


def reduce_metrics(
    metrics: Mapping[str, Any], specs: Mapping[str, Spec] | None = None
) -> dict[str, float]:
    """Reduce each entry of ``metrics`` to a float; returns a new dict.

    - a :class:`Metric`: its :meth:`~Metric.aggregate`;
    - a list of :class:`Metric` (one per DP rank): :meth:`Metric.aggregate_dp`;
    - a plain list (or a single value): reduced by verl's key-name rule: a key
      containing ``"max"`` takes the max, else one containing ``"min"`` the
      min, else the mean. Beware: ``"actor/minibatch_loss"`` and
      ``"timing/step"`` contain "min", so verl's rule takes their minimum.
      ``specs`` (names or globs to :class:`~metricsync.Spec`) overrides the
      rule; a spec with several statistics yields ``key/stat`` entries.

    An empty list gives NaN.

    >>> reduce_metrics({
    ...     "loss": [1.0, 2.0, 3.0],
    ...     "max_reward": [5.0, 8.0, 6.0],
    ...     "min_error": [0.1, 0.05, 0.2],
    ...     "actor/pg_loss": Metric("sum", [0.5, 0.25]),
    ... })
    {'loss': 2.0, 'max_reward': 8.0, 'min_error': 0.05, 'actor/pg_loss': 0.75}
    >>> reduce_metrics({"actor/minibatch_loss": [1.0, 3.0]}, specs={"actor/*": Spec("mean")})
    {'actor/minibatch_loss': 2.0}
    """
    table = SpecTable(dict(specs)) if specs else None
    plain: dict[str, Spec] = {}
    for key, value in metrics.items():
        if isinstance(value, Metric):
            continue
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, Metric) for v in value):
            continue
        explicit = table.explicit(key) if table is not None else None
        plain[key] = explicit or _key_rule(key)
    store = Metrics(plain)
    for key in plain:
        value = metrics[key]
        for item in value if isinstance(value, (list, tuple)) else [value]:
            store.record(key, item)
    computed = store.compute()
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Metric):
            out[key] = value.aggregate()
        elif key not in plain:
            out[key] = Metric.aggregate_dp(value)
        else:
            for out_key in plain[key].output_keys(key):
                out[out_key] = computed.get(out_key, math.nan)
    return out
