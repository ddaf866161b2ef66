"""verl's ``AggregationType`` and ``Metric``, each metric backed by a one-name ``metricsync.Metrics``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

import metricsync as ms

from .._record import _convert
from ._aggregation import SPECS, AggregationType, aggregation_type
from ._mixed import MixedMetricError, is_switched, is_verl_metric, refuse_verl_metric

__all__ = ["AggregationType", "Metric", "WeightedMean"]

_NAME = "value"


def _capture(value: Any) -> Any:
    """What ``Metric.values`` keeps of one appended value (a copy: later writes do not leak in)."""
    if isinstance(value, (bool, int, float, np.generic)):
        return value
    if hasattr(value, "detach") and hasattr(value, "clone"):
        return value.detach().clone()  # a device copy: nothing is read from the device here
    return np.array(value, dtype=np.float64, copy=True)


def _flatten(item: Any) -> list[Any]:
    if isinstance(item, (bool, int, float, np.generic)):
        return [item]
    if hasattr(item, "detach"):
        return list(item.detach().reshape(-1).tolist())
    return list(np.asarray(item).reshape(-1).tolist())


def _size(value: Any) -> int:
    """How many values ``value`` holds (elements of a tensor or array); nothing is read from a device."""
    if isinstance(value, (bool, int, float, np.generic)):
        return 1
    numel = getattr(value, "numel", None)
    if callable(numel):
        return int(numel())
    return int(np.size(value))


def _rebuild(
    aggregation: str, data: bytes, values: bytes | None, extra: tuple[Any, ...] = ()
) -> Metric:
    metric = Metric(aggregation, keep_values=values is not None)
    metric._store = ms.Metrics.from_bytes(data)
    if values is not None:
        if len(values) % 8:
            raise ms.CodecError(f"a Metric's values take 8 bytes each, got {len(values)} bytes")
        metric._values = [float(v) for v in np.frombuffer(values, dtype="<f8")]
    if extra:
        metric._n, metric._weighted, metric._counts, metric.key, switched = extra
        # Made where verl's modules were switched, read where they are not: verl's own code would.
        metric._foreign = switched and not is_switched()
    return metric


class WeightedMean(np.float64):
    """A ``MEAN``'s number (a numpy float64) that also carries its total ``weight``.

    :meth:`Metric.aggregate_dp` returns it for token-weighted metrics, so that
    verl's worker, which collects one number per mini-batch, hands the weight
    on: this package's ``append_to_dict`` and ``reduce_metrics`` pool such
    numbers by their weights. Anywhere else it is the plain number.

    >>> x = WeightedMean(0.25, weight=40)
    >>> x, x.weight, x + 1
    (np.float64(0.25), 40.0, np.float64(1.25))

    A pickle of it is numpy's float64, without the weight: verl's worker
    consumes it before anything crosses a process boundary.
    """

    weight: float

    def __new__(cls, value: Any, weight: Any) -> WeightedMean:
        obj = super().__new__(cls, value)
        obj.weight = float(weight)
        return obj


class Metric:
    """One metric's values on one rank, combined by an :class:`AggregationType` (verl's names).

    Args:
        aggregation: ``"mean"``, ``"sum"``, ``"min"``, ``"max"`` or an
            :class:`AggregationType`.
        value: optional first value(s): a number, tensor, array, list of them,
            or another :class:`Metric`.
        weight: optional weight of ``value`` (see :meth:`append`).
        keep_values: keep :attr:`values` (default: the class attribute
            ``Metric.keep_values``, True as in verl).

    >>> m = Metric("mean", 1.0)
    >>> m.append(2.0)
    >>> m.append(3.0)
    >>> m.aggregate()
    np.float64(2.0)
    >>> m.values
    [1.0, 2.0, 3.0]
    >>> tokens = Metric(AggregationType.MEAN)
    >>> tokens.append(2.0, weight=100)   # micro-batch mean over 100 tokens
    >>> tokens.append(1.0, weight=300)   # ... and over 300 tokens
    >>> float(tokens.aggregate())        # the token-weighted mean
    1.25
    """

    __slots__ = (
        "_counts",
        "_foreign",
        "_n",
        "_store",
        "_values",
        "_weighted",
        "aggregation",
        "key",
    )

    #: Default of ``keep_values`` for new metrics. ``values`` costs memory in
    #: the number of appends (verl's cost); set False for constant memory.
    keep_values: ClassVar[bool] = True

    aggregation: AggregationType
    #: The metrics-dict key this metric was gathered under (set by the DP gather), for messages.
    key: str | None
    _store: ms.Metrics
    _values: list[Any] | None
    _n: int  # values recorded here (elements)
    _weighted: bool  # a weight was given to some value
    _counts: (
        tuple[int, int] | None
    )  # a gathered metric: fewest and most values of a rank holding any
    _foreign: bool  # unpickled in a process whose verl modules were not switched

    def __init__(
        self,
        aggregation: str | AggregationType,
        value: Any = None,
        *,
        weight: Any = None,
        keep_values: bool | None = None,
    ) -> None:
        self.aggregation = aggregation_type(aggregation)
        self._store = ms.Metrics({_NAME: SPECS[self.aggregation]})
        keep = type(self).keep_values if keep_values is None else keep_values
        self._values = [] if keep else None
        self._n = 0
        self._weighted = False
        self._counts = None
        self._foreign = False
        self.key = None
        if value is not None:
            self.append(value, weight=weight)

    # ------------------------------------------------------------ recording

    def append(self, value: Any, *, weight: Any = None) -> None:
        """Add ``value``: a number, tensor or array (each element one value).

        A :class:`Metric` is merged in (see :meth:`extend`); a list or tuple
        adds each item; a :class:`WeightedMean` brings its weight. Tensors stay on their device; nothing is read from it
        here. ``weight`` is a scalar or an array broadcastable to ``value``
        (for a list, a scalar or a list of one weight per item). Anything
        else raises ``ValueError`` (as verl).

        >>> m = Metric("max")
        >>> m.append([3.0, 7.0])
        >>> m.append(5.0)
        >>> float(m.aggregate())
        7.0
        """
        if isinstance(value, Metric) or is_verl_metric(value):
            if weight is not None:
                raise ValueError("a weight cannot be given when appending a Metric")
            self.extend(value)
            return
        if weight is None and type(value) is WeightedMean:
            weight = value.weight  # a token mean that carries its token count
        if isinstance(value, (list, tuple)):
            if weight is None or isinstance(weight, (list, tuple)):
                self.extend(value, weights=weight)  # one weight per item
            else:
                self.extend(value, weights=[weight] * len(value))
            return
        if value is None or isinstance(value, (str, bytes, complex, Mapping)):
            raise ValueError(
                f"Unsupported value type: {type(value).__name__} (expected a real number, "
                "a numpy array or a torch tensor)"
            )
        if _on_accelerator(value):  # verl reads the value at append (.item()): keep it
            value = value.detach().clone()
        try:
            self._store.record(_NAME, value, weight=weight)
        except TypeError as exc:
            raise ValueError(f"Unsupported value: {exc}") from exc
        self._n += 1 if type(value) is float else _size(value)
        if weight is not None:
            self._weighted = True
        if self._values is not None:
            self._values.append(_capture(value))

    def extend(
        self, values: Metric | Iterable[Any], *, weights: Iterable[Any] | None = None
    ) -> None:
        """Add several values (optionally one weight each), or pool another Metric.

        Pooling a :class:`Metric` adds its values as if they had been appended
        here; its aggregation must be the same (``ValueError`` as in verl).

        >>> a, b = Metric("sum", [1.0, 2.0]), Metric("sum", 3.0)
        >>> a.extend(b)
        >>> float(a.aggregate()), a.values
        (6.0, [1.0, 2.0, 3.0])
        >>> a.extend(Metric("mean"))
        Traceback (most recent call last):
        ...
        ValueError: Aggregation type mismatch: sum != mean
        """
        refuse_verl_metric(values, f"Metric({self.aggregation.value!r}).extend")
        if isinstance(values, Metric):
            if weights is not None:
                raise ValueError("weights cannot be given when extending with a Metric")
            self._pool(values)
            return
        if not isinstance(values, Iterable):  # TypeError, as verl's loop over it
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

    def _pool(self, other: Metric) -> None:
        if other.aggregation is not self.aggregation:
            raise ValueError(
                f"Aggregation type mismatch: {self.aggregation.value} != {other.aggregation.value}"
            )
        if self.aggregation is AggregationType.SUM:
            # across="mean" would count ``other`` as another rank; add its sum here instead.
            if _NAME in other.state:
                self._store.record(_NAME, other.aggregate())
        else:
            self._store.merge(other.state)
        self._n += other._n
        self._weighted = self._weighted or other._weighted
        if self._values is not None:
            theirs = other._values
            self._values = None if theirs is None else self._values + theirs

    # ------------------------------------------------------------ results

    @property
    def values(self) -> list[Any]:
        """Every appended value, one entry per element, in order (verl's list).

        Costs memory in the number of appends (one number per scalar, a copy
        of each tensor or array); ``keep_values=False`` (per metric, or
        ``Metric.keep_values = False`` for all new ones) turns it off and
        makes a metric constant-size. Weights are not part of it. Reading it
        copies appended tensors to the host. Metrics made by a sync or a DP
        gather keep no values (state travels, not values).

        >>> Metric("sum", [1, 2.5]).values
        [1, 2.5]
        """
        if self._foreign and not is_switched():
            raise _mixed(self, "its values list was read")
        if self._values is None:
            raise AttributeError(
                f"Metric({self.aggregation.value!r}) keeps no values list: it was made with "
                "keep_values=False, or by a sync/DP gather, which moves state, not values"
            )
        return [v for item in self._values for v in _flatten(item)]

    def aggregate(self) -> np.float64:
        """This metric's value as a numpy float64 (as verl's numpy result).

        Without values: ``SUM`` gives 0.0, ``MEAN`` NaN, ``MIN``/``MAX`` raise
        ``ValueError`` (verl's numpy outcomes).

        >>> Metric("sum", [1.0, 2.0, 3.0, 4.0]).aggregate()
        np.float64(10.0)
        >>> Metric("sum").aggregate()
        np.float64(0.0)
        """
        return result(self.aggregation, self._store.compute())

    def __radd__(self, other: object) -> Any:
        """``number + metric`` is the number plus :meth:`aggregate`: verl code that sums the
        per-rank entries of a gathered key (``sum(v) / len(v)``, as verl's workers do for
        MTP losses) reads the group's value from the one entry the gather returns.

        >>> sum([Metric("mean", [0.5, 1.5])]) / 1
        np.float64(1.0)
        """
        if self._foreign and not is_switched():
            raise _mixed(self, "it was added to a number")
        if isinstance(other, (int, float, np.number)) and not isinstance(other, bool):
            return other + self.aggregate()
        return NotImplemented

    def __getitem__(self, index: int) -> Metric:
        """``metric[0]`` is the metric: the one entry of a gathered single value, read as verl
        reads a per-rank list (``sublist[0]``, verl's MTP losses)."""
        if index in (0, -1):
            return self
        raise IndexError(f"{self!r} reads as a one-entry list; index {index} is out of range")

    # verl's own code (its reduce_metrics, numpy) treating a Metric as a number or a list.
    __array_ufunc__ = None  # ``np.float64(1) + metric`` defers to __radd__

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise _misuse(self, "numpy")

    def __iter__(self) -> Any:
        raise _misuse(self, "iteration")

    def __float__(self) -> float:
        raise _misuse(self, "float()")

    def __add__(self, other: object) -> Any:
        raise _misuse(self, "+")

    @classmethod
    def _aggregate(cls, values: Iterable[Any], aggregation: str | AggregationType) -> np.float64:
        """verl's helper: aggregate a list of values without making a Metric first.

        >>> Metric._aggregate([1.0, 4.0], AggregationType.MAX)
        np.float64(4.0)
        """
        metric = cls(aggregation, keep_values=False)
        metric.extend(values)
        return metric.aggregate()

    @classmethod
    def aggregate_dp(cls, metric_lists: Sequence[Metric]) -> np.float64:
        """Combine one :class:`Metric` per data-parallel rank into one number.

        ``SUM``: the mean over ranks of each rank's sum (a rank without
        values sums to 0.0). ``MEAN``: the mean of every value of every rank;
        with weights (token counts, see :func:`install`), the weighted mean,
        returned as a :class:`WeightedMean` that carries the total weight.
        ``MIN``/``MAX``: over every value. Ranks holding different numbers of
        values are fine for ``SUM``, ``MIN``, ``MAX`` and weighted ``MEAN``;
        an unweighted ``MEAN`` raises ``ValueError`` there, as verl does (its
        mean of micro-batch means has no right answer without the token
        counts). A rank holding no values is left out of ``MEAN``/``MIN``/``MAX``.

        >>> ranks = [Metric("sum", [1.0, 2.0]), Metric("sum", [3.0, 4.0, 5.0])]
        >>> Metric.aggregate_dp(ranks)           # mean of the rank sums 3 and 12
        np.float64(7.5)
        >>> Metric.aggregate_dp([Metric("sum"), Metric("sum", [3.0, 4.0])])   # sums 0 and 7
        np.float64(3.5)
        """
        metrics = list(metric_lists)
        if not metrics:
            raise ValueError("Cannot aggregate an empty list of metrics.")
        for item in metrics:
            refuse_verl_metric(item, "Metric.aggregate_dp")
            if not isinstance(item, Metric):
                raise TypeError(f"aggregate_dp takes Metric objects, got {type(item).__name__}")
        kinds = {m.aggregation for m in metrics}
        if len(kinds) > 1:
            names = ", ".join(sorted(k.value for k in kinds))
            raise ValueError(f"aggregation type mismatch across ranks: {names}")
        kind = metrics[0].aggregation
        weighted = any(m._weighted for m in metrics)
        if kind is AggregationType.MEAN and not weighted:
            _check_counts(metrics)
        if kind is AggregationType.SUM:  # an empty rank's sum is 0.0, and it is a rank
            states = [m.state if summary(m) is not None else _zero_sum() for m in metrics]
        else:
            states = [m.state for m in metrics]
        computed = ms.merge(states).compute()
        value = result(kind, computed)
        if kind is AggregationType.MEAN and weighted:
            return WeightedMean(value, computed.get(f"{_NAME}/count", 0.0))
        return value

    def sync(self, group: Any = None, *, timeout: float | None = None) -> Metric:
        """This metric combined over a torch.distributed ``group`` (every rank must call it).

        The result's :meth:`aggregate` equals :meth:`aggregate_dp` over the
        ranks' metrics, and it keeps no :attr:`values`. Without an initialized
        process group, a copy.
        """
        out = type(self)(self.aggregation, keep_values=False)
        out._store = self._store.sync(group, timeout=timeout)
        out._weighted = self._weighted
        out._counts = (0, 0)  # the ranks' counts are not gathered: nothing to check
        out.key = self.key
        return out

    # ------------------------------------------------------------ helpers

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        aggregation: str | AggregationType,
        *,
        weight: Any = None,
    ) -> dict[str, Metric]:
        """One Metric per key of ``data``, each holding that key's value (and ``weight``).

        >>> m = Metric.from_dict({"loss": 1.5, "clipfrac": 0.25}, aggregation="mean")
        >>> {k: float(v.aggregate()) for k, v in m.items()}
        {'loss': 1.5, 'clipfrac': 0.25}
        """
        return {key: cls(aggregation, value, weight=weight) for key, value in data.items()}

    def init_list(self) -> Metric:
        """A new, empty Metric with the same aggregation.

        >>> Metric("max", 3.0).init_list().aggregation
        <AggregationType.MAX: 'max'>
        """
        return type(self)(self.aggregation, keep_values=self._values is not None)

    @property
    def state(self) -> ms.Metrics:
        """The :class:`metricsync.Metrics` behind this metric (one name, ``"value"``)."""
        return self._store

    def __reduce__(self) -> tuple[Any, ...]:
        values = None
        if self._values is not None:
            values = np.asarray(self.values, dtype="<f8").tobytes()
        extra = (self._n, self._weighted, self._counts, self.key, is_switched())
        return (_rebuild, (self.aggregation.value, self._store.to_bytes(), values, extra))

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r})"


