"""Spec values, glob resolution, ``define`` and spec conflicts in ``merge``."""

from __future__ import annotations

import pickle

import pytest

import metricsync as ms
from metricsync._state._rules import SpecTable
from metricsync._state._spec import quantile_of

# ------------------------------------------------------------------ values


def test_one_element_tuple_equals_bare_string() -> None:
    assert ms.Spec("max") == ms.Spec(("max",))
    assert ms.Spec("max") == ms.Spec(["max"])
    assert hash(ms.Spec("max")) == hash(ms.Spec(("max",)))
    assert ms.Spec(("mean", "max")) != ms.Spec(("max", "mean"))  # order is the output order
    assert ms.Spec() == ms.Spec("mean")
    assert ms.Spec("sum") != ms.Spec("sum", across="mean")
    assert ms.Spec("sum") != ms.Spec("sum", fmt=".1f")
    assert ms.Spec("sum") != ms.Spec("sum", nan="ignore")
    assert ms.Spec("sum") != "sum"


def test_defaults() -> None:
    spec = ms.Spec()
    assert (spec.reduce, spec.across, spec.fmt, spec.nan) == (("mean",), "exact", None, "propagate")


def test_hashable_usable_as_dict_key() -> None:
    table = {ms.Spec("max"): 1, ms.Spec(("max",)): 2, ms.Spec("min"): 3}
    assert len(table) == 2
    assert table[ms.Spec("max")] == 2


def test_immutable() -> None:
    spec = ms.Spec("max")
    with pytest.raises(AttributeError):
        spec.reduce = ("min",)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        spec.fmt = ".2f"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        spec.new_attribute = 1  # type: ignore[attr-defined]
    assert spec == ms.Spec("max")


