"""Synchronizing :class:`~metricsync.Metrics` across ``torch.distributed`` ranks.

Steady state is three collectives whatever the number of metrics:

1. a fixed-size ``all_reduce(MAX)`` of ``[fp, -fp, n, -n, error]`` checks that
   every rank holds the same layout (names and specs, fingerprinted with
   BLAKE2b) and that no rank holds invalid device data;
2. one ``all_reduce(MAX)`` of every max-like column (max, -min, time of the
   latest sample, each rank's mean as the shift for variance);
3. one ``all_reduce(SUM)`` of every sum-like column (weights, weighted sums,
   shifted second moments, sketch buckets, per-rank aggregates).

When layouts differ, ranks exchange them as bytes in ``uint8`` tensors (two
``all_gather`` calls, no pickle), agree on the union, and remember it, so the
next sync with the same names is steady state again. A name whose spec
differs between ranks raises :class:`~metricsync.SpecMismatchError` on every
rank, also when a rank only declares the name (a rule, no samples) with
another spec: each rank flags such a rule in the MAX all-reduce. A collective
that does not finish within ``timeout`` raises :class:`~metricsync.SyncError`.

Variance stays stable without raw sums of squares: each rank sends
``M2 + W (mean - c)^2`` around a common shift ``c`` (the largest rank mean,
known after step 2), and the merged ``M2`` subtracts ``W (mean - c)^2``.

>>> import metricsync as ms
>>> m = ms.Metrics(); m.record("loss", [1.0, 3.0])
>>> m.sync().compute()  # no process group: a copy
{'loss': 2.0}
"""

from __future__ import annotations

import hashlib
import json
import numbers
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _state as st
from ._across import empty_aggregate, merge_aggregates, rank_aggregate
from ._errors import SpecMismatchError, SyncError
from ._results import local_values
from ._spec import Spec

if TYPE_CHECKING:
    from ._metrics import Metrics

__all__ = ["Layout", "sync"]

_MASK62 = (1 << 62) - 1
_MAX_TIMEOUT = 1e9  # seconds (about 31 years): longer ones mean no limit

# Column groups of one metric in the packed buffers.
_MAX_COLS = 4  # MAX, NEGMIN, T, local mean (variance shift)
_SUM_COLS = 7  # W, S, DROP, shifted M2, tied LAST, tied count, NaN in min/max


class Layout:
    """An agreed, name-sorted list of (name, spec) with its fingerprint and derived indexes."""

    def __init__(self, entries: list[tuple[str, Spec]]) -> None:
        self.entries = entries
        self.names = [name for name, _ in entries]
        self.specs = [spec for _, spec in entries]
        self.index = {name: i for i, name in enumerate(self.names)}
        text = json.dumps([[name, spec.to_json()] for name, spec in entries], separators=(",", ":"))
        self.blob = text.encode()
        digest = hashlib.blake2b(self.blob, digest_size=8).digest()
        self.fingerprint = int.from_bytes(digest, "little") & _MASK62
        self.across = [i for i, spec in enumerate(self.specs) if spec.across != "exact"]
        self.exact = np.array([spec.across == "exact" for spec in self.specs], dtype=bool)
        self.sketch = [i for i, spec in enumerate(self.specs) if spec.needs_sketch]
        self.last = np.array(["last" in spec.reduce for spec in self.specs], dtype=bool)

    @classmethod
    def from_blob(cls, blob: bytes) -> Layout:
        return cls([(name, Spec.from_json(text)) for name, text in json.loads(blob.decode())])

    def covers(self, names: list[str], specs: list[Spec]) -> bool:
        """Whether every (name, spec) is in this layout."""
        for name, spec in zip(names, specs):
            i = self.index.get(name)
            if i is None or self.specs[i] != spec:
                return False
        return True


def _own_layout(metrics: Metrics) -> Layout:
    cache = metrics._sync_cache
    if cache.get("own_version") != metrics._version:
        entries = sorted(zip(metrics._names, metrics._specs), key=lambda e: e[0])
        cache["own"] = Layout(entries)
        cache["own_version"] = metrics._version
        cache.pop("plans", None)
    layout: Layout = cache["own"]
    return layout


def _proposal(metrics: Metrics, group_key: Any) -> Layout:
    """The layout this rank proposes: the last agreed union if it still covers us, else our own."""
    own = _own_layout(metrics)
    union = metrics._sync_cache.get(("union", group_key))
    if union is not None:
        checked = metrics._sync_cache.get(("covers", group_key))
        if checked != (metrics._version, union.fingerprint):
            if not union.covers(metrics._names, metrics._specs):
                return own
            metrics._sync_cache[("covers", group_key)] = (metrics._version, union.fingerprint)
        return union
    return own


