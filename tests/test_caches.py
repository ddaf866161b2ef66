"""Process-wide caches: every one is a bounded LRU (metricsync._state._lru), and they are few.

The package source is scanned: a ``functools`` cache, or a module-level dict that code
writes into (a cache or registry by hand), fails unless it is one of the registries of
live per-group state named below; the module-level LRUs are counted against a budget.
Then keys that used to pile up (distinct sketch accuracies) leave every cache at its bound.
"""

from __future__ import annotations

import ast
import gc
import importlib
import pkgutil
from pathlib import Path

import numpy as np

import metricsync as ms
from metricsync._state._lru import LRU, Cached
from metricsync._state._sketch import SketchLayout

PACKAGE = Path(ms.__file__).parent

#: registries of live per-group state (not derived values): module -> names. Each is keyed
#: by a process group, so it holds one entry per group a program syncs on.
REGISTRIES = {
    "_group": {"_REGISTRY"},  # each group's memory, held weakly by the group object
    "_dispatch": {"ROUTES"},  # not a cache: torch's tensor class, registered once when seen
}
#: the most module-level LRUs (derived-value caches) the package may hold
CACHE_BUDGET = 6

_DICT_CALLS = {"dict", "OrderedDict", "defaultdict", "WeakKeyDictionary", "WeakValueDictionary"}
_WRITES = {"setdefault", "update", "__setitem__", "add"}


def _modules() -> list[tuple[str, ast.Module]]:
    paths = sorted([*PACKAGE.glob("*.py"), *PACKAGE.glob("_*/*.py")])  # the layers' modules
    return [(path.stem, ast.parse(path.read_text())) for path in paths]


def _called(node: ast.expr) -> str | None:
    """The last name of what ``node`` calls (``weakref.WeakKeyDictionary()``: that name)."""
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _module_dicts(tree: ast.Module) -> set[str]:
    """Names bound at module level to a dict (a literal or a dict-making call)."""
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name) and (
            isinstance(value, ast.Dict) or _called(value) in _DICT_CALLS
        ):
            names.add(target.id)
    return names


def _written(tree: ast.Module, names: set[str]) -> set[str]:
    """Those of ``names`` that a function writes into (``d[k] = v``, ``d.setdefault``,
    ``remember(d, ...)``)."""
    found = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in names:
                    found.add(node.value.id)
            elif isinstance(node, ast.Call):
                f = node.func
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr in _WRITES
                    and isinstance(f.value, ast.Name)
                    and f.value.id in names
                ):
                    found.add(f.value.id)
                for arg in node.args:
                    if (
                        isinstance(arg, ast.Name)
                        and arg.id in names
                        and _called(node) == "remember"
                    ):
                        found.add(arg.id)
    return found


def _functools_caches(tree: ast.Module) -> list[str]:
    """Uses of ``functools.cache`` / ``lru_cache`` (decorators or calls)."""
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "functools" and node.attr in {"cache", "lru_cache"}:
                name = f"functools.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "functools":
            for alias in node.names:
                if alias.name in {"cache", "lru_cache"}:
                    name = f"from functools import {alias.name}"
        if name is not None:
            found.append(f"line {node.lineno}: {name}")
    return found


def _module_lrus(tree: ast.Module) -> list[str]:
    """Module-level ``X = LRU(...)`` and functions decorated ``@lru(...)``."""
    found = []
    for stmt in tree.body:
        value = getattr(stmt, "value", None)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _called(value) == "LRU":
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
            found.append(ast.unparse(target))
        elif isinstance(stmt, ast.FunctionDef) and any(
            _called(d) == "lru" for d in stmt.decorator_list
        ):
            found.append(stmt.name)
    return found


def test_no_functools_cache_in_the_package() -> None:
    """Unbounded (``functools.cache``) or not, a process-wide cache is an LRU of ``_lru``."""
    found = {m: hits for m, tree in _modules() if (hits := _functools_caches(tree))}
    assert found == {}


