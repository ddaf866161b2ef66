"""Nothing in ``metricsync/`` can execute what it receives.

An ``ast`` scan of every module of the package looks for code execution
(``eval``, ``exec``, ``compile``, ``__import__``, ``importlib.import_module``
of a computed name), deserializers that run code (``pickle``/``marshal``/
``shelve``/``dill``/``cloudpickle`` loading, ``torch.load``, ``numpy.load``,
``yaml.load``), torch.distributed's pickling object collectives, and shell
execution. Aliases (``import pickle as p``, ``from torch import load``) are
resolved, and a reference counts as much as a call (``f = pickle.loads``).

pickle appears in exactly two documented ways: ``metricsync/benchmark.py``
times the ``all_gather_object`` baseline and sizes its ``pickle.dumps`` payload,
on data it generates itself, and the objects users may pickle (``Metrics``, ``Spec``, verl's ``Metric``)
define ``__reduce__`` so that their pickle holds only bytes or text from the
package's own format and one of the package's decoder functions; a pickle
stream check pins that down.
"""

from __future__ import annotations

import ast
import pickle
import pickletools
from pathlib import Path

import pytest

import metricsync as ms

PACKAGE = Path(ms.__file__).resolve().parent

#: Dotted names that must never be referenced (prefix match on dotted boundaries).
FORBIDDEN = (
    "eval",
    "exec",
    "compile",
    "__import__",
    "builtins.eval",
    "builtins.exec",
    "builtins.compile",
    "builtins.__import__",
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "_pickle",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "jsonpickle",
    "joblib.load",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "torch.load",
    "torch.serialization.load",
    "numpy.load",
    "os.system",
    "os.popen",
    "subprocess",
    "ray.cloudpickle",
    "torch.distributed.all_gather_object",
    "torch.distributed.broadcast_object_list",
    "torch.distributed.gather_object",
    "torch.distributed.scatter_object_list",
    "torch.distributed.send_object_list",
    "torch.distributed.recv_object_list",
    "torch.distributed.distributed_c10d",
)
#: Attribute names forbidden on any object (``self.dist.all_gather_object``).
FORBIDDEN_ATTRS = {
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
}
#: The documented uses: the benchmark, which times and sizes the pickled
#: ``all_gather_object`` baseline that metricsync replaces, on data it generates
#: itself; and ``testing.count_collectives``, which sizes (dumps, never loads) the
#: objects a caller hands to the ``*_object*`` collectives.
ALLOWED = {
    ("_cli/_benchmark.py", "pickle.dumps"),
    ("testing.py", "pickle.dumps"),
    ("_cli/_benchmark.py", "torch.distributed.all_gather_object"),
    ("_cli/_benchmark.py", ".all_gather_object"),
}
#: Classes whose pickling is defined by the package (checked on the pickle stream below).
REDUCERS = {
    ("_facade/_metrics.py", "Metrics"),
    ("_state/_spec.py", "Spec"),
    ("verl_compat/_metric.py", "Metric"),
}


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _forbidden(name: str) -> bool:
    return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)


