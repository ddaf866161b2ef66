"""Spec rules: which spec a metric name gets.

A :class:`SpecTable` maps a name to a spec by exact name, then the longest matching glob, then
``Spec()``; the glob index is shared by tables with the same rules.

>>> table = SpecTable({"timing/*": Spec("max")})
>>> table.resolve("timing/step"), table.explicit("loss")
(Spec('max'), None)
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from typing import Protocol

from ._errors import SpecMismatchError
from ._spec import DEFAULT_SPEC, Spec, canonical
from ._tokens import derived, remember

__all__ = ["Slots", "SpecTable", "agree", "merged_rules"]

_GLOB_CHARS = re.compile(r"[*?\[]")


class _GlobIndex:
    """Globs in resolution order (longest pattern first, then by text), bucketed by the
    literal text before their first glob character: a name is matched only against the
    globs whose literal prefix it starts with, not against every glob.

    >>> index = _GlobIndex({"t/*": Spec("max"), "t/g*": Spec("sum"), "*": Spec("min")})
    >>> index.match("t/gen"), index.match("t/x"), index.match("loss"), index.match("")
    (Spec('sum'), Spec('max'), Spec('min'), Spec('min'))
    """

    __slots__ = ("buckets", "lengths", "memo")

    def __init__(self, globs: dict[str, Spec]) -> None:
        ordered = sorted(globs.items(), key=lambda kv: (-len(kv[0]), kv[0]))
        buckets: dict[str, list[tuple[int, str, Spec]]] = {}
        for rank, (pattern, spec) in enumerate(ordered):
            found = _GLOB_CHARS.search(pattern)
            prefix = pattern if found is None else pattern[: found.start()]
            buckets.setdefault(prefix, []).append((rank, pattern, spec))
        self.buckets = buckets
        self.lengths = sorted({len(prefix) for prefix in buckets})
        self.memo: dict[str, Spec | None] = {}  # name -> its match (bounded, see match)

    def match(self, name: str) -> Spec | None:
        """The spec of the first glob in resolution order that matches ``name``
        (remembered: the copies of a rule table share its index)."""
        if not self.buckets:  # no globs: nothing to remember
            return None
        try:
            return self.memo[name]
        except KeyError:
            best = self._match(name)
        return remember(self.memo, name, best, _MEMO_LIMIT)  # should a program make endless names

    def _match(self, name: str) -> Spec | None:
        best_rank, best = -1, None
        for n in self.lengths:
            if n > len(name):
                break
            bucket = self.buckets.get(name[:n])
            if bucket is None:
                continue
            for rank, pattern, spec in bucket:  # in resolution order
                if best is not None and rank > best_rank:
                    break
                if fnmatch.fnmatchcase(name, pattern):
                    best_rank, best = rank, spec
                    break
        return best


_MEMO_LIMIT = 4096
_NO_GLOBS = _GlobIndex({})


_NO_RULES = object()  # the token of every table without rules


class SpecTable:
    """Specs by exact name and by glob; resolution: exact, then longest glob, then default.

    >>> table = SpecTable({"timing/*": Spec("max"), "timing/gen": Spec("sum")})
    >>> table.resolve("timing/step"), table.resolve("timing/gen"), table.resolve("loss")
    (Spec('max'), Spec('sum'), Spec('mean'))
    >>> a, b = SpecTable({"x": Spec("max")}), SpecTable({"x": Spec("max")})
    >>> a.token is b.token, a.token is SpecTable({"x": Spec("min")}).token
    (True, False)
    """

    def __init__(self, rules: dict[str, Spec] | None = None) -> None:
        self._exact: dict[str, Spec] = {}
        self._globs: dict[str, Spec] = {}
        self._glob_index = _NO_GLOBS
        self._shared = False
        # stands for these rules (metricsync._state._tokens): tables that added the same rules in
        # the same order share it, so what is worked out per rule set (a merge's agreement,
        # a sync's check of the names a rank lacks) is worked out once for them
        self.token = _NO_RULES
        for key, spec in (rules or {}).items():
            self.add(key, spec)

    @staticmethod
    def is_glob(key: str) -> bool:
        """Whether ``key`` holds glob characters (``*``, ``?`` or ``[``)."""
        return any(ch in key for ch in "*?[")

    def empty(self) -> bool:
        """Whether the table holds no rule (every name gets the default spec)."""
        return not self._exact and not self._globs

    def rules(self) -> Iterator[tuple[str, Spec]]:
        """Every (name or glob, spec) rule, exact names first."""
        yield from self._exact.items()
        yield from self._globs.items()

    def rule_for(self, key: str) -> Spec | None:
        """The spec defined for exactly this name or glob, if any."""
        return self._globs.get(key) if self.is_glob(key) else self._exact.get(key)

    def add(self, key: str, spec: Spec) -> None:
        """Add a rule; ``SpecMismatchError`` if the same key already has another spec."""
        if self._put(key, spec) and self.is_glob(key):
            self._sort_globs()

    def add_all(self, rules: list[tuple[str, Spec]]) -> None:
        """Add many rules, sorting the globs once; a key given twice raises ``ValueError``."""
        if len({key for key, _ in rules}) != len(rules):
            raise ValueError("a rule is given twice")
        if any([self._put(key, spec) and self.is_glob(key) for key, spec in rules]):
            self._sort_globs()

    def _put(self, key: str, spec: Spec) -> bool:
        """Store a rule without sorting the globs; whether it is new."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"a metric name or glob must be a non-empty string, got {key!r}")
        if not isinstance(spec, Spec):
            raise TypeError(f"expected a metricsync.Spec for {key!r}, got {type(spec).__name__}")
        old = self.rule_for(key)
        if old is not None and old != spec:
            raise SpecMismatchError(
                f"{key!r} is already defined as {old!r}; cannot redefine as {spec!r}"
            )
        if old is not None:
            return False
        if self._shared:  # detach from the tables this one was copied from or to
            self._exact, self._globs = dict(self._exact), dict(self._globs)
            self._shared = False
        if self.is_glob(key):
            self._globs[key] = canonical(spec)
        else:
            self._exact[key] = canonical(spec)
        self.token = derived(self.token, key, self.rule_for(key))
        return True

    def _sort_globs(self) -> None:
        self._glob_index = _GlobIndex(self._globs)

    def resolve(self, name: str) -> Spec:
        """The spec for ``name``: exact rule, else the longest matching glob, else ``Spec()``."""
        return self.explicit(name) or DEFAULT_SPEC

    def explicit(self, name: str) -> Spec | None:
        """The spec a rule gives ``name``, or None where only the default applies."""
        spec = self._exact.get(name)
        if spec is None:  # a declared name such as "acc[top1]" is stored as a glob: itself first
            spec = self._globs.get(name)
        if spec is not None:
            return spec
        return self._glob_index.match(name)

    def plus(self, key: str, spec: Spec) -> SpecTable:
        """A copy with the rule ``key -> spec`` added (this table is unchanged)."""
        rules = self.copy()
        rules.add(key, spec)
        return rules

    def copy(self) -> SpecTable:
        """An independent copy (copy-on-write: the rules are copied at the first ``add``)."""
        self._shared = True  # both sides now copy the dicts before their first change
        twin = SpecTable.__new__(SpecTable)  # a shallow copy, cheaper than copy.copy
        twin.__dict__.update(self.__dict__)
        return twin


def agree(name: str, mine: Spec | None, theirs: Spec | None) -> None:
    """``SpecMismatchError`` when two sides both give ``name`` a spec, and not the same one
    (None: a side without a say, neither holding the name nor a rule for it).

    >>> agree("x", Spec("max"), None)
    >>> agree("x", Spec("max"), Spec("sum"))
    Traceback (most recent call last):
    ...
    metricsync.SpecMismatchError: metric 'x' is Spec('max') on one side and Spec('sum') on the other
    """
    if mine is not None and theirs is not None and mine != theirs:
        raise SpecMismatchError(
            f"metric {name!r} is {mine!r} on one side and {theirs!r} on the other"
        )


class Slots(Protocol):
    """What a merge reads of a side's table: its names, their specs, name -> slot."""

    names: list[str]
    specs: list[Spec]
    index: dict[str, int]


def merged_rules(mine: SpecTable, held: Slots, theirs: SpecTable, other: Slots) -> SpecTable:
    """The rules of a merge of ``other`` (ruled by ``theirs``) into ``held`` (ruled by
    ``mine``): both sets, a key both define apart keeping ours. First, as a sync checks, a
    name either side has a slot for (samples or not) must agree with the other side's slot,
    or else with the other side's own rules: ``SpecMismatchError`` where not.

    >>> mine, theirs = SpecTable({"x": Spec("max")}), SpecTable({"y": Spec("sum")})
    >>> class T:
    ...     names, specs, index = [], [], {}
    >>> sorted(key for key, _ in merged_rules(mine, T(), theirs, T()).rules())
    ['x', 'y']
    """
    merged = mine.copy()
    for key, spec in theirs.rules():
        if merged.rule_for(key) is None:
            merged.add(key, spec)
    specs = held.specs
    for name, spec in zip(other.names, other.specs):
        at = held.index.get(name)
        agree(name, mine.explicit(name) if at is None else specs[at], spec)
    for name, spec in zip(held.names, specs):
        agree(name, spec, None if name in other.index else theirs.explicit(name))
    return merged