def test_no_module_level_dict_is_written_but_the_group_registries() -> None:
    """A module-level dict that functions write into is a cache by hand (which grows with
    its keys unless bounded): only the registries of live group state may be one."""
    found = {}
    for module, tree in _modules():
        written = _written(tree, _module_dicts(tree)) - REGISTRIES.get(module, set())
        if written:
            found[module] = sorted(written)
    assert found == {}


def test_the_scan_finds_what_it_forbids() -> None:
    """The scan itself: a hand-made cache and a functools cache are both found."""
    source = """
import functools
from functools import lru_cache
_SEEN = {}
_OTHER: dict[str, int] = dict()
def f(x):
    _SEEN[x] = 1
    remember(_OTHER, x, 1, 4)
@functools.cache
def g(x):
    return x
"""
    tree = ast.parse(source)
    assert _written(tree, _module_dicts(tree)) == {"_SEEN", "_OTHER"}
    assert len(_functools_caches(tree)) == 2


def test_the_package_keeps_few_caches() -> None:
    """Every derived-value cache is a module-level LRU; their number stays within the budget."""
    caches = [f"{m}.{name}" for m, tree in _modules() for name in _module_lrus(tree)]
    assert 0 < len(caches) <= CACHE_BUDGET, caches


def _live_caches() -> dict[str, tuple[int, int]]:
    """Every LRU of the package's modules: name -> (entries, bound)."""
    out = {}
    for layer in pkgutil.iter_modules([str(PACKAGE)]):
        if not (layer.ispkg and layer.name.startswith("_")):
            continue
        for info in pkgutil.iter_modules([str(PACKAGE / layer.name)]):
            try:
                module = importlib.import_module(f"metricsync.{layer.name}.{info.name}")
            except ModuleNotFoundError:  # needs torch, absent on the numpy-only matrix
                continue
            for name, value in vars(module).items():
                if isinstance(value, Cached):
                    value = value.cache
                if isinstance(value, LRU):
                    out[f"{info.name}.{name}"] = (len(value), value.maxsize)
    return out


def test_distinct_sketch_accuracies_leave_the_caches_at_their_bound() -> None:
    """300 sketch accuracies (each a metric with a quantile, recorded, encoded, decoded,
    computed) leave at most 32 sketch layouts alive, each with its cells' representatives
    (before: all 300, about 17 MB), and every cache within its bound."""
    accuracies = [0.01 + 1e-4 * i for i in range(300)]
    specs = {f"q/{i}": ms.Spec(("mean", "p50"), accuracy=a) for i, a in enumerate(accuracies)}
    m = ms.Metrics(specs)
    for i, name in enumerate(specs):
        m.record(name, [1.0 + i, 2.0 + i])
    got = ms.Metrics.from_bytes(m.to_bytes()).compute()
    want = float(np.quantile([8.0, 9.0], 0.5))  # numpy: the linear method, as the spec's
    assert abs(got["q/7/p50"] - want) <= accuracies[7] * want
    del m, got
    gc.collect()
    made = set(accuracies)
    alive = [o for o in gc.get_objects() if isinstance(o, SketchLayout) and o.accuracy in made]
    assert len(alive) <= 32  # before: 300, each with its representatives (~60 KB)
    caches = _live_caches()
    assert caches["_sketch._layout"][1] == 32
    assert all(entries <= bound for entries, bound in caches.values()), caches


def test_a_group_keeps_the_rule_answers_of_its_latest_syncs_only() -> None:
    """A large ``Metrics`` synced in turn with small ones of ever new rules (each lacking
    its names, so its rules are answered for the whole layout): the group keeps the
    answers of its latest few syncs, not one per rule set seen."""
    from metricsync._sync import _group, _sync

    train = ms.Metrics({"train/*": ms.Spec("max")})
    for i in range(200):
        train.record(f"train/{i}", float(i))
    kept = []
    for j in range(20):
        train.sync()
        val = ms.Metrics({f"v{j}/*": ms.Spec("max")})
        val.record(f"v{j}/a", 1.0)
        assert val.sync().compute() == {f"v{j}/a": 1.0}
        kept.append(len(_group.alone().state.otherwise))
    assert 0 < max(kept) <= _sync._KEPT_OTHERWISE, kept