def scan(source: str, filename: str = "<snippet>") -> list[str]:
    """Every forbidden reference in ``source``, as ``"line: dotted.name"``."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}
    found: list[str] = []
    for node in ast.walk(tree):  # imports first: aliases hold for the whole module
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
                if _forbidden(alias.name):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = full
                if _forbidden(full) or _forbidden(node.module):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS:
            found.append(f"{node.lineno}: .{node.attr}")
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = _dotted(node, aliases)
            if name is None:
                continue
            if _forbidden(name) or (name.startswith("pickle.") and name.count(".") == 1):
                found.append(f"{node.lineno}: {name}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func, aliases) or ""
            dynamic_import = name in ("importlib.import_module", "importlib.__import__")
            if dynamic_import and not (node.args and isinstance(node.args[0], ast.Constant)):
                found.append(f"{node.lineno}: {name} of a computed name")
            shell = any(k.arg == "shell" for k in node.keywords)
            if shell:
                found.append(f"{node.lineno}: {name}(shell=...)")
    return sorted(set(found))


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_scan_covers_the_whole_package() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert {
        "_state/_codec.py",
        "_sync/_sync.py",
        "_facade/_metrics.py",
        "backends/_jsonl.py",
        "_cli/_cli.py",
    } <= names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_code_execution_or_unpickling_in_the_package(path: Path) -> None:
    rel = path.relative_to(PACKAGE).as_posix()
    hits = scan(path.read_text(encoding="utf-8"), str(path))
    allowed = {name for file, name in ALLOWED if file == rel}
    left = [hit for hit in hits if hit.split(": ", 1)[1] not in allowed]
    assert left == [], f"{rel}: {left}"


def test_only_the_documented_classes_define_their_pickling() -> None:
    defined = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = {
                    f.name
                    for f in node.body
                    if isinstance(f, ast.FunctionDef)
                    and f.name in ("__reduce__", "__reduce_ex__", "__setstate__", "__getstate__")
                }
                if methods:
                    assert methods == {"__reduce__"}, (path.name, node.name, methods)
                    defined.add((path.relative_to(PACKAGE).as_posix(), node.name))
    assert defined == REDUCERS


def _globals_and_args(data: bytes) -> tuple[set[str], set[str]]:
    """The globals a pickle stream imports and the kinds of values it pushes."""
    found: set[str] = set()
    kinds: set[str] = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(str(arg))
        if op.name == "STACK_GLOBAL":
            found.add(".".join(strings[-2:]))
        elif op.name == "GLOBAL":
            found.add(str(arg).replace(" ", "."))
        kinds.add(op.name)
    return found, kinds


def test_pickles_of_package_objects_hold_only_the_binary_format() -> None:
    from metricsync.verl_compat import Metric

    m = ms.Metrics({"lr": ms.Spec("last")})
    m.record("lr", 3e-4)
    cases = {
        "metricsync._facade._metrics._from_bytes": m,
        "metricsync._state._spec._spec_from_json": ms.Spec(("mean", "p99"), fmt=".3f"),
        "metricsync.verl_compat._metric._rebuild": Metric("max", 2.0),
    }
    for reconstructor, obj in cases.items():
        data = pickle.dumps(obj)
        found, ops = _globals_and_args(data)
        assert found == {reconstructor}, (type(obj).__name__, found)
        # no object state, no nested calls: the callable gets bytes or text only
        assert not ops & {"BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"}
        assert type(pickle.loads(data)) is type(obj)


BAD_SNIPPETS = {
    "import pickle\npickle.loads(b'')": "pickle.loads",
    "import pickle as p\nf = p.load": "pickle.load",
    "from pickle import loads": "from pickle import loads",
    "from pickle import Unpickler as U": "from pickle import Unpickler",
    "import torch\ntorch.load('x')": "torch.load",
    "from torch import load\nload('x')": "from torch import load",
    "import torch.distributed as dist\ndist.all_gather_object([], 1)": "all_gather_object",
    "self.dist.broadcast_object_list([])": ".broadcast_object_list",
    "import numpy as np\nnp.load('x')": "numpy.load",
    "eval('1')": "eval",
    "exec('x = 1')": "exec",
    "__import__(name)": "__import__",
    "import importlib\nimportlib.import_module(name)": "computed name",
    "import marshal": "marshal",
    "import subprocess": "subprocess",
    "import os\nos.system('ls')": "os.system",
    "import builtins\nbuiltins.eval('1')": "builtins.eval",
    "import yaml\nyaml.load(s)": "yaml.load",
}


@pytest.mark.parametrize("source, expected", list(BAD_SNIPPETS.items()))
def test_the_scanner_catches_each_forbidden_form(source: str, expected: str) -> None:
    hits = scan(source)
    assert any(expected in hit for hit in hits), hits


def test_the_scanner_passes_ordinary_code() -> None:
    source = (
        "import json, importlib\nimport torch\nimport pickle\n"
        "json.loads('1')\ntorch.tensor([1.0])\nimportlib.import_module('json')\n"
        "pickle.dumps(1)\nx.eval()\nmodel.load('x')\n"
    )
    assert scan(source) == ["7: pickle.dumps"]  # reported, for the allowlist to decide