def _slot_index(metrics: Metrics, layout: Layout) -> np.ndarray:
    """For each layout position, this rank's slot (or ``len(slots)`` for the identity row)."""
    plans = metrics._sync_cache.setdefault("plans", {})
    key = layout.fingerprint
    idx = plans.get(key)
    if idx is None:
        n = len(metrics._names)
        idx = np.array([metrics._index.get(name, n) for name in layout.names], dtype=np.int64)
        plans[key] = idx
    result: np.ndarray = idx
    return result


class _Comm:
    """The collectives of one sync, each with a timeout turned into ``SyncError``."""

    def __init__(self, dist: Any, group: Any, timeout: float | None) -> None:
        self.dist = dist
        self.group = group
        self.timeout = None if timeout is None else timedelta(seconds=timeout)
        self.count = 0

    def _wait(self, work: Any, what: str) -> None:
        self.count += 1
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(timeout=self.timeout)
        except Exception as exc:  # the backend's timeout or a peer that went away
            raise SyncError(f"metricsync sync: {what} did not complete: {exc}") from exc

    def all_reduce(self, tensor: Any, op: Any, what: str) -> Any:
        try:
            work = self.dist.all_reduce(tensor, op=op, group=self.group, async_op=True)
        except Exception as exc:
            raise SyncError(f"metricsync sync: {what} failed to start: {exc}") from exc
        self._wait(work, what)
        return tensor

    def all_gather(self, tensor: Any, world: int, what: str) -> list[Any]:
        import torch

        out = [torch.empty_like(tensor) for _ in range(world)]
        try:
            work = self.dist.all_gather(out, tensor, group=self.group, async_op=True)
        except Exception as exc:
            raise SyncError(f"metricsync sync: {what} failed to start: {exc}") from exc
        self._wait(work, what)
        return out


def sync(metrics: Metrics, group: Any = None, timeout: float | None = None) -> Metrics:
    """Merge ``metrics`` over every rank of ``group``; see the module docstring."""
    timeout = _check_timeout(timeout)  # bad arguments fail with or without a process group
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return metrics.copy()
    if not (dist.is_available() and dist.is_initialized()):
        return metrics.copy()
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError("this rank is not a member of the given process group")
    world = dist.get_world_size(group)
    device = _comm_device(dist, group, torch)
    comm = _Comm(dist, group, timeout)
    metrics._fold_pending()
    local_error = _device_error_flag(metrics, device, torch)

    group_key = (id(group), world)
    proposal = _proposal(metrics, group_key)
    check = torch.tensor(
        [proposal.fingerprint, -proposal.fingerprint, len(proposal.names), -len(proposal.names), 0],
        dtype=torch.int64,
        device=device,
    )
    if local_error is not None:
        check[4] = local_error.to(torch.int64)
    comm.all_reduce(check, dist.ReduceOp.MAX, "the layout check")
    fp_max, fp_neg_min, n_max, n_neg_min, error = check.tolist()
    if error:
        _raise_error(metrics)
    if fp_max == -fp_neg_min and n_max == -n_neg_min:
        layout = proposal
    else:
        layout = _exchange_layouts(metrics, comm, world, device, torch)
        metrics._sync_cache[("union", group_key)] = layout
    ops = _Ops(torch, device)
    if ops.host:
        metrics._fold_devices()  # gloo works on host memory; the check above found no bad records
    result = _reduce(metrics, layout, comm, ops)
    metrics._sync_cache[("last_collectives", group_key)] = comm.count
    return result


