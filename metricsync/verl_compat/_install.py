"""The one-line switch: verl's own metric objects replaced by metricsync's, and back."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from ._dp import allgather_dict_into_dict, append_to_dict
from ._metric import AggregationType, Metric
from ._mixed import set_switched
from ._reduce import reduce_metrics
from ._tokens import token_weighted_policy_loss, token_weighted_value_loss

__all__ = ["Installation", "install", "is_installed", "uninstall"]

# verl 0.9.1's objects and where they are defined; each is replaced by the one of the same name here.
_VERL_OBJECTS = (
    ("verl.utils.metric.utils", "AggregationType"),
    ("verl.utils.metric.utils", "Metric"),
    ("verl.utils.metric.utils", "reduce_metrics"),
    ("verl.utils.py_functional", "append_to_dict"),
    ("verl.utils.torch_functional", "allgather_dict_into_dict"),
)
_OURS: dict[str, Any] = {
    "AggregationType": AggregationType,
    "Metric": Metric,
    "reduce_metrics": reduce_metrics,
    "append_to_dict": append_to_dict,
    "allgather_dict_into_dict": allgather_dict_into_dict,
}
# "pairs": [(verl's object, ours)]; "patched": [(module dict, name, old, new)] in order;
# "keep_values": Metric.keep_values before install(); "registry": verl's policy-loss registry
# (a dict whose values are replaced too) when token means are on.
_state: dict[str, Any] = {}


def _token_mean_pairs() -> tuple[list[tuple[Any, Any]], dict[str, Any]]:
    """(verl's loss function, its token-weighted wrapper) for every policy loss and the value loss."""
    try:
        import verl.trainer.ppo.core_algos as core_algos
        import verl.workers.utils.losses as losses
    except ImportError as exc:
        raise ModuleNotFoundError(
            "metricsync.verl_compat.install(token_mean=True) weights verl's token-mean metrics "
            f"by wrapping its loss functions, but they cannot be imported here ({exc}); pass "
            "token_mean=False to switch the metric objects only"
        ) from exc
    registry: dict[str, Any] = core_algos.POLICY_LOSS_REGISTRY
    pairs = [(fn, token_weighted_policy_loss(fn)) for fn in dict.fromkeys(registry.values())]
    pairs.append((losses.value_loss, token_weighted_value_loss(losses.value_loss)))
    return pairs, registry


def _replace_in(registry: dict[str, Any], pairs: list[tuple[Any, Any]]) -> list[tuple[Any, ...]]:
    by_id = {id(old): new for old, new in pairs}
    changed = []
    for name, value in list(registry.items()):
        new = by_id.get(id(value))
        if new is not None:
            registry[name] = new
            changed.append((registry, name, value, new))
    return changed


def _import_verl() -> dict[str, Any]:
    try:
        import verl.utils.metric.utils
        import verl.utils.py_functional
        import verl.utils.torch_functional
    except ImportError as exc:
        raise ModuleNotFoundError(
            "metricsync.verl_compat.install() switches verl's modules to metricsync, but verl "
            f"cannot be imported here ({exc}); install verl, or import the compat names "
            "(AggregationType, Metric, reduce_metrics) without install()"
        ) from exc
    return {
        "verl.utils.metric.utils": verl.utils.metric.utils,
        "verl.utils.py_functional": verl.utils.py_functional,
        "verl.utils.torch_functional": verl.utils.torch_functional,
    }


def _is_ours(name: str) -> bool:
    return name == "metricsync" or name.startswith("metricsync.")


def _replace(pairs: list[tuple[Any, Any]], *, only_verl: bool = False) -> list[tuple[Any, ...]]:
    """In loaded modules (not metricsync's), replace each ``old`` global by its ``new`` (by identity).

    Returns what it changed: ``(module dict, name, old, new)`` in order.
    """
    by_id = {id(old): new for old, new in pairs}
    changed = []
    for name, module in list(sys.modules.items()):
        if module is None or _is_ours(name) or (only_verl and name.split(".")[0] != "verl"):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            new = by_id.get(id(value))
            if new is not None and namespace.get(attr) is value:
                namespace[attr] = new
                changed.append((namespace, attr, value, new))
    return changed


class Installation:
    """What :func:`install` returns: a context manager that undoes the switch it made.

    Leaving the ``with`` block calls :func:`uninstall` only if this call
    switched verl's modules (not if they were switched already).
    """

    def __init__(self, owner: bool) -> None:
        self.owner = owner

    def __enter__(self) -> Installation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.owner:
            uninstall()

    def __repr__(self) -> str:
        return f"Installation(owner={self.owner})"


def install(*, token_mean: bool = True, keep_values: bool | None = None) -> Installation:
    """Make verl's own modules use metricsync's ``Metric``, ``reduce_metrics`` and DP helpers.

    Replaces verl 0.9.1's ``AggregationType``, ``Metric`` and
    ``reduce_metrics`` (``verl.utils.metric`` and ``verl.utils.metric.utils``),
    ``append_to_dict`` (``verl.utils.py_functional``) and
    ``allgather_dict_into_dict`` (``verl.utils.torch_functional``) by this
    package's, in verl's modules and in every other loaded module that
    imported them (found by identity); modules imported later get them from
    verl's modules. verl's workers then reduce their DP metrics with one
    metricsync sync instead of a pickled gather.

    ``token_mean`` (the default) also wraps verl's policy losses (every
    entry of ``POLICY_LOSS_REGISTRY``) and its ``value_loss``: the metrics
    verl computes as a ``masked_mean`` per micro-batch (``actor/ppo_kl``,
    ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``critic/vf_clipfrac``,
    ``critic/vpred_mean``) then carry the micro-batch's valid-token count as
    their weight, and come out as global token means across micro-batches,
    mini-batches and DP ranks. ``token_mean=False`` keeps verl's mean of
    micro-batch means (and raises where verl raises: uneven micro-batch
    counts across DP ranks).

    Call it once per process (driver and every worker) before verl records
    a metric, and in a worker before its loss function is built. Calling it
    again is harmless (the first call's ``token_mean`` stays). ``keep_values`` sets
    ``Metric.keep_values`` (None leaves it). Undo with :func:`uninstall`, or
    use the result as a context manager::

        with metricsync.verl_compat.install():
            ...

    Raises:
        ModuleNotFoundError: verl (or, with ``token_mean``, its loss modules) cannot be imported.
    """
    modules = _import_verl()
    owner = "pairs" not in _state
    if owner:
        pairs = []
        for module_name, attr in _VERL_OBJECTS:
            theirs = getattr(modules[module_name], attr)
            if theirs is not _OURS[attr]:
                pairs.append((theirs, _OURS[attr]))
        _state["registry"] = None
        if token_mean:
            wrapped, _state["registry"] = _token_mean_pairs()
            pairs.extend(wrapped)
        _state["pairs"] = pairs
        _state["patched"] = []
        _state["keep_values"] = Metric.keep_values
    _state["patched"].extend(_replace(_state["pairs"]))
    if _state["registry"] is not None:
        _state["patched"].extend(_replace_in(_state["registry"], _state["pairs"]))
    set_switched(True)
    if keep_values is not None:
        Metric.keep_values = keep_values
    return Installation(owner)


def uninstall() -> None:
    """Undo :func:`install`: every global it replaced gets verl's object back.

    verl's own modules imported while switched get verl's objects too; other
    modules imported meanwhile keep what they imported. Does nothing when
    verl's modules are not switched.
    """
    if "pairs" not in _state:
        return
    for namespace, attr, old, new in reversed(_state["patched"]):
        if namespace.get(attr) is new:
            namespace[attr] = old
    # verl's modules imported while switched hold ours too; give them verl's back as well.
    _replace([(ours, theirs) for theirs, ours in _state["pairs"]], only_verl=True)
    Metric.keep_values = _state["keep_values"]
    _state.clear()
    set_switched(False)


def is_installed() -> bool:
    """Whether verl's modules are switched to metricsync (see :func:`install`).

    >>> is_installed()
    False
    """
    return "pairs" in _state
