"""The :class:`Metrics` container: a façade over spec rules, the state table and pending samples.

Records go to per-name buffers (a Python number is a dict lookup and an append) and fold into
the state table when buffers fill; ``compute``, ``merge``, ``copy``, ``sync`` and ``to_bytes``
read a snapshot without changing anything (:mod:`metricsync._record._store`).

>>> import metricsync as ms
>>> m = ms.Metrics({"loss": ms.Spec("mean"), "tokens": ms.Spec("sum", fmt=",.0f")})
>>> for loss, n in [(2.0, 100), (1.0, 300)]:
...     m.record("loss", loss, weight=n)
...     m.record("tokens", n)
>>> m.compute()
{'loss': 1.25, 'tokens': 400.0}
>>> m.format()
'loss=1.25  tokens=400'
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, overload

import numpy as np

from .._record import _convert, _dispatch, _resume
from .._record._convert import ArrayLike, Number, RecordValue
from .._record._pending import FAST_LIMIT, PAIR_LIMIT
from .._record._store import Store
from .._state import _codec
from .._state._errors import CodecError
from .._state._formatting import format_line, numbers_of
from .._state._histogram import Histogram, table_histograms
from .._state._keys import check_table
from .._state._rules import SpecTable
from .._state._spec import Spec
from .._sync._async import SyncHandle, sync_async
from .._sync._sync import sync
from ._timer import Timer

__all__ = ["Metrics", "merge"]

_FLOAT64 = np.float64
_INF = float("inf")
_route = _dispatch.ROUTES.get  # the route of a value's class, if it has one
_general = _dispatch.general  # a name's first number, or the checked path
_TENSOR = _dispatch.TENSOR  # [torch.Tensor], once a tensor was recorded
_HOST_CPU = _dispatch.HOST_CPU  # CPU tensors are host data (tests may swap the set)


class Metrics:
    """Training metrics recorded on one rank, mergeable and synchronizable.

    Args:
        specs: a mapping of metric names or globs to :class:`Spec`.

    Names without a spec get ``Spec()`` (weighted mean, adaptive format).
    Safe to use from several threads.
    """

    def __init__(self, specs: Mapping[str, Spec] | None = None) -> None:
        if specs is not None and not isinstance(specs, Mapping):
            raise TypeError(
                f"specs must map metric names or globs to Spec, got {type(specs).__name__}"
            )
        rules = SpecTable()
        for key, spec in (specs or {}).items():
            rules.add(key, spec)
        self._adopt(Store(rules))

    def _adopt(self, store: Store) -> None:
        self._store = store
        self._fast = store.pending.fast  # the hot path's buffers
        self._weighted = store.pending.weighted
        self._lanes = store.devices.lanes  # the device hot path's

    @classmethod
    def _from_store(cls, store: Store) -> Metrics:
        metrics = cls.__new__(cls)
        cls._adopt(metrics, store)
        return metrics

    # ------------------------------------------------------------------ specs

    def define(self, name_or_glob: str, spec: Spec) -> None:
        """Declare the spec of a name or glob; ``SpecMismatchError`` if it changes one in use.

        >>> import metricsync as ms
        >>> m = ms.Metrics()
        >>> m.define("timing/*", ms.Spec("max"))
        >>> m.record("timing/step", 2.0); m.record("timing/step", 3.0)
        >>> m.compute()
        {'timing/step': 3.0}
        """
        with self._store.lock:
            self._store.adopt_rules(self._store.rules.plus(name_or_glob, spec))

    def spec(self, name: str) -> Spec:
        """The spec ``name`` has (or would get on its first record).

        >>> import metricsync as ms
        >>> ms.Metrics({"lr": ms.Spec("last")}).spec("lr")
        Spec('last')
        """
        with self._store.lock:
            return self._store.spec(name)

    # -------------------------------------------------------------- recording

    @overload
    def record(self, name: str, value: Number, *, weight: Any = None, mask: Any = None) -> None: ...

    @overload
    def record(
        self, name: str, value: ArrayLike, *, weight: Any = None, mask: Any = None
    ) -> None: ...

    def record(self, name: str, value: Any, *, weight: Any = None, mask: Any = None) -> None:
        """Record ``value`` under ``name``; every element of an array or tensor is a sample.

        ``weight`` is a scalar or an array broadcastable to ``value``; ``mask``
        a boolean (or 0/1) array of ``value``'s shape. Torch tensors on an
        accelerator stay on their device. Bad input raises ``TypeError`` or
        ``ValueError`` naming the metric and records nothing.
        """
        cls = value.__class__
        if cls is float or cls is int or cls is _FLOAT64:
            try:
                if weight is None and mask is None:
                    buf = self._fast[name]  # a subscript is cheaper than .get on this path
                    buf.append(value)
                    if len(buf) >= FAST_LIMIT:
                        self._store.flush()
                    return
                w = weight.__class__  # inline too: a route's lookup and call (~55 ns) is ~14% of it
                if mask is None and (w is float or w is int) and 0 <= weight < _INF:
                    pair = self._weighted[name]
                    v, w = float(value), float(weight)  # both fit before either is appended
                    pair.fromlist([v, w])  # one call: no other thread's pair lands between
                    if len(pair) >= PAIR_LIMIT:
                        self._store.flush()
                    return
            except (KeyError, TypeError, OverflowError):  # not open yet, unhashable, too big
                pass
        elif (
            cls is _TENSOR[0] and weight is None and mask is None
        ):  # via a route: 0-d CPU ~11% slower
            if value.is_cpu and _convert.HOST_DEVICE_TYPES is _HOST_CPU:
                try:
                    if not value.ndim:
                        buf = self._fast[name]
                        if value.requires_grad:  # float() of it would warn
                            value = value.detach()
                        buf.append(float(value))  # host memory: no device read
                        if len(buf) >= FAST_LIMIT:
                            self._store.flush()
                        return
                    if value.requires_grad:
                        value = value.detach()
                    if name in self._fast and self._store.add_small(name, value.numpy()):
                        return
                except (KeyError, TypeError, RuntimeError, ValueError):
                    pass
            else:
                try:
                    lane: Any = self._lanes.get(name)
                    taken = lane is not None and lane.take(value)  # a 0-d reference, no lock
                except (TypeError, RuntimeError):  # an unhashable name, a tensor without storage
                    lane, taken = None, False
                # not retried on the general path: a fold they set off may fail (out of
                # memory) with the record pended; its checks raise as the general path's
                if taken:
                    if len(lane.inbox) >= lane.limit:
                        self._store.fold_devices()
                    return
                if lane is not None and self._store.add_on_device(name, value, None, None):
                    return
            return _general(self._store, name, value, None, None)
        _route(cls, _general)(self._store, name, value, weight, mask)

    def update(self, values: Mapping[str, RecordValue]) -> None:
        """Record several metrics at once: ``update({"lr": lr, "tokens": n})``.

        Every entry is checked before any is recorded, so a bad one raises (naming
        its metric) and leaves the metrics unchanged.
        """
        if not isinstance(values, Mapping):
            raise TypeError(
                f"update() takes a mapping of metric names to values, got {type(values).__name__}"
            )
        with self._store.lock:  # a fold waits for the whole update
            pending = [_dispatch.prepare(self._store, n, v) for n, v in values.items()]
            self._store.check_new([name for name in values if name.__class__ is str])
            for apply in pending:
                apply()
            if any(len(self._fast.get(name, ())) >= FAST_LIMIT for name in values):
                self._store.flush()

    def timer(self, name: str, *, device: Any = None) -> Any:
        """A context manager (or decorator) recording the elapsed seconds of its block.

        A name without a rule gets ``Spec("max", fmt=".3f")``. With a CUDA
        ``device`` (or ``device="cuda"``), CUDA events time the block and are
        read at ``compute()``/``sync()``, so timing adds no host sync.

        >>> import metricsync as ms
        >>> m = ms.Metrics()
        >>> with m.timer("timing/step"):
        ...     pass
        >>> m.spec("timing/step"), m.compute()["timing/step"] < 1.0
        (Spec('max', fmt='.3f'), True)
        """
        with self._store.lock:
            if self._store.rules.explicit(name) is None and name not in self._store.table.index:
                self.define(name, Spec("max", fmt=".3f"))
        return Timer(name, device, self.record, self._store.defer)

    # -------------------------------------------------------------- computing

    def compute(self) -> dict[str, float]:
        """Every metric's statistics as plain Python floats; metrics without samples are left out.

        One device-to-host copy per device holding tensor states; nothing changes,
        so observing mid-step leaves later results exactly as they would be.
        """
        return self._store.compute()

    def histograms(self) -> dict[str, Histogram]:
        """A histogram of every quantile metric holding finite samples, from its sketch.

        After a merge or a sync it covers the samples of every rank; nothing is
        gathered to draw it.

        >>> import metricsync as ms
        >>> m = ms.Metrics({"len": ms.Spec(("mean", "p50"))})
        >>> m.record("len", [16, 32, 32, 4096])
        >>> h = m.histograms()["len"]
        >>> h.total, float(h.edges[0]), float(h.edges[-1])
        (4.0, 16.0, 4096.0)
        """
        return table_histograms(self._store.folded())

    def key_formats(self) -> dict[str, str | None]:
        """The format spec of every key ``compute()`` may report (None: adaptive)."""
        with self._store.lock:
            return self._store.table.key_formats()

    def format(self, values: Mapping[str, float] | None = None) -> str:
        """One human line, each value in its spec's format (computes first when ``values`` is None)."""
        values = self.compute() if values is None else numbers_of(values)
        return format_line(values, self.key_formats())

    # -------------------------------------------------------------- lifecycle

    def reset(self) -> None:
        """Forget every sample; keep the specs (and the layout, so syncs stay cheap)."""
        self._store.reset()

    @property
    def names(self) -> list[str]:
        """Names holding at least one sample (recorded or merged), in first-record order.

        Accelerator tensor records count when they held any element (their masks
        and weights are not read before ``compute()``).
        """
        return self._store.held_names()

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in set(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __repr__(self) -> str:
        return f"Metrics({len(self)} names)"

    def glob(self, pattern: str) -> list[str]:
        """Names holding samples that match ``pattern``."""
        return [n for n in self.names if fnmatch.fnmatchcase(n, pattern)]

    # ---------------------------------------------------------------- merging

    def merge(self, other: Metrics) -> Metrics:
        """Merge ``other`` into this object in place and return it.

        Exact and commutative; ``SpecMismatchError`` (and nothing merged) when a
        name either side has (with samples or not) resolves to different specs on
        the two sides, in either order, as in a sync. A rule the two define apart
        that no held name resolves through keeps this side's. For ``across``
        metrics, ``other`` counts as one rank.
        """
        if not isinstance(other, Metrics):
            raise TypeError(f"can only merge a metricsync.Metrics, got {type(other).__name__}")
        self._store.absorb(_store_of(other))
        return self

    def copy(self) -> Metrics:
        """An independent copy (specs and state)."""
        store = self._store
        return self._from_store(Store(store.rules.copy(), store.snapshot()))

    # ---------------------------------------------------- bytes, checkpoints

    def to_bytes(self) -> bytes:
        """A versioned binary encoding of specs and states (no pickle inside)."""
        return _codec.encode(self._store.rules, self._store.folded())

    @classmethod
    def from_bytes(cls, data: bytes) -> Metrics:
        """Decode :meth:`to_bytes` output; ``CodecError`` for anything malformed."""
        return cls._from_store(Store(*_codec.decode(data)))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_bytes, (self.to_bytes(),))

    def state_dict(self) -> dict[str, Any]:
        """A checkpointable dict of an int and bytes: ``{"metricsync": 1, "data": bytes}``
        (``to_bytes()``), and ``"resume"``: the samples not yet folded, as they are held,
        so that a ``Metrics`` restored from it and fed the same records gives bit for bit
        the results of this one (not while accelerator tensors are pending: their state
        folds into ``"data"`` alone, and a resumed run agrees up to float64 rounding)."""
        parts = self._store.resumable()
        if parts is None:
            return {"metricsync": 1, "data": self.to_bytes()}
        twin = Store.resume(parts[0].copy(), parts[1].copy(), parts[2])  # "data": that state
        return {
            "metricsync": 1,
            "data": _codec.encode(twin.rules, twin.folded()),
            "resume": _resume.encode(*parts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace specs and state with those of a :meth:`state_dict` (its ``"resume"``
        where present, else its ``"data"``); ``CodecError`` for anything else."""
        if not isinstance(state, Mapping) or "data" not in state:
            raise CodecError(
                "not a metricsync state_dict: expected a mapping with keys 'metricsync' "
                f"(the int 1) and 'data' (bytes), got {type(state).__name__}"
            )
        version = state.get("metricsync")
        if type(version) is not int or version != 1:
            raise CodecError(
                f"not a metricsync state_dict: 'metricsync' must be the int 1, got "
                f"{type(version).__name__} {str(version)[:40]}"
            )
        if "resume" in state:
            store = Store.resume(*_resume.decode(state["resume"]))
        else:
            store = Store(*_codec.decode(state["data"]))
        with self._store.lock:
            self._adopt(store)

    # ---------------------------------------------------------------- syncing

    @overload
    def sync(
        self, group: Any = None, *, timeout: float | None = None, async_op: Literal[False] = False
    ) -> Metrics: ...

    @overload
    def sync(
        self, group: Any = None, *, timeout: float | None = None, async_op: Literal[True]
    ) -> SyncHandle: ...

    @overload
    def sync(
        self, group: Any = None, *, timeout: float | None = None, async_op: bool = False
    ) -> Metrics | SyncHandle: ...

    def sync(
        self, group: Any = None, *, timeout: float | None = None, async_op: bool = False
    ) -> Metrics | SyncHandle:
        """The merge over every rank of ``group``, identical on every rank; self is unchanged.

        Without an initialized process group, what a sync of one rank returns (a copy, its
        names in name order, as every sync's). ``group`` is a process group
        or a 1-D ``DeviceMesh`` (``mesh["dp"]``). With ``async_op=True``, a handle
        (``wait()``, ``done()``) whose state is taken at the call. ``timeout``
        (seconds) bounds the whole call. A collective that fails or times out raises
        ``SyncError`` and leaves the group's collectives out of step (a peer may still
        be inside the abandoned one): every later sync on that group raises
        ``SyncError`` at once, naming the failure. To sync again, use a new process
        group (``dist.new_group(...)``, or ``destroy_process_group()`` then
        ``init_process_group(...)``). Every ``Metrics`` synced on a group packs its
        state in the group's layout, the names its syncs have seen: a small one synced
        in turn with a large one sends room for the large one's names too (a group of
        its own keeps them apart); its result holds only the names some rank holds.
        """
        if async_op:
            return sync_async(self._store, group, timeout, self._from_synced)
        return sync(self._store, group, timeout, self._from_synced)

    @classmethod
    def _from_synced(cls, store: Store) -> Metrics:
        """A sync's result; ``SpecMismatchError`` (on every rank: each holds the same
        table) where names of different ranks would share a key of ``compute()``."""
        table = store.table
        check_table(table.names, table.specs, table.plan().keys_distinct())
        return cls._from_store(store)


def _store_of(metrics: Metrics) -> Store:
    """Another Metrics' store: the one place this module reads a private attribute of another object."""
    return metrics._store


def _from_bytes(data: bytes) -> Metrics:
    return Metrics.from_bytes(data)


def merge(metrics: Iterable[Metrics]) -> Metrics:
    """A new :class:`Metrics` holding the merge of ``metrics`` (inputs unchanged).

    >>> import metricsync as ms
    >>> a, b = ms.Metrics(), ms.Metrics()
    >>> a.record("x", [1.0, 2.0]); b.record("x", 6.0)
    >>> ms.merge([a, b]).compute()
    {'x': 3.0}
    """
    result = Metrics()
    for item in metrics:
        result.merge(item)
    return result