def _check_timeout(timeout: Any) -> float | None:
    """Seconds as a float; None (and timeouts beyond ``timedelta``'s range) wait without a limit."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    seconds = float(timeout)
    if not seconds > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return seconds if seconds < _MAX_TIMEOUT else None


def _rule_conflict(metrics: Metrics, layout: Layout) -> int:
    """1 + the last layout position whose name this rank's rules give another spec; 0 if none.

    Only names this rank holds no state for can differ (its own names got their
    spec from its rules); the answer is cached until the rules or names change.
    """
    cache = metrics._sync_cache
    key = (layout.fingerprint, metrics._version)
    hit = cache.get("rule_check")
    if hit is not None and hit[0] is metrics._table and hit[1] == key:
        found: int = hit[2]
        return found
    found = 0
    missing = np.flatnonzero(_slot_index(metrics, layout) == len(metrics._names))
    for i in missing.tolist():
        rule = metrics._table.explicit(layout.names[i])
        if rule is not None and rule != layout.specs[i]:
            found = i + 1
    cache["rule_check"] = (metrics._table, key, found)
    return found


def _raise_conflict(metrics: Metrics, layout: Layout, position: int) -> None:
    name, theirs = layout.names[position], layout.specs[position]
    mine = metrics._table.explicit(name)
    if mine is not None and mine != theirs:
        raise SpecMismatchError(
            f"metric {name!r} is declared {mine!r} on this rank and {theirs!r} on another rank"
        )
    raise SpecMismatchError(
        f"metric {name!r} is {theirs!r} here and declared differently on another rank"
    )


def _comm_device(dist: Any, group: Any, torch: Any) -> Any:
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _device_error_flag(metrics: Metrics, device: Any, torch: Any) -> Any:
    """A 0-d tensor on ``device``: 1 when any device record failed its checks (no host read)."""
    flags = [acc.bad.to(device) for accs in metrics._dev.values() for acc in accs.values()]
    if not flags:
        return None
    return (torch.stack(flags) != 0).any()


def _raise_error(metrics: Metrics) -> None:
    metrics._fold_devices()  # raises the ValueError naming the metric on the rank that has it
    raise SyncError("metricsync sync: another rank recorded invalid data (see that rank's error)")


def _exchange_layouts(metrics: Metrics, comm: _Comm, world: int, device: Any, torch: Any) -> Layout:
    own = _own_layout(metrics)
    size = torch.tensor([len(own.blob)], dtype=torch.int64, device=device)
    sizes = [int(s.item()) for s in comm.all_gather(size, world, "the layout size exchange")]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[: len(own.blob)] = torch.frombuffer(bytearray(own.blob), dtype=torch.uint8).to(device)
    blobs = comm.all_gather(padded, world, "the layout exchange")
    union: dict[str, Spec] = {}
    for rank, (blob, n) in enumerate(zip(blobs, sizes)):
        for name, spec in Layout.from_blob(bytes(blob[:n].cpu().numpy().tobytes())).entries:
            seen = union.setdefault(name, spec)
            if seen != spec:
                raise SpecMismatchError(
                    f"metric {name!r} is {seen!r} on one rank and {spec!r} on rank {rank}"
                )
    return Layout(sorted(union.items()))


class _Ops:
    """Array operations on the host (numpy, for gloo) or on a torch device (for NCCL)."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.host = device.type == "cpu"
        self.xp: Any = np if self.host else torch

    def asarray(self, array: np.ndarray) -> Any:
        return array if self.host else self.torch.from_numpy(array).to(self.device)

    def cat(self, parts: list[Any], axis: int = 0) -> Any:
        return np.concatenate(parts, axis=axis) if self.host else self.torch.cat(parts, dim=axis)

    def stack(self, parts: list[Any], axis: int = 0) -> Any:
        return np.stack(parts, axis=axis) if self.host else self.torch.stack(parts, dim=axis)

    def f64(self, array: Any) -> Any:
        return array.astype(np.float64) if self.host else array.to(self.torch.float64)

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return self.asarray(np.zeros(shape))

    def empty(self, size: int) -> Any:
        if self.host:
            return np.empty(size)
        return self.torch.empty(size, dtype=self.torch.float64, device=self.device)

    def comm(self, array: Any) -> Any:
        """The tensor a collective works on in place (shares memory with a host array)."""
        return self.torch.from_numpy(array) if self.host else array

    def to_host(self, array: Any) -> np.ndarray:
        return array if self.host else array.cpu().numpy()


def _local_table(metrics: Metrics, layout: Layout, ops: _Ops) -> Any:
    """This rank's state rows in layout order; device accumulators merged in (on the device)."""
    n = len(metrics._names)
    idx = _slot_index(metrics, layout)
    if len(idx) and idx.max() < n:  # every layout name is ours: no identity rows needed
        table = ops.asarray(metrics._rows[idx])
    else:
        table = ops.asarray(np.concatenate([metrics._rows[:n], st.IDENTITY[None, :]])[idx])
    for accs in metrics._dev.values():
        if not accs:
            continue
        pos = ops.asarray(np.array([layout.index[metrics._names[s]] for s in accs]))
        rows = ops.torch.stack([acc.row.to(ops.device) for acc in accs.values()])
        table[pos] = st.merge_rows(table[pos], rows, ops.torch)
    return table


