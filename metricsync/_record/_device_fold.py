"""The device fold: every pending record of one device reduced at once, on the device.

Rows and lengths go over in one pinned copy, elements learn their row by
``repeat_interleave``, and each needed column is one segment reduction: the number of ops
depends on the columns needed, not on the records or metrics.

>>> import torch
>>> from metricsync._record._device import DeviceState
>>> from metricsync._state._spec import Spec
>>> state = DeviceState(torch.device("cpu"))
>>> row = state.add(0, Spec(("mean", "max")), torch.tensor([1.0, 5.0]), None, None, now=1.0)
>>> slots, cols, cells, bad = state.snapshot()
>>> cols[[0, 1, 2], 0].tolist()
[2.0, 6.0, 5.0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from .._state import _algebra as al
from .._state._sketch import cells_torch, sketch_layout
from .._state._spec import Spec

__all__ = ["BAD_CHANGED", "BAD_MASK", "BAD_NAN", "BAD_WEIGHT", "device_error", "fold_batch"]

_F64 = torch.float64
BAD_WEIGHT, BAD_MASK, BAD_NAN = 1.0, 2.0, 3.0  #: error codes of a row, the larger wins
BAD_CHANGED = 4.0  #: a referenced tensor was changed in place before the fold read it


def device_error(name: str, code: float) -> ValueError:
    """The error of a device record of ``name`` that failed its checks (``code``)."""
    if code == BAD_CHANGED:
        return ValueError(
            f"metric {name!r}: a recorded tensor was changed in place before metricsync "
            "read it (record a .clone() of a tensor you overwrite); that record was discarded"
            f"{_UNTIL_RESET}"
        )
    what = {
        BAD_NAN: "a non-finite sample under nan='error'",
        BAD_MASK: "a mask value other than 0 or 1 (use weight= for fractions)",
    }.get(code, "a negative or non-finite weight (or a mask value other than 0 or 1)")
    return ValueError(
        f"metric {name!r}: a recorded tensor held {what}; that record was discarded{_UNTIL_RESET}"
    )


_UNTIL_RESET = " (every compute(), sync() and copy() raises this until reset())"


_POLICY = {"propagate": 0.0, "ignore": 1.0, "error": 2.0}


def fold_batch(
    device: torch.device,
    specs: Sequence[Spec],
    x: torch.Tensor,
    wts: torch.Tensor | None,
    records: np.ndarray,
    sketch_of: Mapping[int, tuple[float, int]],
    sketch_rows: Mapping[float, int],
    upload: Callable[[np.ndarray], torch.Tensor],
) -> tuple[torch.Tensor, dict[float, torch.Tensor], torch.Tensor | None]:
    """``(cols (NCOL_ALL, rows), {accuracy: sketch additions}, error code per row or None)``.

    ``records`` is an ``(r, 5)`` array of ``(row, start, n, kind, stamp)``, covering ``x``
    in order of start; ``kind`` 0 means unweighted, 1 a weight (checked finite and >= 0), 2 a
    mask alone (checked 0/1), 3 a boolean mask alone (nothing to check). Of two
    records, the one with the later stamp is the later one (``last``).
    ``sketch_of`` maps rows with a sketch to ``(accuracy, index)``; ``sketch_rows``
    gives each accuracy's row count. Ops: a few dozen, by the columns the metrics
    need and the checks the records need, whatever the number of records.
    """
    n_rows, r, n = len(specs), len(records), x.numel()
    rec = records.T
    rows_here = np.unique(rec[0]).astype(np.intp).tolist()
    used = list({id(s): s for s in map(specs.__getitem__, rows_here)}.values())  # distinct
    needed = set().union(*map(al.needed_columns, used)) | {al.W, al.S}
    for pair in ((al.MAX, al.NEGMIN), (al.LAST, al.T)):  # computed together
        if needed & set(pair):
            needed |= set(pair)
    need = sorted(needed - {al.MAXRANK, al.MINRANK})  # ranks: across ranks, not here
    kinds = set(np.unique(rec[3]).tolist())
    singles = bool((rec[2] == 1).all())  # every record one sample: rows are elements' rows
    accs = sorted({sketch_of[row][0] for row in rows_here if row in sketch_of})
    sketch_maps = [np.full(n_rows, -1.0) for _ in accs]
    for row, (acc, index) in sketch_of.items():
        if acc in accs:  # rows of other accuracies have no records in this batch
            sketch_maps[accs.index(acc)][row] = index
    has_policy = {s.nan for s in used} - {"propagate"}
    if singles and kinds == {0} and not has_policy and not accs and needed <= _COUNTED:
        return _fold_counted(n_rows, x, rec[0], upload), {}, None
    policies = np.array([_POLICY[s.nan] for s in specs])
    mixed = len(kinds - {0}) > 0 and 0 in kinds  # weighted records beside plain ones
    checks = bool(kinds & {1, 2})
    last = al.LAST in need
    # ints: rows, lengths, needed columns, last-order keys; floats: the rest
    order = np.argsort(rec[4], kind="stable")
    rank = np.empty(r)
    rank[order] = np.arange(r)
    ints = [rec[0], rec[2], np.array(need, dtype=np.float64)]
    if last:
        ints.append(rank * n - rec[1])  # a sample's order: its record's rank, then its place
    floats = [al.IDENTITY, rec[3], rec[4], policies, *sketch_maps]
    sizes = [len(a) for a in ints + floats]
    meta = upload(np.concatenate(ints + floats))
    n_int = sum(sizes[: len(ints)])
    int_part = meta.narrow(0, 0, n_int).long().split(sizes[: len(ints)])
    float_part = meta.narrow(0, n_int, len(meta) - n_int).split(sizes[len(ints) :])
    rec_row, rec_len, need_idx = int_part[:3]
    ident, rec_kind, rec_stamp, policy = float_part[:4]
    maps = float_part[4:]
    need_rec = mixed or checks or last or "error" in has_policy
    elem_rec: torch.Tensor | None = None
    if need_rec:
        elem_rec = torch.arange(r, device=device)
        if not singles:
            elem_rec = torch.repeat_interleave(elem_rec, rec_len, output_size=n)
    elem_row = rec_row if singles else torch.repeat_interleave(rec_row, rec_len, output_size=n)
    x = x.to(_F64)

    # value checks: a failing record is left out and its row flagged
    code = None
    w = None
    if wts is not None and kinds - {0}:
        w = torch.where(rec_kind[elem_rec] > 0, wts, 1.0) if mixed else wts
    if checks:
        assert w is not None and elem_rec is not None
        kind = rec_kind[elem_rec]
        bad_w = (kind == 1) & ((w < 0) | ~torch.isfinite(w))
        bad_m = (kind == 2) & (w != 0) & (w != 1)
        code = torch.where(bad_w, BAD_WEIGHT, torch.where(bad_m, BAD_MASK, 0.0))
    nonfinite = ~torch.isfinite(x) if has_policy else None
    pol = policy[elem_row] if has_policy else None
    positive = None if w is None else w > 0
    if "error" in has_policy:
        assert nonfinite is not None and pol is not None
        bad_n = (pol == 2) & nonfinite
        bad_n = bad_n if positive is None else bad_n & positive
        code = torch.where(bad_n, BAD_NAN, 0.0 if code is None else code)
    bad = None
    keep = positive
    if code is not None:
        if singles:
            rec_code = code.to(_F64)
        else:
            assert elem_rec is not None
            rec_code = torch.zeros(r, dtype=_F64, device=device).scatter_reduce_(
                0, elem_rec, code.to(_F64), "amax"
            )
        bad = torch.zeros(n_rows, dtype=_F64, device=device)
        bad = bad.scatter_reduce_(0, rec_row, rec_code, "amax")
        ok = rec_code == 0 if singles else rec_code[elem_rec] == 0
        keep = ok if keep is None else keep & ok
    drop = None
    if "ignore" in has_policy:
        assert nonfinite is not None and pol is not None
        drop = (pol == 1) & nonfinite
        drop = drop if keep is None else drop & keep
        keep = ~drop if keep is None else keep & ~drop
    w_eff = None if keep is None else keep.to(_F64) if w is None else torch.where(keep, w, 0.0)
    x0 = x if keep is None else torch.where(keep, x, 0.0)

    cols: dict[int, torch.Tensor] = {}
    zeros = torch.zeros(n_rows, dtype=_F64, device=device)
    if w_eff is None:
        cols[al.W] = zeros.index_add(0, rec_row, rec_len.to(_F64))
        cols[al.S] = zeros.index_add(0, elem_row, x)
    else:
        cols[al.W] = zeros.index_add(0, elem_row, w_eff)
        cols[al.S] = zeros.index_add(0, elem_row, x0 * w_eff)
    if al.MAX in need or al.NEGMIN in need:
        kept = x if keep is None else torch.where(keep, x, -torch.inf)
        low = -x if keep is None else torch.where(keep, -x, -torch.inf)
        cols[al.MAX] = ident[al.MAX].expand(n_rows).scatter_reduce(0, elem_row, kept, "amax")
        cols[al.NEGMIN] = ident[al.NEGMIN].expand(n_rows).scatter_reduce(0, elem_row, low, "amax")
    if last:
        assert elem_rec is not None
        key = int_part[3][elem_rec] + torch.arange(n, device=device)
        key = key if keep is None else torch.where(keep, key, -1)
        latest = torch.full((n_rows,), -1, dtype=torch.int64, device=device)
        latest = latest.scatter_reduce_(0, elem_row, key, "amax")
        hit = torch.where(key == latest[elem_row], torch.arange(n, device=device), -1)
        hit = hit if keep is None else torch.where(keep, hit, -1)
        at = torch.full((n_rows,), -1, dtype=torch.int64, device=device)
        at = at.scatter_reduce_(0, elem_row, hit, "amax")
        found, at = at >= 0, at.clamp(min=0)
        cols[al.LAST] = torch.where(found, x[at], 0.0)
        cols[al.T] = torch.where(found, rec_stamp[elem_rec[at]], -torch.inf)
    if al.M2 in need:
        w_sum = cols[al.W]
        mean = cols[al.S] / torch.where(w_sum > 0, w_sum, 1.0)
        dev = x0 - mean[elem_row]
        sq = dev * dev if w_eff is None else w_eff * dev * dev
        cols[al.M2] = zeros.index_add(0, elem_row, sq)
    if al.N in need:  # the samples of positive weight, and their squared weights
        cols[al.N] = (
            cols[al.W] if w_eff is None else zeros.index_add(0, elem_row, (w_eff > 0).to(_F64))
        )
    if al.W2 in need:
        cols[al.W2] = cols[al.W] if w_eff is None else zeros.index_add(0, elem_row, w_eff * w_eff)
    if drop is not None:
        cols[al.DROP] = zeros.index_add(0, elem_row, drop.to(_F64))
    sketches = {}
    for i, acc in enumerate(accs):
        sketches[acc] = _sketch_cells(acc, maps[i], sketch_rows[acc], x, w_eff, elem_row)
    assert sorted(cols) == need
    stacked = torch.stack([cols[c] for c in need])
    out = ident.unsqueeze(1).expand(al.NCOL_ALL, n_rows)
    return out.index_copy(0, need_idx, stacked), sketches, bad


_COUNTED = frozenset((al.W, al.S))  #: rows that need these only: sums and counts


def _fold_counted(
    n_rows: int, x: torch.Tensor, rows: np.ndarray, upload: Callable[[np.ndarray], torch.Tensor]
) -> torch.Tensor:
    """The state columns of unweighted single samples of rows that need only ``W`` and
    ``S``: the counts are known on the host, so they go up with the identity columns and
    the rows in the one upload, and ``S`` is one ``index_add_`` (what :func:`fold_batch`
    computes for them, with a quarter of its ops)."""
    block = np.repeat(al.IDENTITY[:, None], n_rows, axis=1)
    block[al.W] = np.bincount(rows.astype(np.intp), minlength=n_rows)
    meta = upload(np.concatenate([rows, block.reshape(-1)]))
    r = len(rows)
    out = meta.narrow(0, r, al.NCOL_ALL * n_rows).view(al.NCOL_ALL, n_rows)
    out[al.S].index_add_(0, meta.narrow(0, 0, r).long(), x.to(_F64))
    return out


def _sketch_cells(
    accuracy: float,
    index_of_row: torch.Tensor,
    n_sketches: int,
    x: torch.Tensor,
    w: torch.Tensor | None,
    elem_row: torch.Tensor,
) -> torch.Tensor:
    """``(n_sketches, n_cells)`` additions from the elements of rows with a sketch of ``accuracy``."""
    layout = sketch_layout(accuracy)
    index = index_of_row[elem_row]
    mine = index >= 0
    weight = mine.to(_F64) if w is None else torch.where(mine, w, 0.0)
    base = index.clamp(min=0).long() * layout.n_cells
    cell, clamped = cells_torch(layout, x)
    out = torch.zeros(n_sketches * layout.n_cells, dtype=_F64, device=x.device)
    out.index_add_(0, base + cell, weight)
    out.index_add_(0, base + layout.clamped_cell, torch.where(clamped, weight, 0.0))
    return out.reshape(n_sketches, layout.n_cells)
