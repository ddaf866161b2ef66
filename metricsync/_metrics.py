"""The :class:`Metrics` container: record, merge, compute, format, reset.

Storage is columnar: one float64 row of state per metric (see
:mod:`metricsync._state`), so merging, packing for a collective and computing
are vectorized over metrics. Python numbers go to a small per-name pending
buffer (the hot path is a dict lookup and an ``array.append``) that is folded
in vectorized form when it fills up or before anything reads the state.
Torch tensors accumulate on their own device (:mod:`metricsync._device`).

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
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np

from . import _state as st
from ._across import AGG_IDENTITY, empty_aggregate, merge_aggregates, rank_aggregate
from ._convert import as_torch, host_mask, host_values, host_weights
from ._errors import SpecMismatchError
from ._histogram import Histogram, sketch_histogram
from ._results import assemble, local_values
from ._spec import Spec, SpecTable

__all__ = ["Metrics", "merge"]

_PENDING_LIMIT = 4096
_FLOAT64 = np.float64


class _StampedBuffer(array):
    """A pending buffer that also keeps the time of its latest number (for ``last``)."""

    stamp = -np.inf

    def append(self, value: Any) -> None:
        array.append(self, value)
        self.stamp = st.now_us()


class Metrics:
    """Training metrics recorded on one rank, mergeable and synchronizable.

    Args:
        specs: a mapping of metric names or globs to :class:`Spec`.

    Names without a spec get ``Spec()`` (weighted mean, adaptive format).
    """

    def __init__(self, specs: Mapping[str, Spec] | None = None) -> None:
        if specs is not None and not isinstance(specs, Mapping):
            raise TypeError(
                f"specs must map metric names or globs to Spec, got {type(specs).__name__}"
            )
        self._table = SpecTable()
        for key, spec in (specs or {}).items():
            self._table.add(key, spec)
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        self._specs: list[Spec] = []
        self._rows = st.empty_rows(8)
        self._sketch: dict[int, np.ndarray] = {}
        self._agg: dict[int, np.ndarray] = {}
        self._fast: dict[str, array[float]] = {}
        self._dirty: list[str] = []
        self._dev: dict[Any, dict[int, Any]] = {}
        self._version = 0
        self._layout_shared = False  # _names/_index/_specs belong to a cached sync layout
        self._sync_cache: dict[Any, Any] = {}

    # ------------------------------------------------------------------ specs

    def define(self, name_or_glob: str, spec: Spec) -> None:
        """Declare the spec of a name or glob.

        Raises ``SpecMismatchError`` when the name (or glob) already has another
        spec, or when the new rule would change the spec of a name holding samples.

        >>> import metricsync as ms
        >>> m = ms.Metrics()
        >>> m.define("timing/*", ms.Spec("max"))
        >>> m.record("timing/step", 2.0); m.record("timing/step", 3.0)
        >>> m.compute()
        {'timing/step': 3.0}
        """
        table = self._table.copy()
        table.add(name_or_glob, spec)
        respec = self._check_rules(table)
        self._table = table
        for slot, new in respec:
            self._respec(slot, new)

    def _check_rules(self, table: SpecTable) -> list[tuple[int, Spec]]:
        """Slots whose spec ``table`` changes; raise if any of them holds samples."""
        changes = []
        for slot, name in enumerate(self._names):
            old = self._specs[slot]
            new = table.explicit(name)
            if new is None or new == old:
                continue
            if self._holds_data(slot):
                raise SpecMismatchError(
                    f"metric {name!r} holds samples under {old!r}; cannot change it to {new!r}"
                )
            changes.append((slot, new))
        return changes

    def spec(self, name: str) -> Spec:
        """The spec ``name`` has (or would get on its first record).

        >>> import metricsync as ms
        >>> ms.Metrics({"lr": ms.Spec("last")}).spec("lr")
        Spec('last')
        """
        slot = self._index.get(name)
        return self._specs[slot] if slot is not None else self._table.resolve(name)

    # -------------------------------------------------------------- recording

    def record(self, name: str, value: Any, *, weight: Any = None, mask: Any = None) -> None:
        """Record ``value`` under ``name``; every element of an array or tensor is a sample.

        ``weight`` is a scalar or an array broadcastable to ``value``; ``mask``
        is a boolean array of ``value``'s shape (masked-out elements are not
        samples). Torch tensors stay on their device. Bad input raises
        ``TypeError``/``ValueError`` naming the metric and records nothing.
        """
        cls = value.__class__
        if (cls is float or cls is int or cls is _FLOAT64) and weight is None and mask is None:
            try:
                buf = self._fast[name]  # a subscript is cheaper than .get on this path
            except (KeyError, TypeError):  # TypeError: an unhashable name, reported below
                pass
            else:
                try:
                    buf.append(value)
                except OverflowError:
                    raise ValueError(
                        f"metric {name!r}: {value!r} does not fit in a float64"
                    ) from None
                n = len(buf)
                if n == 1:
                    self._dirty.append(name)
                elif n >= _PENDING_LIMIT:
                    self._fold_pending()
                return
        self._record_slow(name, value, weight, mask)

    def update(self, values: Mapping[str, Any]) -> None:
        """Record several metrics at once: ``update({"lr": lr, "tokens": n})``.

        Every entry is checked before any is recorded, so a bad one raises (naming
        its metric) and leaves the metrics unchanged.
        """
        if not isinstance(values, Mapping):
            raise TypeError(
                f"update() takes a mapping of metric names to values, got {type(values).__name__}"
            )
        pending: list[Callable[[], None]] = []
        for name, value in values.items():
            cls = value.__class__
            if (cls is float or cls is _FLOAT64) and isinstance(name, str) and name in self._fast:
                pending.append(partial(self.record, name, value))  # the fast path cannot fail
            else:
                pending.append(self._prepare(name, value, None, None))
        for apply in pending:
            apply()

    def _record_slow(self, name: str, value: Any, weight: Any, mask: Any) -> None:
        self._prepare(name, value, weight, mask)()

    def _prepare(self, name: Any, value: Any, weight: Any, mask: Any) -> Callable[[], None]:
        """Check and convert one record; the function returned applies it.

        Everything that can be wrong with the input raises here, naming the
        metric, so applying cannot fail on it.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"a metric name must be a non-empty string, got {name!r}")
        tensor = as_torch(value)
        if tensor is not None:
            return self._prepare_tensor(name, tensor, weight, mask)
        spec = self.spec(name)
        values = host_values(name, value)
        shape = np.shape(value)
        w = None if weight is None else host_weights(name, weight, shape)
        if mask is not None:
            m = host_mask(name, mask, shape)
            w = m if w is None else w * m
        drops = 0.0
        if spec.nan != "propagate":
            nonfinite = ~np.isfinite(values)
            if nonfinite.any():
                bad = nonfinite if w is None else nonfinite & (w > 0)
                if spec.nan == "error" and bad.any():
                    raise ValueError(
                        f"metric {name!r}: non-finite sample {values[bad][0]!r} under nan='error'"
                    )
                drops = float(bad.sum())
                w = np.where(nonfinite, 0.0, 1.0 if w is None else w)
        return partial(self._apply_host, name, spec, values, w, drops)

    def _apply_host(
        self, name: str, spec: Spec, values: np.ndarray, w: np.ndarray | None, drops: float
    ) -> None:
        self._fold_pending()
        slot = self._slot(name, spec)
        if spec.nan != "error" and name not in self._fast:
            # later Python numbers take the fast path; ``last`` needs each number's time
            self._fast[name] = _StampedBuffer("d") if "last" in spec.reduce else array("d")
        if len(values) == 0:
            return
        rows = st.rows_from_samples(values, w, np.array([0, len(values)]), st.now_us())
        rows[0, st.DROP] = drops
        self._rows[slot] = st.merge_rows(self._rows[slot], rows[0], np)
        if slot in self._sketch:
            self._sketch[slot] += self._ingest(spec, values, w)

    def _prepare_tensor(self, name: str, tensor: Any, weight: Any, mask: Any) -> Callable[[], None]:
        from ._device import check_on_host, torch_weights

        if tensor.is_complex():
            raise TypeError(f"metric {name!r}: expected a real tensor, got dtype {tensor.dtype}")
        spec = self.spec(name)
        w = torch_weights(name, tensor, weight, mask)
        check_on_host(name, spec, tensor, w)  # CPU tensors are host data: checked now
        return partial(self._apply_tensor, name, spec, tensor, w)

    def _apply_tensor(self, name: str, spec: Spec, tensor: Any, w: Any) -> None:
        from ._device import DeviceAccumulator

        self._fold_pending()
        slot = self._slot(name, spec)
        if tensor.numel() == 0:  # no samples (and no accumulator that `names` would count)
            return
        accs = self._dev.setdefault(tensor.device, {})
        acc = accs.get(slot)
        layout = _layout(spec) if spec.needs_sketch else None
        if acc is None:
            acc = accs[slot] = DeviceAccumulator(tensor.device, layout.n_cells if layout else 0)
        acc.add(spec, tensor, w, layout, st.now_us())

    @staticmethod
    def _ingest(spec: Spec, values: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        from ._sketch import ingest_numpy

        return ingest_numpy(_layout(spec), values, weights)

    # ------------------------------------------------------------------ slots

    def _slot(self, name: str, spec: Spec) -> int:
        slot = self._index.get(name)
        if slot is not None:
            return slot
        if self._layout_shared:
            self._unshare_layout()
        slot = len(self._names)
        if slot == len(self._rows):
            self._rows = np.concatenate([self._rows, st.empty_rows(len(self._rows))])
        self._names.append(name)
        self._index[name] = slot
        self._specs.append(spec)
        self._configure(slot, spec)
        return slot

    def _configure(self, slot: int, spec: Spec) -> None:
        name = self._names[slot]
        self._version += 1
        self._fast.pop(name, None)
        self._sketch.pop(slot, None)
        if spec.needs_sketch:
            self._sketch[slot] = np.zeros(_layout(spec).n_cells)
        self._agg.pop(slot, None)
        if spec.across != "exact":
            self._agg[slot] = empty_aggregate(len(spec.reduce))

    def _unshare_layout(self) -> None:
        """Copy the name tables a sync result shares with its cached layout before changing them."""
        self._names, self._index, self._specs = (
            list(self._names),
            dict(self._index),
            list(self._specs),
        )
        self._layout_shared = False

    def _respec(self, slot: int, spec: Spec) -> None:
        if self._layout_shared:
            self._unshare_layout()
        self._specs[slot] = spec
        self._rows[slot] = st.IDENTITY
        self._configure(slot, spec)

    def _holds_data(self, slot: int) -> bool:
        self._fold_pending()
        row = self._rows[slot]
        if row[st.W] > 0 or row[st.DROP] > 0 or row[st.T] > -np.inf:
            return True
        agg = self._agg.get(slot)
        if agg is not None and agg[:, 1].any():
            return True
        return any(slot in accs for accs in self._dev.values())

    # ---------------------------------------------------------------- folding

    def _fold_pending(self) -> None:
        """Fold the per-name buffers of Python numbers into the state rows."""
        if not self._dirty:
            return
        names, self._dirty = self._dirty, []
        slots = np.array([self._index[n] for n in names])
        bufs = [self._fast[n] for n in names]
        lengths = np.array([len(b) for b in bufs])
        values = np.concatenate([np.frombuffer(b, dtype=np.float64) for b in bufs])
        for b in bufs:
            del b[:]
        starts = np.concatenate([[0], np.cumsum(lengths)])
        weights = None
        drops = np.zeros(len(names))
        ignore = np.array([self._specs[s].nan == "ignore" for s in slots])
        if ignore.any():
            dropped = np.repeat(ignore, lengths) & ~np.isfinite(values)
            if dropped.any():
                weights = np.where(dropped, 0.0, 1.0)
                drops = np.add.reduceat(dropped.astype(np.float64), starts[:-1])
        now = st.now_us()
        stamps = np.array([getattr(b, "stamp", now) for b in bufs])  # ``last``: record time
        rows = st.rows_from_samples(values, weights, starts, stamps)
        rows[:, st.DROP] = drops
        self._rows[slots] = st.merge_rows(self._rows[slots], rows, np)
        for i, slot in enumerate(slots.tolist()):
            if slot in self._sketch:
                lo, hi = starts[i], starts[i + 1]
                w = None if weights is None else weights[lo:hi]
                self._sketch[slot] += self._ingest(self._specs[slot], values[lo:hi], w)

    def _fold_devices(self, host_only: bool = False) -> None:
        """Bring device states to the host: one device-to-host copy per device.

        With ``host_only``, only states of tensors that already live in host memory.
        """
        if not self._dev:
            return
        import torch

        if host_only:
            from ._device import HOST_DEVICE_TYPES

            devices = {d: a for d, a in self._dev.items() if d.type in HOST_DEVICE_TYPES}
            if not devices:
                return
            self._dev = {d: a for d, a in self._dev.items() if d.type not in HOST_DEVICE_TYPES}
        else:
            devices, self._dev = self._dev, {}
        errors = []
        for accs in devices.values():
            slots = list(accs)
            parts = [
                torch.stack([accs[s].row for s in slots]),
                torch.stack([accs[s].bad for s in slots]),
            ]
            sketch_slots = [s for s in slots if accs[s].sketch is not None]
            parts += [accs[s].sketch for s in sketch_slots]
            flat = torch.cat([p.reshape(-1) for p in parts]).cpu().numpy()
            k = len(slots)
            rows = flat[: k * st.NCOL].reshape(k, st.NCOL)
            bad = flat[k * st.NCOL : k * st.NCOL + k]
            self._rows[slots] = st.merge_rows(self._rows[slots], rows, np)
            offset = k * st.NCOL + k
            for s in sketch_slots:
                n = len(self._sketch[s])
                self._sketch[s] += flat[offset : offset + n]
                offset += n
            for s, flag in zip(slots, bad.tolist()):
                if flag:
                    errors.append((self._names[s], flag))
        if errors:
            from ._device import BAD_NAN

            name, flag = errors[0]
            what = (
                "a non-finite sample under nan='error'"
                if flag == BAD_NAN
                else "a negative or non-finite weight"
            )
            raise ValueError(
                f"metric {name!r}: a recorded tensor held {what}; that record was discarded"
            )

    def _fold(self) -> None:
        self._fold_pending()
        self._fold_devices()

    # -------------------------------------------------------------- computing

    def compute(self) -> dict[str, float]:
        """Every metric's statistics as plain Python floats; metrics without samples are left out.

        One device-to-host copy per device holding tensor states.
        """
        self._fold()
        return self._values()

    def _local_values(self, slots: list[int]) -> np.ndarray:
        """Each slot's own statistics (its local rank), NaN where it holds no samples."""
        specs = [self._specs[s] for s in slots]
        return local_values(specs, self._rows[slots], [self._sketch.get(s) for s in slots])

    def _values(self) -> dict[str, float]:
        n = len(self._names)
        local = self._local_values(list(range(n)))
        return assemble(self._names, self._specs, self._rows[:n], local, self._agg)

    def histograms(self) -> dict[str, Histogram]:
        """A histogram of every quantile metric holding finite samples, from its sketch.

        After a merge or a sync it covers the samples of every rank; nothing is
        gathered to draw it. Metrics without a sketch (no quantile between p0 and
        p100) are left out.

        >>> import metricsync as ms
        >>> m = ms.Metrics({"len": ms.Spec(("mean", "p50"))})
        >>> m.record("len", [16, 32, 32, 4096])
        >>> h = m.histograms()["len"]
        >>> h.total, float(h.edges[0]), float(h.edges[-1])
        (4.0, 16.0, 4096.0)
        """
        self._fold()
        out: dict[str, Histogram] = {}
        for slot, cells in self._sketch.items():
            row = self._rows[slot]
            spec = self._specs[slot]
            hist = sketch_histogram(_layout(spec), cells, -row[st.NEGMIN], row[st.MAX])
            if hist is not None:
                out[self._names[slot]] = hist
        return out

    def key_formats(self) -> dict[str, str | None]:
        """The format spec of every key ``compute()`` may report (None: adaptive)."""
        formats: dict[str, str | None] = {}
        for name, spec in zip(self._names, self._specs):
            for key in spec.output_keys(name):
                formats[key] = spec.fmt
            if spec.nan == "ignore":
                formats[f"{name}/nan_dropped"] = ",.0f"
        return formats

    def format(self, values: Mapping[str, float] | None = None) -> str:
        """One human line, each value in its spec's format (computes first when ``values`` is None)."""
        from ._formatting import format_line

        if values is None:
            values = self.compute()
        elif not isinstance(values, Mapping):
            raise TypeError(
                f"format() takes a mapping of keys to numbers, got {type(values).__name__}"
            )
        else:
            checked = {}
            for key, value in values.items():
                try:
                    if isinstance(value, (str, bytes)):
                        raise TypeError
                    checked[key] = float(value)
                except (TypeError, ValueError, OverflowError):
                    raise TypeError(
                        f"metric {key!r}: expected a number to format, got {type(value).__name__}"
                    ) from None
            values = checked
        return format_line(values, self.key_formats())

    # -------------------------------------------------------------- lifecycle

    def reset(self) -> None:
        """Forget every sample; keep the specs (and the layout, so syncs stay cheap)."""
        self._dirty = []
        for buf in self._fast.values():
            del buf[:]
        self._dev = {}
        self._rows[:] = st.IDENTITY
        for cells in self._sketch.values():
            cells[:] = 0.0
        for agg in self._agg.values():
            agg[:] = AGG_IDENTITY

    @property
    def names(self) -> list[str]:
        """Names holding at least one sample (recorded or merged), in first-record order.

        Accelerator tensor records not yet computed count when they held any
        element (their masks and weights are not read before ``compute()``).
        """
        self._fold_pending()
        self._fold_devices(host_only=True)
        n = len(self._names)
        held = self._rows[:n, st.W] > 0
        for slot, agg in self._agg.items():
            held[slot] |= bool(agg[:, 1].any())
        for accs in self._dev.values():
            held[list(accs)] = True
        return [name for name, h in zip(self._names, held.tolist()) if h]

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
        name resolves to different specs on the two sides. For ``across``
        metrics, ``other`` counts as one rank.
        """
        if not isinstance(other, Metrics):
            raise TypeError(f"can only merge a metricsync.Metrics, got {type(other).__name__}")
        if other is self:
            other = self.copy()
        self._fold()
        other._fold()
        table = self._table.copy()
        for key, spec in other._table.rules():
            if table.rule_for(key) is None:  # a rule both sides have: ours; names are checked below
                table.add(key, spec)
        respec = self._check_rules(table)
        respec_slots = {slot for slot, _ in respec}
        for slot, name in enumerate(other._names):
            theirs = other._specs[slot]
            mine_slot = self._index.get(name)
            if mine_slot is not None and mine_slot not in respec_slots:
                mine: Spec | None = self._specs[mine_slot]
            else:
                mine = table.explicit(name)
            if mine is not None and mine != theirs:
                raise SpecMismatchError(
                    f"metric {name!r} is {mine!r} on one side and {theirs!r} on the other"
                )
        self._table = table
        for slot, spec in respec:
            self._respec(slot, spec)
        self._absorb(other)
        return self

    def _absorb(self, other: Metrics) -> None:
        """Merge other's (folded, spec-checked) state in; other counts as one rank."""
        theirs = list(range(len(other._names)))
        mine = [self._slot(name, other._specs[s]) for s, name in zip(theirs, other._names)]
        exact = [(m, t) for m, t in zip(mine, theirs) if other._specs[t].across == "exact"]
        if exact:
            m_idx = np.array([m for m, _ in exact])
            t_idx = np.array([t for _, t in exact])
            self._rows[m_idx] = st.merge_rows(self._rows[m_idx], other._rows[t_idx], np)
            for m, t in exact:
                if t in other._sketch:
                    self._sketch[m] += other._sketch[t]
        across = [(m, t) for m, t in zip(mine, theirs) if other._specs[t].across != "exact"]
        if across:
            local = other._local_values([t for _, t in across])
            for i, (m, t) in enumerate(across):
                agg = merge_aggregates(self._agg[m], other._agg[t])
                if other._rows[t, st.W] > 0:
                    agg = merge_aggregates(agg, rank_aggregate(local[i, : len(agg)]))
                self._agg[m] = agg
                self._rows[m, st.DROP] += other._rows[t, st.DROP]

    def copy(self) -> Metrics:
        """An independent copy (specs and state)."""
        self._fold()
        new = Metrics()
        new._table = self._table.copy()
        new._names = list(self._names)
        new._index = dict(self._index)
        new._specs = list(self._specs)
        new._rows = self._rows.copy()
        new._sketch = {k: v.copy() for k, v in self._sketch.items()}
        new._agg = {k: v.copy() for k, v in self._agg.items()}
        new._version = 1
        return new

    # ---------------------------------------------------- bytes, checkpoints

    def to_bytes(self) -> bytes:
        """A versioned binary encoding of specs and states (no pickle inside)."""
        from ._codec import encode

        self._fold()
        return encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> Metrics:
        """Decode :meth:`to_bytes` output; ``CodecError`` for anything malformed."""
        from ._codec import decode

        return decode(data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_bytes, (self.to_bytes(),))

    def state_dict(self) -> dict[str, Any]:
        """A checkpointable dict: ``{"metricsync": 1, "data": bytes}``."""
        return {"metricsync": 1, "data": self.to_bytes()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace specs and state with those of a :meth:`state_dict`."""
        from ._errors import CodecError

        if not isinstance(state, Mapping) or state.get("metricsync") != 1 or "data" not in state:
            raise CodecError("not a metricsync state_dict (expected keys 'metricsync' and 'data')")
        loaded = Metrics.from_bytes(state["data"])
        self.__dict__.update(loaded.__dict__)

    # ---------------------------------------------------------------- syncing

    def sync(self, group: Any = None, *, timeout: float | None = None) -> Metrics:
        """The merge over every rank of ``group``, identical on every rank; self is unchanged.

        Without an initialized process group, a copy. See :mod:`metricsync._sync`.
        """
        from ._sync import sync

        return sync(self, group=group, timeout=timeout)


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


def _layout(spec: Spec) -> Any:
    from ._sketch import sketch_layout

    return sketch_layout(spec.accuracy)
