"""Human-readable numbers: format specs, the adaptive format and one-line summaries.

``fmt`` is a format spec without braces; ``None`` picks the adaptive :func:`format_value`.
Specs are bounded (:data:`MAX_FMT_LENGTH`, :data:`MAX_FMT_NUMBER`) so a log header cannot make
formatting expensive. Pure functions, no numpy or torch.

>>> format_line({"actor/lr": 3e-4, "loss": 0.693147, "tokens": 123456789.0},
...             {"actor/lr": None, "loss": ".3f", "tokens": None})
'actor/lr=3.00e-04  loss=0.693  tokens=123,456,789'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = ["MAX_FMT_LENGTH", "MAX_FMT_NUMBER", "check_fmt", "format_line", "format_value"]

MAX_FMT_LENGTH = 32
"""Longest format spec accepted (``"+,.3f"`` is 5 characters; the longest valid one is ~20)."""
MAX_FMT_NUMBER = 100
"""Largest width or precision a format spec may ask for (``"100.50f"`` is the edge)."""

_NUMBER = re.compile(r"\d+")

_SMALL = 1e-3  # below this magnitude the adaptive format switches to scientific notation
_GROUPED = 1e4  # from here on values print as grouped integers (123,456)
_HUGE = 1e15  # from here on grouped integers get too long: scientific again


def check_fmt(fmt: str | None) -> str | None:
    """Validate a format spec (without braces) and return it unchanged.

    The spec is tried on a float, so anything ``format(1.5, fmt)`` accepts is
    valid. ``None`` (the adaptive format) is valid too. The error says what was
    expected and what arrived; callers add the metric name.

    >>> check_fmt(".2e")
    '.2e'
    >>> check_fmt(None) is None
    True
    >>> check_fmt("{:.3f}")
    Traceback (most recent call last):
    ...
    ValueError: expected a format spec without braces such as '.3f', '.2e', ',.0f' or '.1%', got '{:.3f}'

    Widths and precisions are capped at :data:`MAX_FMT_NUMBER`, so a spec can
    never make one value cost megabytes:

    >>> check_fmt("300000000.3f")
    Traceback (most recent call last):
    ...
    ValueError: expected a format spec with widths and precisions of at most 100, got '300000000.3f'
    """
    if fmt is None:
        return None
    expected = "a format spec without braces such as '.3f', '.2e', ',.0f' or '.1%'"
    if not isinstance(fmt, str):
        raise ValueError(f"expected {expected} or None, got {type(fmt).__name__} {fmt!r}")
    if len(fmt) > MAX_FMT_LENGTH:
        raise ValueError(
            f"expected a format spec of at most {MAX_FMT_LENGTH} characters, "
            f"got {len(fmt)} characters ({fmt[:MAX_FMT_LENGTH]!r}...)"
        )
    if "{" in fmt or "}" in fmt:
        raise ValueError(f"expected {expected}, got {fmt!r}")
    # Every run of digits in a float spec is a width, a precision or a one-digit fill.
    if any(int(number) > MAX_FMT_NUMBER for number in _NUMBER.findall(fmt)):
        raise ValueError(
            f"expected a format spec with widths and precisions of at most {MAX_FMT_NUMBER}, "
            f"got {fmt!r}"
        )
    try:
        format(1.5, fmt)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"expected {expected}, got {fmt!r} ({exc})") from None
    return fmt


def format_value(value: float, fmt: str | None = None) -> str:
    """Format one number, with ``fmt`` or, when ``fmt`` is None, adaptively.

    NaN and infinities print as ``nan``, ``inf`` and ``-inf`` whatever the
    format. The adaptive rule, by magnitude ``|v|``:

    - ``0`` prints ``0``; whole numbers below 10,000 print as integers;
    - ``1e-3 <= |v| < 1e4``: 4 significant digits, fixed point, trailing
      zeros dropped (``0.6931``, ``12.35``, ``0.5``);
    - ``1e4 <= |v| < 1e15``: a grouped integer (``123,456,789``), rounding
      away any fraction (under 0.01 % of the value);
    - ``|v| < 1e-3`` or ``|v| >= 1e15``: scientific with 3 significant digits
      (``3.00e-04``), so a small learning rate never prints as ``0.000``.

    >>> format_value(1e-6), format_value(3e-4), format_value(0.6931471)
    ('1.00e-06', '3.00e-04', '0.6931')
    >>> format_value(128.0), format_value(123456789), format_value(0.0)
    ('128', '123,456,789', '0')
    >>> format_value(12.34567), format_value(-2.5), format_value(2.5e17)
    ('12.35', '-2.5', '2.50e+17')
    >>> format_value(0.1234, ".1%"), format_value(float("nan"), ".1%")
    ('12.3%', 'nan')

    ``fmt`` goes through :func:`check_fmt`, so an
    invalid or oversized spec raises ``ValueError`` instead of costing memory.
    """
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if fmt is not None:
        check_fmt(fmt)
        return format(value, fmt)
    magnitude = abs(value)
    if magnitude == 0.0:
        return "0"
    if magnitude < _SMALL or magnitude >= _HUGE:
        return format(value, ".2e")
    if magnitude >= _GROUPED:
        return format(value, ",.0f")
    if value.is_integer():
        return str(int(value))
    text = format(value, ".4g")
    if "e" in text:  # 9999.95 rounds up to 1e+04 under .4g
        return format(value, ",.0f")
    return text


def format_line(values: Mapping[str, float], fmts: Mapping[str, str | None]) -> str:
    """One human line ``key=value  key2=value2``, each value in its key's format.

    Keys keep the order of ``values``; a key missing from ``fmts`` gets the
    adaptive format. Entries are separated by two spaces.

    >>> format_line({"loss": 0.25, "lr": 1e-5, "acc": 0.875}, {"acc": ".1%"})
    'loss=0.25  lr=1.00e-05  acc=87.5%'
    >>> format_line({}, {})
    ''
    """
    return "  ".join(f"{key}={format_value(value, fmts.get(key))}" for key, value in values.items())


def numbers_of(values: object) -> dict[str, float]:
    """A mapping of keys to numbers as floats; ``TypeError`` naming the key otherwise.

    >>> numbers_of({"loss": 1})
    {'loss': 1.0}
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"format() takes a mapping of keys to numbers, got {type(values).__name__}")
    checked = {}
    for key, value in values.items():
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError
            checked[key] = float(value)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(
                f"metric {key!r}: expected a number to format, got {type(value).__name__}"
            ) from None
    return checked
