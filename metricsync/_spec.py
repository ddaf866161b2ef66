"""Metric specs: which statistics a name reports, how ranks combine, how values print.

A :class:`Spec` is an immutable, hashable value. A :class:`SpecTable` maps
names to specs by exact name first, then by the longest matching glob, then the
default ``Spec()``.

>>> import metricsync as ms
>>> ms.Spec("max") == ms.Spec(("max",))
True
>>> ms.Spec(("mean", "p99")).output_keys("response_length")
('response_length/mean', 'response_length/p99')
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

from ._errors import SpecMismatchError

__all__ = ["ACROSS_MODES", "NAN_POLICIES", "PLAIN_STATS", "Spec", "SpecTable", "quantile_of"]

PLAIN_STATS = ("mean", "sum", "count", "min", "max", "last", "std", "var")
ACROSS_MODES = ("exact", "mean", "sum", "min", "max")
NAN_POLICIES = ("propagate", "ignore", "error")
_QUANTILE = re.compile(r"p(\d{1,3}(?:\.\d+)?)")


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
            ``"sum"``, ``"min"``, ``"max"`` combine each rank's own result.
        fmt: a format spec without braces (``".3f"``), or None for adaptive.
        nan: ``"propagate"``, ``"ignore"`` (drop non-finite samples and count
            them) or ``"error"`` (raise ``ValueError``).
        accuracy: relative accuracy of the quantile sketch; specs without a quantile
            between p0 and p100 ignore it (it reads back as the default 0.01).

    >>> spec = Spec(("mean", "p99"), fmt=".0f")
    >>> spec.reduce, spec.across, spec.quantiles
    (('mean', 'p99'), 'exact', (0.99,))
    >>> Spec("median")
    Traceback (most recent call last):
    ...
    ValueError: unknown statistic 'median': expected one of mean, sum, count, min, max, last, std, var or a quantile like p50, p99.9
    """

    __slots__ = ("_key", "accuracy", "across", "fmt", "nan", "quantiles", "reduce")

    _key: tuple[Any, ...]
    reduce: tuple[str, ...]
    across: str
    fmt: str | None
    nan: str
    accuracy: float
    quantiles: tuple[float, ...]

    def __init__(
        self,
        reduce: str | Iterable[str] = "mean",
        *,
        across: str = "exact",
        fmt: str | None = None,
        nan: str = "propagate",
        accuracy: float = 0.01,
    ) -> None:
        stats = (reduce,) if isinstance(reduce, str) else tuple(reduce)
        if not stats:
            raise ValueError("reduce must name at least one statistic")
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
        quantiles = tuple(q for q in (quantile_of(s) for s in stats) if q is not None)
        if any(0.0 < q < 1.0 for q in quantiles):
            from ._sketch import sketch_layout

            sketch_layout(accuracy)  # ValueError now, not at the first record, if it cannot fit
        else:
            accuracy = 0.01  # meaningless without a sketch: never a reason for two specs to differ
        setattr_ = object.__setattr__
        setattr_(self, "reduce", stats)
        setattr_(self, "across", across)
        setattr_(self, "fmt", _check_fmt(fmt))
        setattr_(self, "nan", nan)
        setattr_(self, "accuracy", accuracy)
        setattr_(self, "quantiles", quantiles)
        setattr_(self, "_key", (stats, across, self.fmt, nan, accuracy))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Spec is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Spec) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

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
        return f"Spec({', '.join(parts)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_spec_from_json, (self.to_json(),))

    @property
    def needs_sketch(self) -> bool:
        """Whether any statistic is a quantile strictly between p0 and p100."""
        return any(0.0 < q < 1.0 for q in self.quantiles)

    def output_keys(self, name: str) -> tuple[str, ...]:
        """The keys ``compute()`` reports for a metric called ``name``."""
        if len(self.reduce) == 1:
            return (name,)
        return tuple(f"{name}/{stat}" for stat in self.reduce)

    def to_json(self) -> str:
        """A canonical JSON text of this spec (stable across processes)."""
        return json.dumps(list(self._key), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        """Rebuild a spec from :meth:`to_json` output; ``ValueError`` if it is not one."""
        data = json.loads(text)
        if not (isinstance(data, list) and len(data) == 5):
            raise ValueError(f"not a spec: {text[:80]!r}")
        stats, across, fmt, nan, accuracy = data
        if not isinstance(stats, list) or not isinstance(accuracy, (int, float)):
            raise ValueError(f"not a spec: {text[:80]!r}")
        return cls(tuple(stats), across=across, fmt=fmt, nan=nan, accuracy=accuracy)


def _spec_from_json(text: str) -> Spec:
    return Spec.from_json(text)


DEFAULT_SPEC = Spec()


class SpecTable:
    """Specs by exact name and by glob; resolution: exact, then longest glob, then default.

    >>> table = SpecTable({"timing/*": Spec("max"), "timing/gen": Spec("sum")})
    >>> table.resolve("timing/step"), table.resolve("timing/gen"), table.resolve("loss")
    (Spec('max'), Spec('sum'), Spec('mean'))
    """

    def __init__(self, rules: dict[str, Spec] | None = None) -> None:
        self._exact: dict[str, Spec] = {}
        self._globs: dict[str, Spec] = {}
        self._ordered_globs: list[tuple[str, Spec]] = []
        self._shared = False
        for key, spec in (rules or {}).items():
            self.add(key, spec)

    @staticmethod
    def is_glob(key: str) -> bool:
        """Whether ``key`` holds glob characters (``*``, ``?`` or ``[``)."""
        return any(ch in key for ch in "*?[")

    def rules(self) -> Iterator[tuple[str, Spec]]:
        """Every (name or glob, spec) rule, exact names first."""
        yield from self._exact.items()
        yield from self._globs.items()

    def rule_for(self, key: str) -> Spec | None:
        """The spec defined for exactly this name or glob, if any."""
        return self._globs.get(key) if self.is_glob(key) else self._exact.get(key)

    def add(self, key: str, spec: Spec) -> None:
        """Add a rule; ``SpecMismatchError`` if the same key already has another spec."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"a metric name or glob must be a non-empty string, got {key!r}")
        if not isinstance(spec, Spec):
            raise TypeError(f"expected a metricsync.Spec for {key!r}, got {type(spec).__name__}")
        old = self.rule_for(key)
        if old is not None and old != spec:
            raise SpecMismatchError(
                f"{key!r} is already defined as {old!r}; cannot redefine as {spec!r}"
            )
        if old is not None:
            return
        if self._shared:  # detach from the tables this one was copied from or to
            self._exact, self._globs = dict(self._exact), dict(self._globs)
            self._ordered_globs = list(self._ordered_globs)
            self._shared = False
        if self.is_glob(key):
            self._globs[key] = spec
            self._ordered_globs = sorted(self._globs.items(), key=lambda kv: (-len(kv[0]), kv[0]))
        else:
            self._exact[key] = spec

    def resolve(self, name: str) -> Spec:
        """The spec for ``name``: exact rule, else the longest matching glob, else ``Spec()``."""
        return self.explicit(name) or DEFAULT_SPEC

    def explicit(self, name: str) -> Spec | None:
        """The spec a rule gives ``name``, or None where only the default applies."""
        spec = self._exact.get(name)
        if spec is None:  # a declared name such as "acc[top1]" is stored as a glob: itself first
            spec = self._globs.get(name)
        if spec is not None:
            return spec
        for pattern, glob_spec in self._ordered_globs:
            if fnmatch.fnmatchcase(name, pattern):
                return glob_spec
        return None

    def copy(self) -> SpecTable:
        """An independent copy (copy-on-write: the rules are copied at the first ``add``)."""
        table = SpecTable()
        table._exact = self._exact
        table._globs = self._globs
        table._ordered_globs = self._ordered_globs
        table._shared = self._shared = True
        return table