def _local_sketch(metrics: Metrics, name: str, ops: _Ops) -> Any:
    slot = metrics._index.get(name)
    if slot is None:
        return None
    cells = ops.asarray(metrics._sketch[slot].copy())
    for accs in metrics._dev.values():
        acc = accs.get(slot)
        if acc is not None and acc.sketch is not None:
            cells = cells + acc.sketch.to(ops.device)
    return cells


def _reduce(metrics: Metrics, layout: Layout, comm: _Comm, ops: _Ops) -> Metrics:
    xp = ops.xp
    k = len(layout.names)
    inf = float("inf")
    table = _local_table(metrics, layout, ops)

    # Per-rank results of `across` metrics become aggregate rows; their local rows travel as empty.
    agg_parts = _across_aggregates(metrics, layout, ops.to_host(table[layout.across]), ops)
    if layout.across:
        drop = table[:, st.DROP] + 0.0
        table = xp.where(ops.asarray(layout.exact)[:, None], table, ops.asarray(st.IDENTITY))
        table[:, st.DROP] = drop
    agg = ops.asarray(np.concatenate(agg_parts) if agg_parts else np.zeros((0, 4)))

    # Column-major from here on: every column operation runs over contiguous memory.
    cols = np.ascontiguousarray(table.T) if ops.host else table.T.contiguous()
    w = cols[st.W]
    has = w > 0
    n_agg = agg.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = xp.where(has, cols[st.S] / xp.where(has, w, 1.0), -inf)
        mean = xp.where(xp.isnan(mean), -inf, mean)
        max_buf = ops.empty(k * _MAX_COLS + 2 * n_agg + 1)  # + a rule conflict flag
        max_view = max_buf[: k * _MAX_COLS].reshape(_MAX_COLS, k)
        max_view[:3] = cols[st.MAX : st.T + 1]
        max_view[3] = mean
        max_buf[k * _MAX_COLS : k * _MAX_COLS + 2 * n_agg] = agg[:, 2:].reshape(-1)
        nan_mm = xp.isnan(max_view[0]) | xp.isnan(max_view[1])
        max_buf[xp.isnan(max_buf)] = -inf
        max_buf[-1] = float(_rule_conflict(metrics, layout))
        comm.all_reduce(ops.comm(max_buf), comm.dist.ReduceOp.MAX, "the MAX all_reduce")
        conflict = int(max_buf[-1])
        if conflict:  # every rank sees the same flag, so every rank raises here
            _raise_conflict(metrics, layout, conflict - 1)

        t_max = max_view[2]
        shift = xp.where(xp.isfinite(max_view[3]), max_view[3], 0.0)
        d = xp.where(has, mean - shift, 0.0)
        tied = (cols[st.T] == t_max) & (t_max > -inf) & ops.asarray(layout.last)
        sketch_parts = []
        for i in layout.sketch:
            cells = _local_sketch(metrics, layout.names[i], ops) if layout.exact[i] else None
            if cells is None:
                from ._sketch import sketch_layout

                cells = ops.zeros((sketch_layout(layout.specs[i].accuracy).n_cells,))
            sketch_parts.append(cells)
        sketch_sizes = [len(cells) for cells in sketch_parts]
        agg_nan_at = k * _SUM_COLS + 2 * n_agg + sum(sketch_sizes)
        sum_buf = ops.empty(agg_nan_at + n_agg)  # + a NaN flag per aggregate row
        sum_view = sum_buf[: k * _SUM_COLS].reshape(_SUM_COLS, k)
        sum_view[0] = w
        sum_view[1] = cols[st.S]
        sum_view[2] = cols[st.DROP]
        sum_view[3] = cols[st.M2] + w * d * d  # M2 around the common shift
        sum_view[4] = xp.where(tied, cols[st.LAST], 0.0)
        sum_view[5] = tied
        sum_view[6] = nan_mm
        offset = k * _SUM_COLS
        sum_buf[offset : offset + 2 * n_agg] = agg[:, :2].reshape(-1)
        offset += 2 * n_agg
        for cells in sketch_parts:
            sum_buf[offset : offset + len(cells)] = cells
            offset += len(cells)
        # A NaN rank value must win the max/min of an across aggregate (as in merge),
        # but the MAX all_reduce above saw it as -inf: its flag travels here.
        sum_buf[agg_nan_at:] = xp.isnan(agg[:, 2]) | xp.isnan(agg[:, 3])
        comm.all_reduce(ops.comm(sum_buf), comm.dist.ReduceOp.SUM, "the SUM all_reduce")

        ties = sum_view[5]
        last = sum_view[4] / xp.where(ties > 0, ties, 1.0)
        if bool((ties > 1).any()):  # equal times on several ranks: the larger value wins
            cand = xp.where(tied & (ties > 1), cols[st.LAST], -inf)
            comm.all_reduce(ops.comm(cand), comm.dist.ReduceOp.MAX, "the tie-break all_reduce")
            last = xp.where(ties > 1, cand, last)

        total_w = sum_view[0]
        nan_any = sum_view[6] > 0
        pos = total_w > 0
        d_all = xp.where(pos, sum_view[1] / xp.where(pos, total_w, 1.0) - shift, 0.0)
        m2 = sum_view[3] - total_w * d_all * d_all
        out = ops.empty(k * st.NCOL + 4 * n_agg)
        rows = out[: k * st.NCOL].reshape(st.NCOL, k)
        rows[st.W] = total_w
        rows[st.S] = sum_view[1]
        rows[st.MAX] = xp.where(nan_any, float("nan"), max_view[0])
        rows[st.NEGMIN] = xp.where(nan_any, float("nan"), max_view[1])
        rows[st.T] = t_max
        rows[st.LAST] = last
        rows[st.M2] = xp.where(m2 < 0, 0.0, m2)
        rows[st.DROP] = sum_view[2]
        aggs = out[k * st.NCOL :].reshape(n_agg, 4)
        aggs[:, :2] = sum_buf[k * _SUM_COLS : k * _SUM_COLS + 2 * n_agg].reshape(n_agg, 2)
        aggs[:, 2:] = xp.where(
            (sum_buf[agg_nan_at:] > 0)[:, None],
            float("nan"),
            max_buf[k * _MAX_COLS : k * _MAX_COLS + 2 * n_agg].reshape(n_agg, 2),
        )
    sketches = sum_buf[k * _SUM_COLS + 2 * n_agg : agg_nan_at]
    host = ops.to_host(ops.cat([out, sketches]) if sketch_parts else out)
    return _build_result(metrics, layout, host, n_agg, sketch_sizes)