def test_pickle_and_json_round_trip() -> None:
    spec = ms.Spec(("mean", "p99.9"), across="max", fmt=",.0f", nan="ignore")
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert ms.Spec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    "stat",
    ["mean", "sum", "count", "min", "max", "last", "std", "var", "p0", "p50", "p99.9", "p100"],
)
def test_every_documented_statistic_is_accepted(stat: str) -> None:
    assert ms.Spec(stat).reduce == (stat,)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"reduce": "median"},
        {"reduce": "MEAN"},
        {"reduce": "p101"},
        {"reduce": "p-1"},
        {"reduce": "p"},
        {"reduce": "p50%"},
        {"reduce": ""},
        {"reduce": ()},
        {"reduce": ("mean", "mean")},
        {"reduce": ("mean", "avg")},
        {"across": "median"},
        {"across": "none"},
        {"across": ""},
        {"nan": "drop"},
        {"nan": ""},
        {"fmt": "{:.3f}"},
        {"fmt": ".3q"},
        {"fmt": "d"},
    ],
)
def test_bad_spec_raises_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ms.Spec(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", [".3f", ".2e", ",.0f", ".1%", ">10.2f", "g"])
def test_good_formats(fmt: str) -> None:
    assert ms.Spec(fmt=fmt).fmt == fmt


def test_quantile_of() -> None:
    assert quantile_of("p50") == 0.5
    assert quantile_of("p99.9") == 0.999
    assert quantile_of("p0") == 0.0
    assert quantile_of("p100") == 1.0
    assert quantile_of("mean") is None
    assert quantile_of("p100.5") is None
    assert ms.Spec(("mean", "p90", "p0")).quantiles == (0.9, 0.0)


def test_output_keys() -> None:
    assert ms.Spec("max").output_keys("x") == ("x",)
    assert ms.Spec(("max",)).output_keys("x") == ("x",)
    assert ms.Spec(("mean", "p99")).output_keys("rl") == ("rl/mean", "rl/p99")


def test_compute_keys_follow_the_spec() -> None:
    m = ms.Metrics({"one": ms.Spec(("max",)), "two": ms.Spec(("min", "max"))})
    for name in ("one", "two", "default"):
        m.record(name, [1.0, 3.0])
    assert m.compute() == {"one": 3.0, "two/min": 1.0, "two/max": 3.0, "default": 2.0}


# --------------------------------------------------------- glob resolution


def test_resolution_exact_then_longest_glob_then_default() -> None:
    table = SpecTable(
        {
            "timing/*": ms.Spec("max"),
            "timing/gen*": ms.Spec("min"),
            "timing/gen_seq": ms.Spec("sum"),
            "*": ms.Spec("last"),
        }
    )
    assert table.resolve("timing/gen_seq") == ms.Spec("sum")  # exact wins over every glob
    assert table.resolve("timing/gen_batch") == ms.Spec("min")  # longest matching glob
    assert table.resolve("timing/step") == ms.Spec("max")
    assert table.resolve("loss") == ms.Spec("last")
    assert SpecTable().resolve("loss") == ms.Spec()


def test_resolution_through_metrics() -> None:
    m = ms.Metrics(
        {
            "a/*": ms.Spec("max"),
            "a/b*": ms.Spec("min"),
            "a/bc": ms.Spec("sum"),
            "a/?": ms.Spec("count"),
        }
    )
    for name in ("a/x1", "a/by", "a/bc", "a/q", "other"):
        m.record(name, 1.0)
        m.record(name, 2.0)
    assert m.compute() == {"a/x1": 2.0, "a/by": 1.0, "a/bc": 3.0, "a/q": 2.0, "other": 1.5}
    assert m.spec("a/x1") == ms.Spec("max")
    assert m.spec("never/recorded") == ms.Spec()


def test_names_without_spec_get_weighted_mean() -> None:
    m = ms.Metrics()
    m.record("loss", 2.0, weight=1)
    m.record("loss", 4.0, weight=3)
    assert m.compute() == {"loss": 3.5}
    assert m.spec("loss") == ms.Spec()


# ------------------------------------------------------------------ define


def test_define_same_spec_twice_is_fine() -> None:
    m = ms.Metrics({"x": ms.Spec("max")})
    m.define("x", ms.Spec(("max",)))
    m.define("g/*", ms.Spec("sum"))
    m.define("g/*", ms.Spec("sum"))
    m.record("g/a", 1.0)
    m.record("g/a", 2.0)
    assert m.compute() == {"g/a": 3.0}


def test_define_conflicting_spec_raises() -> None:
    m = ms.Metrics({"x": ms.Spec("max")})
    with pytest.raises(ms.SpecMismatchError, match="x"):
        m.define("x", ms.Spec("min"))
    m.define("g/*", ms.Spec("sum"))
    with pytest.raises(ms.SpecMismatchError):
        m.define("g/*", ms.Spec("max"))
    assert m.spec("x") == ms.Spec("max")
    assert m.spec("g/a") == ms.Spec("sum")


def test_spec_mismatch_is_a_metricsync_error() -> None:
    assert issubclass(ms.SpecMismatchError, ms.MetricsyncError)


def test_define_after_recording_with_the_default_raises() -> None:
    m = ms.Metrics()
    m.record("loss", 1.0)
    before = m.to_bytes()
    with pytest.raises(ms.SpecMismatchError, match="loss"):
        m.define("loss", ms.Spec("sum"))
    assert m.to_bytes() == before
    m.define("loss", ms.Spec())  # the spec it already has
    assert m.compute() == {"loss": 1.0}


def test_glob_that_changes_a_name_holding_samples_raises() -> None:
    m = ms.Metrics()
    m.record("timing/step", 1.0)
    m.record("timing/step", 3.0)
    before = m.to_bytes()
    with pytest.raises(ms.SpecMismatchError, match="timing/step"):
        m.define("timing/*", ms.Spec("max"))
    assert m.to_bytes() == before
    assert m.compute() == {"timing/step": 2.0}
    # the rejected glob was not added: a new name still gets the default
    m.record("timing/other", 5.0)
    m.record("timing/other", 7.0)
    assert m.compute()["timing/other"] == 6.0


def test_glob_that_keeps_the_spec_of_a_name_holding_samples_is_fine() -> None:
    m = ms.Metrics({"timing/step": ms.Spec("max")})
    m.record("timing/step", 1.0)
    m.define("timing/*", ms.Spec("sum"))  # exact rule still wins for timing/step
    m.record("timing/step", 3.0)
    m.record("timing/gen", 3.0)
    m.record("timing/gen", 4.0)
    assert m.compute() == {"timing/step": 3.0, "timing/gen": 7.0}


def test_glob_may_change_a_name_without_samples() -> None:
    m = ms.Metrics()
    m.record("timing/step", 1.0)
    m.reset()
    m.define("timing/*", ms.Spec("max"))
    m.record("timing/step", 1.0)
    m.record("timing/step", 3.0)
    assert m.compute() == {"timing/step": 3.0}


# ------------------------------------------------------- merge conflicts


def _loaded(specs: dict[str, ms.Spec], data: dict[str, list[float]]) -> ms.Metrics:
    m = ms.Metrics(specs)
    for name, values in data.items():
        for v in values:
            m.record(name, v)
    return m


@pytest.mark.parametrize(
    ("left_specs", "right_specs"),
    [
        ({"x": ms.Spec("max")}, {"x": ms.Spec("min")}),
        ({"x": ms.Spec("max")}, {}),  # explicit on one side, default on the other
        ({"x": ms.Spec("sum")}, {"x": ms.Spec("sum", across="mean")}),
        ({"x": ms.Spec("sum", fmt=".1f")}, {"x": ms.Spec("sum", fmt=".2f")}),
        ({"*": ms.Spec("max")}, {"x": ms.Spec("min")}),  # glob on one side, exact on the other
    ],
)
def test_merge_with_differing_specs_raises_and_merges_nothing(
    left_specs: dict[str, ms.Spec], right_specs: dict[str, ms.Spec]
) -> None:
    left = _loaded(left_specs, {"x": [1.0, 2.0], "y": [5.0]})
    right = _loaded(right_specs, {"x": [7.0], "z": [9.0]})
    left_before, right_before = left.to_bytes(), right.to_bytes()
    left_values, right_values = left.compute(), right.compute()
    with pytest.raises(ms.SpecMismatchError, match="'x'"):
        left.merge(right)
    with pytest.raises(ms.SpecMismatchError):
        right.merge(left)
    with pytest.raises(ms.SpecMismatchError):
        ms.merge([left, right])
    assert left.to_bytes() == left_before and right.to_bytes() == right_before
    assert left.compute() == left_values and right.compute() == right_values


def test_merge_where_the_other_glob_would_change_my_samples_raises() -> None:
    mine = _loaded({}, {"timing/step": [1.0, 3.0]})
    theirs = ms.Metrics({"timing/*": ms.Spec("max")})
    theirs.record("timing/gen", 1.0)
    before = mine.to_bytes()
    with pytest.raises(ms.SpecMismatchError, match="timing/step"):
        mine.merge(theirs)
    assert mine.to_bytes() == before


def test_merge_where_my_glob_disagrees_with_their_name_raises() -> None:
    mine = ms.Metrics({"timing/*": ms.Spec("max")})
    mine.record("timing/step", 1.0)
    theirs = _loaded({}, {"timing/gen": [2.0]})
    before = mine.to_bytes()
    with pytest.raises(ms.SpecMismatchError, match="timing/gen"):
        mine.merge(theirs)
    assert mine.to_bytes() == before


def test_merge_with_compatible_rules_takes_the_union() -> None:
    left = _loaded({"t/*": ms.Spec("max")}, {"t/a": [1.0, 4.0]})
    right = _loaded({"t/*": ms.Spec("max"), "s": ms.Spec("sum")}, {"t/a": [2.0], "s": [1.0, 2.0]})
    merged = ms.merge([left, right])
    assert merged.compute() == {"t/a": 4.0, "s": 3.0}
    # the rules travel too: a new name under the glob gets the glob's spec
    merged.record("t/b", 1.0)
    merged.record("t/b", 2.0)
    assert merged.compute()["t/b"] == 2.0
    assert merged.spec("s") == ms.Spec("sum")


def test_merge_declared_only_names_conflict_too() -> None:
    left = ms.Metrics({"x": ms.Spec("max")})
    right = _loaded({"x": ms.Spec("min")}, {"x": [1.0]})
    with pytest.raises(ms.SpecMismatchError):
        left.merge(right)


def test_accuracy_without_a_sketch_never_makes_specs_differ() -> None:
    assert ms.Spec("mean", accuracy=0.05) == ms.Spec("mean")
    assert ms.Spec(("p0", "p100"), accuracy=0.05) == ms.Spec(("p0", "p100"))
    assert ms.Spec("p50", accuracy=0.02) != ms.Spec("p50")


def test_a_declared_name_with_brackets_gets_its_own_spec() -> None:
    m = ms.Metrics({"acc[top1]": ms.Spec("max")})
    m.record("acc[top1]", 1.0)
    m.record("acc[top1]", 3.0)
    m.define("reward[0]", ms.Spec("sum"))
    m.record("reward[0]", 2.0)
    m.record("reward[0]", 2.0)
    assert m.spec("acc[top1]") == ms.Spec("max")
    assert m.compute() == {"acc[top1]": 3.0, "reward[0]": 4.0}
    # as a pattern it still matches other names
    assert m.spec("acct") == ms.Spec("max")
