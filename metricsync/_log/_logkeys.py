"""Metric keys as logs hold them: valid UTF-8 and at most :data:`MAX_KEY_CHARS` characters.

:func:`clean_key` (on write) escapes lone surrogates and text that looks like their escape,
and shortens long keys with a hash suffix, so distinct keys stay distinct; :func:`read_key`
(on read) keeps what a log can hold and cleans the rest.

>>> clean_key("loss"), clean_key("a\\ud800"), clean_key("a\\\\ud800")
('loss', 'a\\\\ud800', 'a\\\\\\\\ud800')
>>> long = clean_key("k" * 5_000_000)
>>> len(long), long[-9:]
(1024, '_1bc3706a')
>>> read_key(long) == long, read_key("a\\\\ud800")
(True, 'a\\\\ud800')
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

__all__ = ["MAX_KEY_CHARS", "clean_key", "describe_change", "needs_cleaning", "read_key"]

MAX_KEY_CHARS = 1024
"""The longest metric key written or read; longer ones are shortened (see above)."""

_TAG = 9  # "_" and 8 hex digits
_ESCAPE_TEXT = re.compile(r"\\ud[89a-f][0-9a-f]{2}")  # what an escaped surrogate looks like


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
    >>> needs_cleaning(["a\\\\ud800"]), needs_cleaning(["a\\\\b"])
    (True, False)
    """
    if not keys:
        return False
    if max(map(len, keys)) > MAX_KEY_CHARS:
        return True
    if "\\u" in "\n".join(keys) and any(map(_ESCAPE_TEXT.search, keys)):
        return True
    return not all(map(str.isascii, keys)) and not all(map(_valid_utf8, keys))


def _shorten(key: str, text: str) -> str:
    if len(text) <= MAX_KEY_CHARS:
        return text
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return text[: MAX_KEY_CHARS - _TAG] + "_" + digest


def clean_key(key: str) -> str:
    """``key`` as it is written: surrogates and look-alikes escaped, at most :data:`MAX_KEY_CHARS`.

    Distinct keys get distinct names (up to a 32-bit hash for keys over
    :data:`MAX_KEY_CHARS` characters).
    """
    valid = _valid_utf8(key)
    if valid and not (("\\u" in key) and _ESCAPE_TEXT.search(key)):
        return _shorten(key, key)
    text = key.replace("\\", "\\\\")
    if not valid:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _shorten(key, text)


def read_key(key: str) -> str:
    """``key`` as read from a log: kept when a log can hold it, else :func:`clean_key`'s name."""
    if len(key) <= MAX_KEY_CHARS and _valid_utf8(key):
        return key
    return clean_key(key)


def _shown(key: str) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"


def describe_change(key: str, cleaned: str) -> str:
    """One line saying why ``key`` is logged as ``cleaned``.

    >>> describe_change("a\\ud800", clean_key("a\\ud800"))
    "the key 'a\\\\ud800' holds a lone surrogate (not UTF-8); it is logged as 'a\\\\\\\\ud800'"
    >>> describe_change("a\\\\ud800", clean_key("a\\\\ud800"))
    "the key 'a\\\\\\\\ud800' looks like an escaped surrogate; it is logged with its backslashes doubled, as 'a\\\\\\\\\\\\\\\\ud800'"
    """
    if len(key) > MAX_KEY_CHARS:
        return (
            f"a key of {len(key):,} characters (more than {MAX_KEY_CHARS:,}) is shortened "
            f"to {_shown(cleaned)}"
        )
    if _valid_utf8(key):
        return (
            f"the key {_shown(key)} looks like an escaped surrogate; it is logged with its "
            f"backslashes doubled, as {_shown(cleaned)}"
        )
    return (
        f"the key {_shown(key)} holds a lone surrogate (not UTF-8); it is logged as "
        f"{_shown(cleaned)}"
    )
