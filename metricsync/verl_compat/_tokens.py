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

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._metric import AggregationType, Metric, WeightedMean

__all__ = [
    "POLICY_TOKEN_MEANS",
    "VALUE_TOKEN_MEANS",
    "token_mean_metrics",
    "token_weighted_policy_loss",
    "token_weighted_value_loss",
]


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


#: verl 0.9.1's policy-loss metrics that are ``masked_mean`` over the loss function's
#: ``response_mask`` in every policy loss it registers.
POLICY_TOKEN_MEANS = ("actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower")
#: verl 0.9.1's value-loss metrics that are ``masked_mean`` over the batch's ``response_mask``.
VALUE_TOKEN_MEANS = ("critic/vf_clipfrac", "critic/vpred_mean")


def _weigh(metrics: Any, keys: tuple[str, ...], response_mask: Any) -> Any:
    """``metrics`` with each of ``keys`` that holds a plain number made a :class:`WeightedMean`.

    The number stays a number for any other reader (verl's own code, a user's
    direct call of verl's loss function); this package's ``Metric`` takes its
    weight. Reading the token count is one device sync per call, beside the
    ``.item()`` verl already does per metric.
    """
    if not isinstance(metrics, dict) or response_mask is None:
        return metrics
    mine = [k for k in keys if k in metrics and _is_number(metrics[k])]
    if not mine:
        return metrics
    tokens = float(response_mask.sum())
    return {**metrics, **{k: WeightedMean(metrics[k], weight=tokens) for k in mine}}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)


def token_weighted_policy_loss(fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's policy loss ``fn``, its token-mean metrics weighted by the ``response_mask`` it got.

    verl's ``ppo_loss`` passes the metrics on to ``Metric.from_dict(...,
    MEAN)``, which keeps the weights.
    """
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def token_weighted(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        try:
            mask = signature.bind_partial(*args, **kwargs).arguments.get("response_mask")
        except TypeError:
            return out
        if not (isinstance(out, tuple) and len(out) == 2):
            return out
        loss, metrics = out
        return loss, _weigh(metrics, POLICY_TOKEN_MEANS, mask)

    token_weighted.__metricsync_wraps__ = fn  # type: ignore[attr-defined]
    return token_weighted


def _mask_of(data: Any) -> Any:
    """The boolean response mask in verl's loss ``data`` (a TensorDict, nested or padded)."""
    try:
        mask = data["response_mask"]
    except (KeyError, TypeError):
        return None
    if getattr(mask, "is_nested", False):
        mask = mask.values()
    return mask.bool() if hasattr(mask, "bool") else mask


def token_weighted_value_loss(fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``value_loss`` ``fn``, its token-mean metrics weighted by the batch's valid tokens."""

    @functools.wraps(fn)
    def token_weighted(config: Any, model_output: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        mask = _mask_of(data)  # before the call: value_loss selects from ``data``
        loss, metrics = fn(config, model_output, data, *args, **kwargs)
        return loss, _weigh(metrics, VALUE_TOKEN_MEANS, mask)

    token_weighted.__metricsync_wraps__ = fn  # type: ignore[attr-defined]
    return token_weighted