def result(aggregation: AggregationType, computed: Mapping[str, float]) -> np.float64:
    """The number an aggregation gives from a ``compute()`` of a Metric's store."""
    key = f"{_NAME}/mean" if aggregation is AggregationType.MEAN else _NAME
    if key in computed:
        return np.float64(computed[key])
    if aggregation is AggregationType.SUM:
        return np.float64(0.0)
    if aggregation is AggregationType.MEAN:
        return np.float64(np.nan)
    raise ValueError(
        f"cannot take the {aggregation.value} of a Metric without values "
        "(verl: numpy's zero-size reduction error)"
    )


def _check_counts(metrics: list[Metric]) -> None:
    """Raise as verl does when the ranks of an unweighted MEAN hold different numbers of values."""
    shown: list[str] = []
    held: set[int] = set()
    for m in metrics:
        if m._counts is None:  # one rank
            shown.append(str(m._n))
            held.add(m._n)
        elif m._counts[1]:  # a gathered group: its ranks' fewest and most
            lo, hi = m._counts
            shown.append(str(lo) if lo == hi else f"{lo} to {hi}")
            held.update((lo, hi))
    held.discard(0)
    if len(held) > 1:
        name = next((m.key for m in metrics if m.key is not None), None)
        what = f"{name!r}" if name is not None else "a MEAN metric"
        raise ValueError(
            f"{what}: DP ranks hold different numbers of values for dp aggregation "
            f"[{', '.join(shown)}], and the values carry no weights: verl raises here, and "
            "a mean of micro-batch means is not the token mean. Use "
            "metricsync.verl_compat.install(token_mean=True) (verl's token-mean metrics then "
            "carry their token counts), or append with weight=..."
        )


