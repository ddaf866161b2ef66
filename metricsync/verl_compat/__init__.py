"""verl's metric names backed by metricsync, and a switch that puts them inside verl.

Written against verl 0.9.1, whose metric code is ``verl.utils.metric``
(``AggregationType``, ``Metric``, ``reduce_metrics``, ``NumericType``,
``Numeric``), plus two helpers its workers call on metrics dicts:
``verl.utils.py_functional.append_to_dict`` and
``verl.utils.torch_functional.allgather_dict_into_dict``. This package offers
all of them with verl's signatures.

Two ways in
-----------

**Inside verl** (its workers, trainer and losses), switch verl's own modules
once per process, driver and workers alike, before any metric is recorded::

    import metricsync.verl_compat
    metricsync.verl_compat.install()

:func:`install` replaces those objects in verl's modules (and wherever a
loaded module imported them), so verl's loss functions create this
package's :class:`Metric`, its workers collect micro-batches with this
:func:`append_to_dict`, and their DP reduction (:func:`allgather_dict_into_dict`
then ``Metric.aggregate_dp``) is one :meth:`metricsync.Metrics.sync` with no
pickled gather. :func:`uninstall` (or ``with install(): ...``) undoes it.

**In your own code**, import the names::

    from metricsync.verl_compat import AggregationType, Metric, reduce_metrics

Do not mix the two halves: verl's own ``Metric`` meeting this one in any
function here raises :class:`MixedMetricError`, which says to call
:func:`install`. A list of ``SUM`` metrics in :func:`reduce_metrics` raises
``ValueError`` with the same advice: verl's own ``append_to_dict`` builds one,
a metric per micro-batch, when its modules are not switched, and reading it
as DP ranks would average the sums.

Meaning of the aggregation types, as in verl:

- ``MEAN``: the mean of the values (weighted when weights are given); across
  data-parallel (DP) ranks, the mean over every value of every rank.
- ``SUM``: on one rank, the sum over its values (one per gradient-accumulation
  micro-batch, typically); across DP ranks, the mean of the ranks' sums.
- ``MIN`` / ``MAX``: the smallest / largest value of every rank.

>>> ranks = [Metric("sum"), Metric("sum")]
>>> ranks[0].extend([1.0, 2.0])          # rank 0: two micro-batches
>>> ranks[1].extend([3.0, 4.0, 5.0])     # rank 1: three (verl raises here)
>>> Metric.aggregate_dp(ranks)           # mean of the rank sums 3 and 12
np.float64(7.5)

Token means
-----------

verl computes ``actor/ppo_kl``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
``critic/vf_clipfrac`` and ``critic/vpred_mean`` as a ``masked_mean`` per
micro-batch and records them as ``MEAN`` metrics of equal weight: its number
is a mean of micro-batch means, not the token mean the name promises, and
verl raises when DP ranks run different numbers of micro-batches.
:func:`install` (``token_mean=True``, the default) wraps verl's policy losses
and ``value_loss`` so that each of these values carries its micro-batch's
valid-token count (``response_mask.sum()``) as its weight: the logged value
is then the global token mean over micro-batches, mini-batches and DP ranks,
whatever the split. ``install(token_mean=False)`` keeps verl's numbers, and
raises where verl raises (an unweighted ``MEAN`` whose ranks hold different
numbers of values), naming the key and the counts.

Single controller
-----------------

Ray workers return a :class:`metricsync.Metrics` (or ``None``) from any
``register``-ed method; the driver merges the results with
``metricsync.collect``, or passes :func:`collect_metrics` as the ``collect_fn``
of a custom dispatch mode where verl's own collect function would
concatenate ``DataProto`` outputs. After an in-worker ``sync``, return the
result from one rank only (the others return ``None``), or it is counted
once per rank. For verl's nd mesh dispatch (its engine workers'
``make_nd_compute_dataproto_dispatch_fn(mesh_name)``), register with
:func:`make_nd_collect_metrics` ``(mesh_name)``: the same dispatch, and a
collect that keeps only the workers verl's collect mask marks (one per DP
rank), so TP/PP replicas count once. verl's own engine glue (the DP gather
inside the worker, then verl's collect) is covered by :func:`install`.

After :func:`install`, what a worker returns may hold this package's
``Metric`` (for instance ``kl_coef``, a plain value that the switched DP
gather returns as a ``Metric``). A driver that did not switch cannot read it
right: numpy, ``float()``, iteration or ``values`` on such a ``Metric`` raise
:class:`MixedMetricError` with the advice to call :func:`install` there too.

Token-weighted actor metrics: :func:`token_mean_metrics` (see its module for
the recipe inside verl's ``ppo_loss``).

Where this differs from verl 0.9.1
----------------------------------

Everything else follows verl: results are numpy float64 scalars;
``reduce_metrics`` updates its argument in place and returns it; an empty
``SUM`` gives 0.0, an empty ``MEAN`` NaN, an empty ``MIN``/``MAX`` raises
``ValueError``; bad values, unknown aggregation names and aggregation
mismatches in ``extend`` raise ``ValueError``. The differences are deliberate:

.. list-table::
   :header-rows: 1

   * - Case
     - verl 0.9.1
     - here
     - why
   * - ``aggregate_dp`` over ranks holding different numbers of values
     - ``ValueError``
     - ``SUM``: mean of the rank sums (a rank without values sums to 0.0);
       weighted ``MEAN``: the weighted mean of every value (a
       :class:`WeightedMean`); ``MIN``/``MAX``: over every value; an
       unweighted ``MEAN`` raises ``ValueError`` as verl does, naming the key
       and the counts
     - the right number where there is one; uneven micro-batch counts are
       normal (dynamic batch sizes, uneven data), but a mean of micro-batch
       means without token counts has no right answer
   * - ``aggregate_dp`` over ranks whose aggregation types differ
     - uses the first rank's type
     - ``ValueError``
     - ranks that disagree on the type disagree on how the value was
       scaled; reading them all by the first rank's rule is a silent
       wrong number
   * - a tensor with more than one element
     - ``ValueError``
     - each element is one value
     - per-token tensors can be recorded as they are
   * - an appended tensor
     - ``.item()`` at once (a device-to-host sync per append)
     - accumulated on its device, read once in ``aggregate()``
     - no stall per micro-batch
   * - numpy scalars that are not Python floats (``np.float32``)
     - ``ValueError``
     - accepted
     - they are numbers
   * - a list given to ``append`` or to ``Metric(agg, value)``
     - ``ValueError`` (though the constructor's signature allows a list)
     - each item appended
     - what the signature promises
   * - ``values`` after appending an array
     - the array, as one entry
     - one entry per element
     - the same rule as for tensors
   * - the result over integers, booleans or float32 tensors
     - numpy's type for them (``np.int64``, ``np.bool_``, ``np.float32``)
     - ``np.float64``
     - metricsync's state is float64
   * - weights
     - none
     - ``append(v, weight=w)``, ``from_dict(..., weight=w)``,
       :func:`token_mean_metrics`, ``install(token_mean=True)``
     - token-weighted means
   * - ``actor/ppo_kl``, ``pg_clipfrac``, ``pg_clipfrac_lower``,
       ``critic/vf_clipfrac``, ``vpred_mean`` after ``install()``
     - mean of micro-batch means
     - global token mean (``token_mean=False``: verl's number)
     - the number the name promises, on any split
   * - ``metric[0]`` of a gathered single value
     - (verl: a float, not subscriptable)
     - the metric
     - verl's MTP-loss lines read every form
   * - ``reduce_metrics`` on a list of ``Metric`` objects
     - numpy fails
     - ``MEAN``/``MIN``/``MAX`` pooled; ``SUM`` raises (ambiguous)
     - after :func:`install`, verl's workers hand such lists on
   * - ``reduce_metrics`` on a ``metricsync.Metrics`` (or a list of them)
     - numpy fails
     - merged; the entry becomes its ``compute()`` keys
     - workers can put a ``Metrics`` in ``meta_info["metrics"]``
   * - ``reduce_metrics`` on ragged nested lists
     - ``ValueError`` (numpy)
     - flattened
     - every value counts
   * - ``reduce_metrics(..., specs=...)``
     - no such argument
     - an explicit spec per name or glob instead of the key-name rule
     - "minibatch" and "timing" contain "min"
   * - an empty ``MEAN``
     - NaN and a ``RuntimeWarning``
     - NaN
     -
   * - ``allgather_dict_into_dict`` result
     - one entry per rank
     - one ``Metric`` holding the whole group: ``[m]`` (``[[m]]`` for a list)
     - one sync instead of a pickled gather; ``Metric.aggregate_dp`` reads
       both forms, and ``sum(entries) / len(entries)`` (verl's MTP losses)
       reads the group's value: a number plus a ``Metric`` is the number
       plus its aggregate
   * - ``values`` of a synced or gathered ``Metric``
     - (verl gathers values)
     - ``AttributeError``
     - state travels, not values
   * - verl's ``Metric`` given to a function here
     - (n/a)
     - :class:`MixedMetricError`
     - a half switch gives wrong numbers

``Metric.values`` keeps every appended value, as verl does: its memory grows
with the number of appends (one number per scalar, a device copy per
tensor). ``Metric.keep_values = False`` (or ``install(keep_values=False)``,
or ``Metric(..., keep_values=False)``) turns it off; the metric is then
constant-size.

Limits: verl's own functions cannot be changed without :func:`install`; in
particular verl's ``Metric.aggregate_dp``, if handed this package's metrics,
reads their ``values`` and ignores weights (a ``Metric`` that crossed from a
switched process raises :class:`MixedMetricError` there instead). Policy
losses registered after :func:`install`, and a ``value_loss`` bound (by
``functools.partial``) before it, are not weighted; verl's ``ppo_loss``
finds its policy loss at each call, so it is weighted however it was bound. A
verl ``Metric`` made before :func:`install` still aggregates in verl's own
code (the two ``AggregationType`` enums' members of one value are equal),
but pickling it, or extending it with this package's metrics, fails.
"""