def _across_aggregates(
    metrics: Metrics, layout: Layout, rows: np.ndarray, ops: _Ops
) -> list[np.ndarray]:
    """Per across metric, its (stats x 4) aggregate: own finished ranks plus this rank's values."""
    parts: list[np.ndarray] = []
    if not layout.across:
        return parts
    specs = [layout.specs[i] for i in layout.across]
    local = local_values(
        specs, rows, [_across_sketch(metrics, layout, i, ops) for i in layout.across]
    )
    for j, i in enumerate(layout.across):
        spec = layout.specs[i]
        slot = metrics._index.get(layout.names[i])
        base = metrics._agg[slot] if slot is not None else empty_aggregate(len(spec.reduce))
        agg = base.copy()
        if rows[j, st.W] > 0:
            agg = merge_aggregates(agg, rank_aggregate(local[j, : len(spec.reduce)]))
        parts.append(agg)
    return parts


def _across_sketch(metrics: Metrics, layout: Layout, i: int, ops: _Ops) -> np.ndarray | None:
    """This rank's sketch cells of across metric ``i`` on the host, or None without one."""
    if not layout.specs[i].needs_sketch:
        return None
    cells = _local_sketch(metrics, layout.names[i], ops)
    return None if cells is None else ops.to_host(cells)


def _build_result(
    metrics: Metrics, layout: Layout, host: np.ndarray, n_agg: int, sketch_sizes: list[int]
) -> Metrics:
    """A new Metrics over ``layout`` from the reduced host buffer (rows, aggregates, sketches)."""
    from ._metrics import Metrics

    k = len(layout.names)
    result = Metrics()
    result._table = metrics._table.copy()
    result._names, result._index, result._specs = layout.names, layout.index, layout.specs
    result._layout_shared = True  # copied on the result's first new name or respec
    rows = host[: k * st.NCOL].reshape(st.NCOL, k).T  # a column-major view: no copy
    result._rows = rows if k else st.empty_rows(8)
    offset = k * st.NCOL
    aggs = host[offset : offset + 4 * n_agg].reshape(n_agg, 4)
    offset += 4 * n_agg
    row = 0
    for i in layout.across:
        count = len(layout.specs[i].reduce)
        result._agg[i] = aggs[row : row + count].copy()
        row += count
    for i, size in zip(layout.sketch, sketch_sizes):
        result._sketch[i] = host[offset : offset + size].copy()
        offset += size
    result._version = 1
    result._sync_cache["own"] = layout
    result._sync_cache["own_version"] = 1
    return result
