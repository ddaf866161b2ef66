"""A Griffe extension that lets mkdocstrings render metricsync's reST-flavoured docstrings.

The docstrings are written for ``help()`` and doctest: ``>>>`` examples,
``:class:`X``` roles, ``::`` literal blocks and simple ``====`` tables. Markdown
would read ``>>>`` as nested quotes and print the roles verbatim, so before
rendering this extension turns

- each doctest block into a fenced ``pycon`` block;
- each ``:role:`target``` into an autorefs cross-reference, ``[`target`][path]``
  (``~`` shows the last part only; a name is looked up next to the object first),
  so a broken reference fails the strict build. Private modules are not
  documented: a target inside one links to the package's public name of the
  same object when there is one, and is plain code otherwise;
- each ``::`` literal block and each simple table into a fenced text block.

Used from ``mkdocs.yml`` (``extensions: [tools/griffe_rst.py]``); the docstrings
themselves stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`<>]+?)`")
TABLE_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _fence(block: list[str], language: str, indent: int, at: int | None = None) -> list[str]:
    """``block`` less ``indent`` columns, fenced at column ``at`` (default: ``indent``)."""
    pad = " " * (indent if at is None else at)
    body = [line[indent:] if line.strip() else "" for line in block]
    return [f"{pad}```{language}", *(pad + line if line else "" for line in body), f"{pad}```"]


def convert(text: str, resolve: Any = None) -> str:
    """``text`` with doctest blocks, literal blocks, tables and roles made Markdown.

    >>> print(convert("Use :class:`~pkg.mod.Thing`.\\n\\n>>> 1 + 1\\n2"))
    Use [`Thing`][pkg.mod.Thing].
    <BLANKLINE>
    ```pycon
    >>> 1 + 1
    2
    ```
    """
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith(">>>"):
            start = i
            while i < len(lines) and lines[i].strip():
                i += 1
            out.extend(_fence(lines[start:i], "pycon", _indent(line)))
            continue
        if TABLE_RULE.match(line):
            start, rules = i, 0
            while i < len(lines) and (lines[i].strip() or rules < 3):
                rules += bool(TABLE_RULE.match(lines[i]))
                i += 1
                if rules == 3:
                    break
            out.extend(_fence(lines[start:i], "text", _indent(line)))
            continue
        if stripped.endswith("::") and not stripped.startswith(".."):
            head = line.rstrip()[:-2].rstrip()
            out.append(head + ":" if head.strip() else "")
            i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            start = i
            base = _indent(line)
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
                i += 1
            block = lines[start:i]
            while block and not block[-1].strip():
                block.pop()
            if block:
                out.append("")
                inner = min(_indent(b) for b in block if b.strip())
                out.extend(_fence(block, "text", inner, at=base))
                out.append("")
            continue
        out.append(line)
        i += 1
    converted = "\n".join(out)

    def role(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2).strip()
        path = resolve(target) if resolve is not None else target
        shown = target.rsplit(".", 1)[-1] if short or path is None else target
        return f"`{shown}`" if path is None else f"[`{shown}`][{path}]"

    return _outside_fences(converted, lambda chunk: ROLE.sub(role, chunk))


def _outside_fences(text: str, change: Any) -> str:
    parts = re.split(r"(^\s*```[\s\S]*?^\s*```$)", text, flags=re.M)
    return "".join(part if k % 2 else change(part) for k, part in enumerate(parts))


class ReSTDocstrings(griffe.Extension):
    """Convert every docstring of the loaded package once the tree is complete."""

    def __init__(self) -> None:
        super().__init__()
        self._done: set[int] = set()

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self.on_object(obj=pkg)  # the package itself is not among the objects visited

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None or id(obj.docstring) in self._done:
            return
        self._done.add(id(obj.docstring))

        def resolve(target: str) -> str | None:
            """The documented path of ``target``, or None when it is not documented."""
            first = target.split(".", 1)[0]
            if first != obj.package.name:
                for scope in (obj, obj.parent, obj.module):
                    if scope is not None and first in getattr(scope, "members", {}):
                        target = f"{scope.path}.{target}"
                        break
            parts = target.split(".")
            if not any(part.startswith("_") for part in parts[1:]):
                return target
            # private modules are not documented: link the public name, if there is one
            name = parts[-1]
            public = not name.startswith("_") and name in obj.package.members
            return f"{obj.package.path}.{name}" if public else None

        obj.docstring.value = convert(obj.docstring.value, resolve)
