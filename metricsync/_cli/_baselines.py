"""Contenders of the sync benchmark: other projects' metric reductions, written from their
published algorithms so that ``metricsync bench`` times them in the same processes.

>>> olmo_divide_factor(8)
4.0
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["OLMO_KIND", "olmo_core_reduce", "olmo_divide_factor"]

#: The benchmark's spec kinds as OLMo-core reduce types. OLMo-core has no std:
#: those metrics go through its cheapest path, a plain mean.
OLMO_KIND = {"mean": "mean", "sum": "sum", "max": "max", "std": "mean"}


def olmo_divide_factor(world: int) -> float:
    """The power of two OLMo-core divides SUM-reduced metrics by before the reduce."""
    factor = 1
    while world % factor == 0 and world / factor > factor:
        factor *= 2
    return float(factor)


def olmo_core_reduce(
    metrics: dict[int, dict[str, Any]], reduce_types: dict[str, str], group: Any = None
) -> dict[int, dict[str, float]]:
    """OLMo-core's ``reduce_metrics``, replicated for the benchmark (same algorithm).

    After ``reduce_metrics`` in OLMo-core's ``src/olmo_core/train/utils.py``
    (allenai/OLMo-core): metrics are ``{step: {name: 0-d tensor}}`` with one
    reduce type per name. Per step, names are taken in sorted order; ``mean``
    and ``sum`` go to a SUM group, ``l2_norm`` to it squared, ``max`` to a MAX
    group. Each group's values are stacked per step, padded to the longest
    step and stacked into one 2-D tensor; the SUM tensor is divided by a
    power-of-two factor before the reduce and multiplied back after. One SUM
    and one MAX collective, one host copy each, ``tolist``, then the values go
    back into a dict by name (``mean`` divided by the world size, ``l2_norm``
    square-rooted). OLMo-core reduces to rank 0 with ``dist.reduce``; here it
    is ``all_reduce``, so that every rank holds the result as after
    ``Metrics.sync()``.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    world = dist.get_world_size(group)
    factor = olmo_divide_factor(world)
    out: dict[int, dict[str, float]] = {}
    sum_names: list[list[str]] = []
    sum_rows: list[Any] = []
    max_names: list[list[str]] = []
    max_rows: list[Any] = []
    for step in sorted(metrics):
        s_names: list[str] = []
        s_vals: list[Any] = []
        m_names: list[str] = []
        m_vals: list[Any] = []
        step_metrics = metrics[step]
        for name in sorted(step_metrics):
            value = step_metrics[name]
            kind = reduce_types[name]
            if kind in ("mean", "sum"):
                s_names.append(name)
                s_vals.append(value)
            elif kind == "l2_norm":
                s_names.append(name)
                s_vals.append(value.pow(2))
            elif kind == "max":
                m_names.append(name)
                m_vals.append(value)
            else:
                out.setdefault(step, {})[name] = value.item()
        sum_names.append(s_names)
        sum_rows.append(torch.stack(s_vals) if s_vals else torch.tensor([]))
        max_names.append(m_names)
        max_rows.append(torch.stack(m_vals) if m_vals else torch.tensor([]))
    width_sum = max(t.numel() for t in sum_rows)
    width_max = max(t.numel() for t in max_rows)
    sums = torch.stack([F.pad(t, (0, width_sum - t.numel()), value=0.0) for t in sum_rows])
    maxes = torch.stack([F.pad(t, (0, width_max - t.numel()), value=0.0) for t in max_rows])
    sums.div_(factor)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=group)
    sums.mul_(factor)
    sums, maxes = sums.cpu(), maxes.cpu()
    for i, step in enumerate(sorted(metrics)):
        step_out = out.setdefault(step, {})
        for name, item in zip(sum_names[i], sums[i].tolist()):
            kind = reduce_types[name]
            if kind == "mean":
                item = item / world
            elif kind == "l2_norm":
                item = math.sqrt(item)
            step_out[name] = item
        for name, item in zip(max_names[i], maxes[i].tolist()):
            step_out[name] = item
    return out