def _zero_sum() -> ms.Metrics:
    return from_summary(AggregationType.SUM, 0.0, 1.0).state


def _mixed(metric: Metric, what: str) -> MixedMetricError:
    return MixedMetricError(
        f"{metric!r}{'' if metric.key is None else f' ({metric.key!r})'}: {what} in a process "
        "whose verl modules are not switched to metricsync (verl's own reduce_metrics or numpy "
        "reading a metricsync Metric, as when only the workers called install()); verl's own "
        "functions would read it without its weights, or fail. Call "
        "metricsync.verl_compat.install() in every process (driver and workers) before verl "
        "records or reduces its first metric."
    )


def _misuse(metric: Metric, op: str) -> Exception:
    """The error for verl's (or numpy's) code treating a Metric as a number or a list."""
    if not is_switched():
        return _mixed(metric, f"{op} was applied to it")
    return TypeError(
        f"{op} on {metric!r}: a Metric is not a number; reduce it with aggregate(), "
        "Metric.aggregate_dp or reduce_metrics"
    )


def summary(metric: Metric) -> tuple[float, float] | None:
    """``(value, weight)`` that re-recorded into a spec of ``SPECS`` reproduce ``metric``; None if empty."""
    computed = metric.state.compute()
    if metric.aggregation is AggregationType.MEAN:
        count = computed.get(f"{_NAME}/count", 0.0)
        return None if not count else (computed[f"{_NAME}/mean"], count)
    if _NAME not in computed:
        return None
    return (computed[_NAME], 1.0)


def _on_accelerator(value: Any) -> bool:
    """A torch tensor outside host memory: metricsync keeps a reference to it until a fold."""
    device = getattr(value, "device", None)
    return _convert.is_torch(value) and getattr(device, "type", "cpu") not in (
        _convert.HOST_DEVICE_TYPES
    )


def from_summary(aggregation: AggregationType, value: float | None, weight: float) -> Metric:
    """A Metric without a values list holding one (weighted) value, or none."""
    metric = Metric(aggregation, keep_values=False)
    if value is not None:
        metric._store.record(_NAME, value, weight=weight)
    return metric