from __future__ import annotations

from typing import Any

from ._controller import collect_metrics, collect_nd_metrics, make_nd_collect_metrics
from ._dp import allgather_dict_into_dict, append_to_dict
from ._install import Installation, install, is_installed, uninstall
from ._metric import AggregationType, Metric, WeightedMean
from ._mixed import MixedMetricError
from ._reduce import reduce_metrics
from ._tokens import token_mean_metrics

__all__ = [
    "AggregationType",
    "Installation",
    "Metric",
    "MixedMetricError",
    "Numeric",
    "NumericType",
    "WeightedMean",
    "allgather_dict_into_dict",
    "append_to_dict",
    "collect_metrics",
    "collect_nd_metrics",
    "install",
    "is_installed",
    "make_nd_collect_metrics",
    "reduce_metrics",
    "token_mean_metrics",
    "uninstall",
]


def __getattr__(name: str) -> Any:
    """``NumericType`` and ``Numeric`` as verl defines them (torch is imported only here)."""
    if name not in ("NumericType", "Numeric"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import numpy as np

    try:
        import torch
    except ImportError:
        types: tuple[type, ...] = (int, float, np.ndarray)
    else:
        types = (int, float, torch.Tensor, np.ndarray)
    if name == "NumericType":
        return types
    union: Any = types[0]
    for t in types[1:]:
        union = union | t
    return union
