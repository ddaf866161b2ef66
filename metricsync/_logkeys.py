"""Metric keys as logs hold them: valid UTF-8 and at most :data:`MAX_KEY_CHARS` characters.

The same rule applies where keys are written (``Tracker.log``, for every
backend) and where logs are read (``show``, ``plot``, ``compare``), so a log
the Tracker wrote reads back with the keys it was given, and a log written by
anything else (verl, an older metricsync) reads with the keys the Tracker
would have written:

- a lone surrogate (``"\\ud800"``, which no UTF-8 file, terminal or font can
  hold) is written as its escape: the six characters ``\\ud800``;
- a key longer than :data:`MAX_KEY_CHARS` keeps its first characters and
  ends in ``_`` and 8 hex digits of a hash of the whole key (so two long keys
  that share their start stay apart), :data:`MAX_KEY_CHARS` characters in all.

Every other key is kept as it is; cleaning a clean key changes nothing.

>>> clean_key("loss"), clean_key("a\\ud800")
('loss', 'a\\\\ud800')
>>> long = clean_key("k" * 5_000_000)
>>> len(long), long[-9:]
(1024, '_1bc3706a')
>>> clean_key(long) == long
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

__all__ = ["MAX_KEY_CHARS", "clean_key", "describe_change", "needs_cleaning"]

MAX_KEY_CHARS = 1024
"""The longest metric key written or read; longer ones are shortened (see above)."""

_TAG = 9  # "_" and 8 hex digits


def _valid_utf8(key: str) -> bool:
    if key.isascii():
        return True
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def needs_cleaning(keys: Collection[str]) -> bool:
    """Whether :func:`clean_key` would change one of ``keys`` (C-speed for the common case).

    >>> needs_cleaning(["loss", "lr"]), needs_cleaning(["x" * 2000]), needs_cleaning(["\\ud800"])
    (False, True, True)
    """
    if not keys:
        return False
    if max(map(len, keys)) > MAX_KEY_CHARS:
        return True
    return not all(map(str.isascii, keys)) and not all(map(_valid_utf8, keys))


def clean_key(key: str) -> str:
    """``key`` as logs hold it: lone surrogates escaped, cut to :data:`MAX_KEY_CHARS` characters."""
    if len(key) <= MAX_KEY_CHARS and _valid_utf8(key):
        return key
    text = key.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= MAX_KEY_CHARS:
        return text
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return text[: MAX_KEY_CHARS - _TAG] + "_" + digest


def _shown(key: str) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"


def describe_change(key: str, cleaned: str) -> str:
    """One line saying why ``key`` is logged as ``cleaned``.

    >>> describe_change("a\\ud800", clean_key("a\\ud800"))
    "the key 'a\\\\ud800' holds a lone surrogate (not UTF-8); it is logged as 'a\\\\\\\\ud800'"
    """
    if len(key) > MAX_KEY_CHARS:
        return (
            f"a key of {len(key):,} characters (more than {MAX_KEY_CHARS:,}) is shortened "
            f"to {_shown(cleaned)}"
        )
    return (
        f"the key {_shown(key)} holds a lone surrogate (not UTF-8); it is logged as "
        f"{_shown(cleaned)}"
    )
