"""Token-weighted actor metrics from the response mask verl already has.

verl's policy losses return per-micro-batch token means (``actor/ppo_kl``,
``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``: ``masked_mean`` over the
micro-batch's valid tokens), and verl records them as ``MEAN`` metrics with
equal weight per micro-batch. When micro-batches or DP ranks hold different
numbers of valid tokens, that mean of means is not the token mean of the
batch. Weighting each micro-batch's mean by its number of valid tokens makes
the pooled result exactly the global token mean, on any split.

The recipe, inside verl's ``ppo_loss`` (``verl/workers/utils/losses.py``)::

    # pg_metrics = Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN)
    pg_metrics = token_mean_metrics(pg_metrics, response_mask)

and, where ``agg_loss(..., loss_agg_mode="token-mean")`` ran without global
batch information (so verl records ``pg_loss`` and the entropy loss as
``MEAN`` of micro-batch token means)::

    metrics.update(token_mean_metrics({"actor/pg_loss": pg_loss}, response_mask))

When verl scales the loss by the global token count (``dp_size > 1``, or
``batch_num_tokens`` given), it records ``SUM`` over micro-batches and mean
over ranks, which is already exact: keep that.

With :class:`metricsync.Metrics` directly, the same is one line per value::

    metrics.record("actor/ppo_kl", ppo_kl, weight=response_mask.sum())

and a per-token tensor can be recorded as it is:
``metrics.record("actor/entropy", entropy, mask=response_mask)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._metric import AggregationType, Metric

__all__ = ["token_mean_metrics"]


def token_mean_metrics(values: Mapping[str, Any], response_mask: Any) -> dict[str, Metric]:
    """One ``MEAN`` :class:`Metric` per entry, weighted by the valid tokens of ``response_mask``.

    Each value must be a token mean over ``response_mask``'s valid tokens
    (verl's ``masked_mean``, or ``agg_loss`` in ``"token-mean"`` mode
    without global batch information); ``response_mask`` is a boolean or
    0/1 tensor or array. The weight is the mask's sum, kept on its device.

    >>> import numpy as np
    >>> short = token_mean_metrics({"actor/ppo_kl": 0.5}, np.ones((2, 3)))   # 6 tokens
    >>> long = token_mean_metrics({"actor/ppo_kl": 0.1}, np.ones((2, 27)))   # 54 tokens
    >>> round(float(Metric.aggregate_dp([short["actor/ppo_kl"], long["actor/ppo_kl"]])), 6)
    0.14
    """
    tokens = response_mask.sum()
    return {
        key: Metric(AggregationType.MEAN, value, weight=tokens) for key, value in values.items()
    }
