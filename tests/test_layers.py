"""The package's layers: no import cycle, and no import from a lower layer to a higher one.

The layers are the subpackages, declared once in ``LAYERS`` (lowest first); a module's
layer is its first name under ``metricsync``. Every import counts, lazy ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import metricsync

PACKAGE = Path(metricsync.__file__).resolve().parent

LAYERS: list[set[str]] = [
    {"_state"},  # specs, columns, the merge algebra, the table, statistics, the format
    {"_record"},  # records checked, buffered and folded
    {"_sync"},  # the sync protocol
    {"_facade"},  # Metrics over record + sync + compute
    {"_log"},  # the JSONL metric log
    {"backends"},  # the public logging backends
    {"_tracking"},  # the Tracker, over the backends
    {"", "_version", "testing", "integrations", "verl_compat"},  # the public modules
    {"_cli", "__main__"},  # the command line, a program on the public API
]


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                if f"{source}.{a.name}" in modules:
                    found.add(f"{source}.{a.name}")
                elif source in modules:
                    found.add(source)
    found.discard(name)
    return found


def _layer(name: str) -> int:
    top = name.split(".")[1] if "." in name else ""
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{name} is in no layer: add its folder to LAYERS")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_lives_in_a_layer() -> None:
    flat = [p.name for p in PACKAGE.glob("_*.py")]  # private modules outside the layers
    assert set(flat) <= {"__init__.py", "__main__.py", "_version.py"}, flat
    for name in _modules():
        _layer(name)


def test_no_import_runs_up_a_layer() -> None:
    upward = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, targets in _graph().items()
        for b in sorted(targets)
        if _layer(b) > _layer(a)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_checks_see_the_imports() -> None:
    graph = _graph()
    assert "metricsync._state._algebra" in graph["metricsync._record._fold"]
    assert "metricsync._record._store" in graph["metricsync._sync._sync"]
    assert "metricsync._facade._metrics" in graph["metricsync"]
