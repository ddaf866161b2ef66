"""Tests of metricsync._state._formatting: fixed formats, the adaptive format, lines."""

from __future__ import annotations

import math

import pytest

from metricsync._state._formatting import check_fmt, format_line, format_value


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1e-6, "1.00e-06"), (3e-4, "3.00e-04"), (-2.5e-5, "-2.50e-05"), (1.5e-9, "1.50e-09")],
)
def test_small_values_such_as_learning_rates_never_print_as_zero(
    value: float, expected: str
) -> None:
    assert format_value(value) == expected
    assert float(format_value(value)) == pytest.approx(value, rel=1e-2)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, "0"), (0.0, "0"), (-0.0, "0"), (1, "1"), (128.0, "128"), (-7, "-7"), (9999, "9999")],
)
def test_whole_numbers_print_as_integers(value: float, expected: str) -> None:
    assert format_value(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (123456789, "123,456,789"),
        (123456789.0, "123,456,789"),
        (12345.678, "12,346"),
        (-1e6, "-1,000,000"),
        (2.5e17, "2.50e+17"),
    ],
)
def test_large_values_stay_readable(value: float, expected: str) -> None:
    assert format_value(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.6931471, "0.6931"), (12.34567, "12.35"), (0.5, "0.5"), (0.001234, "0.001234")],
)
def test_ordinary_values_get_four_significant_digits(value: float, expected: str) -> None:
    assert format_value(value) == expected


def test_rounding_to_ten_thousand_does_not_switch_to_scientific() -> None:
    assert format_value(9999.96) == "10,000"


@pytest.mark.parametrize("fmt", [None, ".3f", ".2e", ",.0f", ".1%"])
def test_nan_and_infinities_print_plainly_whatever_the_format(fmt: str | None) -> None:
    assert format_value(math.nan, fmt) == "nan"
    assert format_value(math.inf, fmt) == "inf"
    assert format_value(-math.inf, fmt) == "-inf"


def test_explicit_formats_apply() -> None:
    assert format_value(1234567.891, ",.0f") == "1,234,568"
    assert format_value(0.1234, ".1%") == "12.3%"
    assert format_value(3e-4, ".3f") == "0.000"  # the user asked for it
    assert format_value(3e-4, ".2e") == "3.00e-04"
    assert format_value(True) == "1"


def test_check_fmt_accepts_float_specs() -> None:
    for fmt in (".3f", ".2e", ",.0f", ".1%", "g", "", None):
        assert check_fmt(fmt) == fmt


@pytest.mark.parametrize("fmt", ["{:.3f}", ".3q", "d", "s", ".f3"])
def test_check_fmt_rejects_bad_specs_saying_what_was_expected(fmt: str) -> None:
    with pytest.raises(ValueError, match="expected a format spec") as info:
        check_fmt(fmt)
    assert repr(fmt) in str(info.value)


def test_check_fmt_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="int"):
        check_fmt(3)  # type: ignore[arg-type]


def test_format_line_uses_each_keys_format_in_order() -> None:
    line = format_line(
        {"actor/lr": 3e-4, "loss": 0.693147, "tokens": 123456789, "acc": 0.5},
        {"loss": ".3f", "tokens": None, "acc": ".1%"},
    )
    assert line == "actor/lr=3.00e-04  loss=0.693  tokens=123,456,789  acc=50.0%"
