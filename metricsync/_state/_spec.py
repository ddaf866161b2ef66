"""Metric specs: which statistics a name reports, how ranks combine, how values print.

A :class:`Spec` is an immutable, hashable value; equal specs can share one instance
(:func:`canonical`); which spec a name gets is :mod:`metricsync._state._rules`.

>>> import metricsync as ms
>>> ms.Spec("max") == ms.Spec(("max",))
True
>>> ms.Spec(("mean", "p99")).output_keys("response_length")
('response_length/mean', 'response_length/p99')
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any, Literal

from ._lru import LRU
from ._sketch import sketch_layout

__all__ = [
    "ACROSS_MODES",
    "Across",
    "NanPolicy",
    "QuantileMethod",
    "canonical",
    "MAX_FMT_NUMBER",
    "MAX_STATS",
    "NAN_POLICIES",
    "PLAIN_STATS",
    "QUANTILE_METHODS",
    "DEFAULT_SPEC",
    "Spec",
    "quantile_of",
]

#: how ranks are combined (``Spec(across=...)``)
Across = Literal["exact", "mean", "sum", "min", "max", "first"]
#: what non-finite samples do (``Spec(nan=...)``)
NanPolicy = Literal["propagate", "ignore", "error"]
#: how a quantile is read from the sketch (``Spec(quantile_method=...)``)
QuantileMethod = Literal["linear", "inverted_cdf"]

PLAIN_STATS = ("mean", "sum", "count", "min", "max", "last", "std", "var")
ACROSS_MODES = ("exact", "mean", "sum", "min", "max", "first")
NAN_POLICIES = ("propagate", "ignore", "error")
QUANTILE_METHODS = ("linear", "inverted_cdf")
MAX_STATS = 32  #: statistics one spec may ask for (bounds the work of compute() per metric)
MAX_FMT_NUMBER = 100  #: largest width or precision a format spec may ask for
_QUANTILE = re.compile(r"p(\d{1,3}(?:\.\d{1,6})?)")
_FMT_NUMBER = re.compile(r"\d+")


def quantile_of(stat: str) -> float | None:
    """The quantile in [0, 1] a ``pNN`` statistic asks for, or None for other statistics.

    >>> quantile_of("p99.9"), quantile_of("p0"), quantile_of("mean")
    (0.999, 0.0, None)
    """
    match = _QUANTILE.fullmatch(stat)
    if match is None:
        return None
    percent = float(match.group(1))
    if percent > 100.0:
        return None
    return float(match.group(1) + "e-2")  # exact decimal scaling: p99.9 -> 0.999


def _check_fmt(fmt: str | None) -> str | None:
    if fmt is None:
        return None
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format spec string like '.3f' or None, got {fmt!r}")
    if len(fmt) > 40 or any(
        len(digits) > 3 or int(digits) > MAX_FMT_NUMBER for digits in _FMT_NUMBER.findall(fmt)
    ):
        raise ValueError(
            f"fmt {fmt[:40]!r} asks for a width or precision above the limit of {MAX_FMT_NUMBER}"
        )
    try:
        format(1.5, fmt)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"fmt must be a Python format spec without braces (like '.3f', '.2e', ',.0f'), "
            f"got {fmt!r}: {exc}"
        ) from None
    return fmt


class Spec:
    """How one metric is reduced, combined across ranks, and printed.

    Args:
        reduce: one statistic or a tuple of them: ``mean``, ``sum``, ``count``,
            ``min``, ``max``, ``last``, ``std``, ``var`` or a quantile ``pNN``.
        across: ``"exact"`` pools every sample of every rank; ``"mean"``,
            ``"sum"``, ``"min"``, ``"max"`` combine each rank's own result;
            ``"first"`` keeps the result of the lowest-ranked holder (in
            ``merge``, the left-most operand holding samples).
        fmt: a format spec without braces (``".3f"``), or None for adaptive.
        nan: ``"propagate"``, ``"ignore"`` (drop non-finite samples and count
            them) or ``"error"`` (raise ``ValueError``).
        accuracy: relative accuracy of the quantile sketch; specs without a quantile
            between p0 and p100 ignore it (it reads back as the default 0.01).
        ddof: delta degrees of freedom of ``var`` and ``std``: the second moment
            is divided by ``W - ddof * sum(w**2) / W``, where ``W`` is the sum of
            weights (``n - ddof`` for ``n`` unweighted samples). 0 (population,
            numpy's default) or 1 (torch's default). Weights act as reliability
            weights (numpy's ``cov(aweights=)``): their scale changes nothing.
        quantile_method: ``"linear"`` (numpy's default: linear interpolation
            between the two order statistics around ``q * (n - 1)``, each
            sample counting by its weight relative to the mean weight) or
            ``"inverted_cdf"`` (nearest rank: the first sample whose cumulative
            weight reaches ``q * W``). Either is estimated from the sketch
            within its relative accuracy, depends on the proportions of the
            weights only, and is numpy's answer for equal weights.
        argrank: also report ``name/max_rank`` and ``name/min_rank``, the rank
            (in the group of the latest ``sync``) that held the largest and
            smallest sample (lowest rank on ties; under ``nan="propagate"`` a
            NaN counts as the largest and smallest), known after ``sync``; a
            straggler view for ``timing/*``. Needs ``across="exact"``.

    >>> spec = Spec(("mean", "p99"), fmt=".0f")
    >>> spec.reduce, spec.across, spec.quantiles
    (('mean', 'p99'), 'exact', (0.99,))
    >>> Spec("median")
    Traceback (most recent call last):
    ...
    ValueError: unknown statistic 'median': expected one of mean, sum, count, min, max, last, std, var or a quantile like p50, p99.9
    """

    __slots__ = (
        "_hash",
        "_key",
        "accuracy",
        "across",
        "argrank",
        "ddof",
        "fmt",
        "nan",
        "needs_sketch",
        "quantile_method",
        "quantiles",
        "reduce",
    )

    _key: tuple[Any, ...]
    _hash: int
    reduce: tuple[str, ...]
    across: Across
    fmt: str | None
    nan: NanPolicy
    accuracy: float
    quantiles: tuple[float, ...]
    ddof: int
    quantile_method: QuantileMethod
    argrank: bool
    needs_sketch: bool  #: whether a statistic is a quantile strictly between p0 and p100

    def __init__(
        self,
        reduce: str | Iterable[str] = "mean",
        *,
        across: Across = "exact",
        fmt: str | None = None,
        nan: NanPolicy = "propagate",
        accuracy: float = 0.01,
        ddof: int = 0,
        quantile_method: QuantileMethod = "linear",
        argrank: bool = False,
    ) -> None:
        stats = (reduce,) if isinstance(reduce, str) else tuple(reduce)
        if not stats:
            raise ValueError("reduce must name at least one statistic")
        if len(stats) > MAX_STATS:
            raise ValueError(
                f"reduce names {len(stats)} statistics; a spec may ask for at most {MAX_STATS}"
            )
        for stat in stats:
            if not isinstance(stat, str):
                raise TypeError(f"statistics are strings like 'mean' or 'p99', got {stat!r}")
            if stat not in PLAIN_STATS and quantile_of(stat) is None:
                raise ValueError(
                    f"unknown statistic {stat!r}: expected one of {', '.join(PLAIN_STATS)} "
                    "or a quantile like p50, p99.9"
                )
        if len(set(stats)) != len(stats):
            raise ValueError(f"reduce names a statistic twice: {stats!r}")
        if across not in ACROSS_MODES:
            raise ValueError(f"across must be one of {ACROSS_MODES}, got {across!r}")
        if nan not in NAN_POLICIES:
            raise ValueError(f"nan must be one of {NAN_POLICIES}, got {nan!r}")
        accuracy = float(accuracy)
        if not (0.0 < accuracy < 1.0) or math.isnan(accuracy):
            raise ValueError(f"accuracy must lie in (0, 1), got {accuracy!r}")
        if isinstance(ddof, bool) or not isinstance(ddof, int) or not 0 <= ddof <= 1000:
            raise ValueError(f"ddof must be an int in [0, 1000] (0 or 1 usually), got {ddof!r}")
        if quantile_method not in QUANTILE_METHODS:
            raise ValueError(
                f"quantile_method must be one of {QUANTILE_METHODS}, got {quantile_method!r}"
            )
        if not isinstance(argrank, bool):
            raise TypeError(f"argrank must be True or False, got {argrank!r}")
        if argrank and across != "exact":
            raise ValueError(
                f"argrank needs across='exact', got across={across!r}: it names the rank "
                "holding the largest and smallest of the pooled samples, which an across "
                "mode does not pool (time one sample per rank and step, with reduce='max')"
            )
        quantiles = tuple(q for q in (quantile_of(s) for s in stats) if q is not None)
        needs_sketch = any(0.0 < q < 1.0 for q in quantiles)
        if needs_sketch:
            sketch_layout(accuracy)  # ValueError now, not at the first record, if it cannot fit
        else:
            # meaningless without a sketch: never a reason for two specs to differ
            accuracy, quantile_method = 0.01, "linear"
        if not {"var", "std"} & set(stats):
            ddof = 0
        setattr_ = object.__setattr__
        setattr_(self, "reduce", stats)
        setattr_(self, "across", across)
        setattr_(self, "fmt", _check_fmt(fmt))
        setattr_(self, "nan", nan)
        setattr_(self, "accuracy", accuracy)
        setattr_(self, "quantiles", quantiles)
        setattr_(self, "ddof", ddof)
        setattr_(self, "quantile_method", quantile_method)
        setattr_(self, "argrank", argrank)
        setattr_(self, "needs_sketch", needs_sketch)
        extras: dict[str, Any] = {}
        if ddof:
            extras["ddof"] = ddof
        if quantile_method != "linear":
            extras["quantile_method"] = quantile_method
        if argrank:
            extras["argrank"] = True
        key = (stats, across, self.fmt, nan, accuracy)
        setattr_(self, "_key", (*key, tuple(sorted(extras.items()))) if extras else key)
        setattr_(self, "_hash", hash(self._key))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Spec is immutable")

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Spec) and self._key == other._key)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        reduce: object = self.reduce[0] if len(self.reduce) == 1 else self.reduce
        parts = [repr(reduce)]
        if self.across != "exact":
            parts.append(f"across={self.across!r}")
        if self.fmt is not None:
            parts.append(f"fmt={self.fmt!r}")
        if self.nan != "propagate":
            parts.append(f"nan={self.nan!r}")
        if self.accuracy != 0.01:
            parts.append(f"accuracy={self.accuracy!r}")
        if self.ddof:
            parts.append(f"ddof={self.ddof!r}")
        if self.quantile_method != "linear":
            parts.append(f"quantile_method={self.quantile_method!r}")
        if self.argrank:
            parts.append("argrank=True")
        return f"Spec({', '.join(parts)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_spec_from_json, (self.to_json(),))

    def output_keys(self, name: str) -> tuple[str, ...]:
        """The keys of the statistics in ``reduce``: the bare name for one, ``name/stat`` for several."""
        if len(self.reduce) == 1:
            return (name,)
        return tuple(f"{name}/{stat}" for stat in self.reduce)

    def extra_keys(self, name: str) -> tuple[str, ...]:
        """Keys ``compute()`` may add beyond the statistics: extreme ranks, dropped NaN.

        >>> Spec("max", argrank=True, nan="ignore").extra_keys("timing/step")
        ('timing/step/max_rank', 'timing/step/min_rank', 'timing/step/nan_dropped')
        """
        keys: tuple[str, ...] = ()
        if self.argrank:
            keys += (f"{name}/max_rank", f"{name}/min_rank")
        if self.nan == "ignore":
            keys += (f"{name}/nan_dropped",)
        return keys

    def to_json(self) -> str:
        """A canonical JSON text of this spec (stable across processes)."""
        key = list(self._key)
        if len(key) == 6:  # options beyond the first five, only when set
            key[5] = dict(key[5])
        return json.dumps(key, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        """Rebuild a spec from :meth:`to_json` output; ``ValueError`` if it is not one."""
        data = json.loads(text)
        if not (isinstance(data, list) and len(data) in (5, 6)):
            raise ValueError(f"not a spec: {text[:80]!r}")
        stats, across, fmt, nan, accuracy = data[:5]
        extras = data[5] if len(data) == 6 else {}
        if (
            not isinstance(stats, list)
            or not isinstance(accuracy, (int, float))
            or not isinstance(extras, dict)
            or (not extras and len(data) == 6)
            or not set(extras) <= {"ddof", "quantile_method", "argrank"}
        ):
            raise ValueError(f"not a spec: {text[:80]!r}")
        return canonical(
            cls(tuple(stats), across=across, fmt=fmt, nan=nan, accuracy=accuracy, **extras)
        )


def _spec_from_json(text: str) -> Spec:
    return Spec.from_json(text)


_CANONICAL: LRU[Spec, Spec] = LRU(4096)  # a bound, should a program make endless specs


def canonical(spec: Spec) -> Spec:
    """The one shared instance of specs equal to ``spec``: equal specs then compare by identity,
    which keeps layouts of many metrics cheap to build and compare."""
    found = _CANONICAL.get(spec)
    return _CANONICAL.setdefault(spec, spec) if found is None else found


DEFAULT_SPEC = canonical(Spec())
