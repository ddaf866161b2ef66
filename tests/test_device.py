"""Torch tensors stay on their device: no host reads while recording, one copy per compute."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

import metricsync as ms  # noqa: E402
from metricsync._record import _convert as device_mod  # noqa: E402
from metricsync._record._device import BAD_NAN, DeviceState  # noqa: E402
from metricsync.testing import (  # noqa: E402
    count_blocking_uploads,
    count_device_ops,
    meta_records,
)

READS = ("item", "cpu", "tolist", "numpy")
SPECS = {
    "ent": ms.Spec(("mean", "sum", "count", "min", "max", "last", "std", "var")),
    "len": ms.Spec(("mean", "p50", "p99", "p0", "p100")),
    "kl": ms.Spec("mean", nan="ignore"),
    "strict": ms.Spec("mean", nan="error"),
    "pg": ms.Spec("sum", across="mean"),
}


@contextlib.contextmanager
def no_host_reads(reads: tuple[str, ...] = READS) -> Iterator[list[str]]:
    """Inside the block, every host read of a tensor raises (and is counted)."""
    attempts: list[str] = []

    def forbid(method: str) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            attempts.append(method)
            raise AssertionError(f"Tensor.{method}() called while recording")

        return read

    with pytest.MonkeyPatch.context() as mp:
        for method in reads:
            mp.setattr(torch.Tensor, method, forbid(method))
        yield attempts


def _calls(dev: str) -> list[tuple[str, Any, dict[str, Any]]]:
    """A mix of record calls with device values, weights and masks."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g).to(dev)
    mask = (torch.rand(4, 8, generator=g) < 0.6).to(dev)
    weight = torch.rand(8, generator=g).to(dev)
    return [
        ("ent", x, {"mask": mask}),
        ("ent", x[0], {"weight": weight}),
        ("ent", x, {"weight": torch.ones(8).to(dev), "mask": mask.to(torch.int32)}),
        ("ent", x.to(torch.bfloat16), {}),
        ("ent", torch.tensor(3).to(dev), {}),
        ("len", torch.arange(1, 100).to(dev), {"mask": torch.ones(99, dtype=torch.bool).to(dev)}),
        ("kl", torch.tensor([1.0, float("nan")]).to(dev), {}),
        ("strict", x, {"weight": 2.0}),
        ("pg", x.sum(), {}),
        ("ent", x[1], {}),
        ("pg", x[2].sum(), {}),
    ]


def _record_everything(m: ms.Metrics, dev: str, calls: Any = None) -> None:
    for name, value, kwargs in calls or _calls(dev):
        m.record(name, value, **kwargs)


def test_recording_never_reads_the_tensor() -> None:
    m = ms.Metrics(SPECS)
    # CPU tensors are host memory, recorded like numpy data through a zero-copy
    # numpy view; nothing copies them (cpu) or reads them element by element
    with no_host_reads(("item", "cpu", "tolist")) as attempts:
        _record_everything(m, "cpu")
    assert attempts == []
    # CPU states are host memory: names may fold them (the meta test below shows
    # that names reads nothing from an accelerator)
    assert set(m.names) == set(SPECS)
    assert m.compute()["ent/count"] > 0


def test_recording_on_the_meta_device() -> None:
    m = ms.Metrics(SPECS)
    with no_host_reads() as attempts, meta_records():
        _record_everything(m, "meta")
        assert set(m.names) == set(SPECS)
        assert len(m) == len(SPECS) and "ent" in m
    assert attempts == []


def test_recording_and_folding_device_tensors_upload_nothing_blocking() -> None:
    """A host-to-device copy from pageable memory makes the host wait (CUDA synchronizes
    the stream): none while recording, folding a full buffer or folding a large tensor;
    the records' bookkeeping goes up in one pinned, non-blocking copy per fold."""
    calls = _calls("meta")  # the inputs are made before counting
    block = torch.zeros(1 << 15, device="meta")
    large = torch.zeros(1 << 21, device="meta")  # folds on its own, without the buffer
    m = ms.Metrics(SPECS)
    with count_blocking_uploads() as uploads, count_device_ops() as ops:
        _record_everything(m, "meta", calls)
        for i in range(40):  # fills the pending buffer: folds into the state several times
            m.record("ent", block)
            m.record(f"later/{i % 5}", calls[0][1][0, 0])  # rows added after a fold
        m.record("len", large)
        m.record("pg", large, weight=2.0)
        assert set(m.names) >= set(SPECS)
    assert dict(uploads) == {}
    assert ops["aten.scatter_reduce"] > 0 and ops["aten.index_add"] > 0  # folds ran


@pytest.mark.usefixtures("meta_standins")
def test_meta_tensor_with_host_mask_and_weight() -> None:
    m = ms.Metrics()
    x = torch.ones(2, 3, device="meta")
    m.record("a", x, mask=np.array([[True, False, True], [True, True, False]]))
    m.record("a", x, weight=np.array([1.0, 2.0, 3.0]))
    m.record("a", x, weight=0.5, mask=torch.ones(2, 3, dtype=torch.bool, device="meta"))
    assert m.names == ["a"]
    with pytest.raises(ValueError, match="'a'"):
        m.record("a", x, mask=torch.ones(3, 2, dtype=torch.bool, device="meta"))


@pytest.fixture
def meta_standins() -> Iterator[None]:
    """Meta tensors stand in for an accelerator's (outside, record() refuses them)."""
    with meta_records():
        yield


class _Transfers:
    """Counts device-to-host copies: ``cpu()``, ``to(<cpu>)``, ``item()`` and ``tolist()`` calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        cpu, to = torch.Tensor.cpu, torch.Tensor.to
        for method in ("item", "tolist"):
            monkeypatch.setattr(torch.Tensor, method, self._counted(getattr(torch.Tensor, method)))

        def counted_cpu(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return cpu(t, *args, **kwargs)

        def counted_to(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            target = kwargs.get("device", args[0] if args else None)
            to_cpu = isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"
            if to_cpu and t.device.type != "cpu":
                self.count += 1
            return to(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "cpu", counted_cpu)
        monkeypatch.setattr(torch.Tensor, "to", counted_to)

    def _counted(self, method: Any) -> Any:
        def counted(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return method(t, *args, **kwargs)

        return counted


@pytest.mark.usefixtures("deferred")  # CPU tensors are host data: CPU plays the accelerator here
def test_compute_copies_once_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    m = ms.Metrics(SPECS)
    _record_everything(m, "cpu")
    m.record("host", 1.0)
    m.record("host", np.array([2.0, 3.0]))
    transfers = _Transfers(monkeypatch)
    first = m.compute()
    assert transfers.count == 1
    assert m.compute() == first  # nothing left on the device: no further copy
    assert transfers.count == 1
    m.record("ent", torch.ones(3))
    m.compute()
    assert transfers.count == 2


def test_tensor_results_match_numpy() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, generator=g, dtype=torch.float64)
    w = torch.rand(64, generator=g, dtype=torch.float64)
    mask = torch.rand(64, generator=g) < 0.5
    m = ms.Metrics({"x": SPECS["ent"]})
    m.record("x", x, weight=w, mask=mask)
    xn, wn = x.numpy(), (w * mask).numpy()
    mean = float(np.sum(wn * xn) / np.sum(wn))
    kept = xn[wn > 0]
    got = m.compute()
    assert got["x/mean"] == pytest.approx(mean)
    assert got["x/count"] == pytest.approx(float(np.sum(wn)))
    assert got["x/var"] == pytest.approx(float(np.sum(wn * (xn - mean) ** 2) / np.sum(wn)))
    assert (got["x/min"], got["x/max"], got["x/last"]) == (kept.min(), kept.max(), kept[-1])


def test_recording_keeps_no_reference_to_the_input() -> None:
    x = torch.tensor([1.0, 2.0, 3.0])
    m = ms.Metrics({"x": ms.Spec(("sum", "last"))})
    m.record("x", x)
    x.mul_(100.0)  # the caller reuses its buffer
    assert m.compute() == {"x/sum": 6.0, "x/last": 3.0}


def test_grad_tensors_are_accepted_and_not_kept_in_the_graph() -> None:
    p = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = (p * p).sum()
    m = ms.Metrics()
    m.record("loss", loss)
    m.record("loss", p * 3.0)
    loss.backward()
    assert m.compute() == {"loss": pytest.approx((5.0 + 3.0 + 6.0) / 3)}


# ------------------------------------------------- deferred device errors


@pytest.fixture
def deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat CPU like an accelerator: value checks run on the device, reported by compute()."""
    monkeypatch.setattr(device_mod, "HOST_DEVICE_TYPES", frozenset())


@pytest.mark.usefixtures("deferred")
@pytest.mark.parametrize(
    ("name", "value", "kwargs", "what"),
    [
        ("kl", torch.tensor([1.0, 2.0]), {"weight": torch.tensor([1.0, -1.0])}, "weight"),
        ("kl", torch.tensor([1.0, 2.0]), {"weight": torch.tensor(float("nan"))}, "weight"),
        ("kl", torch.tensor([1.0, 2.0]), {"weight": torch.tensor([1.0, float("inf")])}, "weight"),
        ("strict", torch.tensor([1.0, float("nan")]), {}, "non-finite"),
        ("strict", torch.tensor([[float("inf")]], dtype=torch.float64), {}, "non-finite"),
    ],
)
def test_bad_device_values_are_reported_by_compute(
    name: str, value: torch.Tensor, kwargs: dict[str, Any], what: str
) -> None:
    m = ms.Metrics(SPECS)
    with no_host_reads() as attempts:
        m.record(name, torch.tensor([5.0]))
        m.record(name, value, **kwargs)  # no error yet: recording does not read the device
        m.record(name, torch.tensor([7.0]))
    assert attempts == []
    with pytest.raises(ValueError, match=f"'{name}'") as info:
        m.compute()
    assert what in str(info.value)
    # the bad record was discarded; the error stays, whatever observes it, until reset()
    for observe in (m.compute, m.copy, m.to_bytes, m.compute):
        with pytest.raises(ValueError, match=f"'{name}'"):
            observe()
    m.reset()
    m.record(name, torch.tensor([6.0]))
    assert m.compute()[name] == 6.0


@pytest.mark.usefixtures("deferred")
def test_masked_out_nan_is_not_an_error_on_the_device() -> None:
    m = ms.Metrics(SPECS)
    m.record("strict", torch.tensor([1.0, float("nan")]), mask=torch.tensor([True, False]))
    assert m.compute() == {"strict": 1.0}


@pytest.mark.usefixtures("deferred")
def test_bad_device_record_discards_its_sketch_too() -> None:
    m = ms.Metrics({"len": ms.Spec(("p50", "count"), nan="error")})
    m.record("len", torch.tensor([1.0, 2.0, 3.0]))
    m.record("len", torch.tensor([1000.0, float("nan")]))
    with pytest.raises(ValueError, match="'len'"):
        m.compute()  # raised until reset(): the state itself shows what was kept
    spec = ms.Spec(("p50", "count"), nan="error")
    bad, good = DeviceState(torch.device("cpu")), DeviceState(torch.device("cpu"))
    for state in (bad, good):
        state.add(0, spec, torch.tensor([1.0, 2.0, 3.0]), None, None, now=1.0)
    bad.add(0, spec, torch.tensor([1000.0, float("nan")]), None, None, now=2.0)
    _, cols, cells, errors = bad.snapshot()
    _, good_cols, good_cells, _ = good.snapshot()
    assert errors.tolist() == [BAD_NAN]
    np.testing.assert_array_equal(cols, good_cols)
    assert cells[0].tolist() == good_cells[0].tolist()


@pytest.mark.usefixtures("deferred")
@pytest.mark.parametrize("size", [1 << 10, 1 << 21], ids=["buffered", "large"])
def test_a_fold_without_quantile_records_leaves_the_sketches_alone(size: int) -> None:
    # a batch holding only plain records folds beside rows that already have sketches
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(1, 1000, (64,), generator=g).double()
    x = torch.randn(size, generator=g, dtype=torch.float64)
    m = ms.Metrics(SPECS)
    m.record("len", lengths)
    m.compute()  # a snapshot folds without committing
    for _ in range(max(1, (1 << 19) // size)):  # enough to fill the buffer, and fold it, twice
        m.record("ent", x)
    m.record("len", lengths)
    got = m.compute()
    both = np.concatenate([lengths.numpy()] * 2)
    assert got["len/mean"] == pytest.approx(both.mean())
    assert abs(got["len/p50"] - np.quantile(both, 0.5)) <= 0.01 * np.quantile(both, 0.5)
    assert got["ent/max"] == float(x.max())


@pytest.mark.usefixtures("deferred")
def test_tensors_of_every_size_record_around_the_buffer_bounds() -> None:
    # sizes across the pending buffer's first size (1 << 16), the largest a record may
    # copy into it (1 << 20) and past it (folded on its own), with and without a mask
    g = torch.Generator().manual_seed(3)
    sizes = [1, (1 << 16) - 1, (1 << 16) + 1, 300_000, 1 << 20, (1 << 20) + 1, 5]
    values = [torch.randn(n, generator=g, dtype=torch.float64) for n in sizes]
    masks = [torch.rand(n, generator=g) < 0.5 for n in sizes]
    m = ms.Metrics({"x": ms.Spec(("mean", "max", "count")), "y": ms.Spec(("sum", "min"))})
    for x, mask in zip(values, masks):
        m.record("x", x)
        m.record("y", x, mask=mask)
    got = m.compute()
    xs = np.concatenate([x.numpy() for x in values])
    ys = np.concatenate([x[mask].numpy() for x, mask in zip(values, masks)])
    assert got["x/count"] == len(xs) and got["x/max"] == xs.max()
    assert got["x/mean"] == pytest.approx(xs.mean(), rel=1e-12, abs=1e-12)
    assert got["y/sum"] == pytest.approx(ys.sum(), rel=1e-12, abs=1e-9)
    assert got["y/min"] == ys.min()


@pytest.mark.usefixtures("deferred")
def test_later_device_records_of_a_name_agree_with_numpy_and_check_their_input() -> None:
    # A name's first device record resolves its slot and row; later ones reuse them.
    rng = np.random.default_rng(3)
    shapes: list[tuple[int, ...]] = [(), (), (4, 8), (), (5,), (4, 8)]
    xs = [rng.normal(size=shape) for shape in shapes]
    masks = [None, None, rng.random((4, 8)) < 0.5, None, None, rng.random((4, 8)) < 0.5]
    m = ms.Metrics({"e": ms.Spec(("mean", "min", "max", "count", "last")), "w": ms.Spec("mean")})
    kept = []
    for x, mask in zip(xs, masks):
        t = torch.tensor(x, requires_grad=True)  # grad tensors too, both 0-d and not
        m.record("e", t, mask=None if mask is None else torch.tensor(mask))
        kept.append(np.ravel(x) if mask is None else x[mask])
    samples = np.concatenate(kept)
    expected = {
        "e/mean": pytest.approx(samples.mean()),
        "e/min": samples.min(),
        "e/max": samples.max(),
        "e/count": float(len(samples)),
        "e/last": pytest.approx(samples[-1]),
    }
    assert m.compute() == expected
    before = m.to_bytes()
    with pytest.raises(TypeError, match="'e'"):
        m.record("e", torch.tensor([1j]))
    with pytest.raises(ValueError, match="'e'"):
        m.record("e", torch.ones(4, 8), mask=torch.ones(8, 4, dtype=torch.bool))
    assert m.to_bytes() == before
    # weighted records take the same path once the name has a device record
    ws = [rng.random(size=shape) for shape in shapes]
    for x, w in zip(xs, ws):
        m.record("w", torch.tensor(x), weight=torch.tensor(w))
    m.record("w", torch.tensor(5.0), weight=0.5)
    values = np.concatenate([np.ravel(x) for x in xs] + [[5.0]])
    weights = np.concatenate([np.ravel(w) for w in ws] + [[0.5]])
    assert m.compute()["w"] == pytest.approx(np.average(values, weights=weights))
    with pytest.raises(ValueError, match="'w'"):
        m.record("w", torch.tensor(1.0), weight=-1.0)
    m.reset()  # what the first records resolved is forgotten with the samples
    m.record("e", torch.tensor(2.0))
    m.record("e", torch.tensor(4.0))
    assert m.compute()["e/mean"] == 3.0


def test_cpu_tensors_are_checked_at_record() -> None:
    m = ms.Metrics(SPECS)
    m.record("kl", torch.tensor([1.0]))
    before = m.to_bytes()
    with pytest.raises(ValueError, match="'kl'"):
        m.record("kl", torch.tensor([1.0, 2.0]), weight=torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="'strict'"):
        m.record("strict", torch.tensor([float("nan")]))
    assert m.to_bytes() == before


# ------------------------------------------------------------ performance


def _python_calls(fn: Any) -> int:
    """The Python and C function calls ``fn()`` makes (a profile hook's count)."""
    import gc
    import sys

    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    gc.collect()  # finalizers of earlier tests' garbage would otherwise run (and count) here
    gc.disable()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls


def test_recording_a_large_masked_tensor_makes_no_call_per_element() -> None:
    # a few vectorized passes over the data: the calls made do not grow with its size
    m = ms.Metrics({"ent": ms.Spec(("mean", "max"))})
    counts, top = [], -np.inf
    gen = torch.Generator().manual_seed(0)
    for n in (100_000, 1_000_000):  # both past the size whose kept samples are buffered
        x = torch.randn(n, generator=gen)
        mask = torch.rand(n, generator=gen) < 0.7
        m.record("ent", x, mask=mask)  # the first record of a size may set things up
        counts.append(_python_calls(lambda x=x, mask=mask: m.record("ent", x, mask=mask)))
        top = max(top, float(x[mask].max()))  # every record so far, the smaller size's too
        assert m.compute()["ent/max"] == top
    assert counts[1] <= counts[0] + 5


_GRAD_SCALARS = """
import warnings
import torch
import metricsync as ms

warnings.simplefilter("error")  # torch warns once a process: a fresh one sees every warning
m = ms.Metrics()
loss = (torch.tensor(1.5, requires_grad=True) * 2).sum()
m.record("loss", loss)  # a name's first record
m.record("loss", loss * 2)  # the fast path
m.update({"kl": loss})
assert m.compute() == {"loss": 4.5, "kl": 3.0}, m.compute()
"""


def test_recording_a_0d_tensor_in_a_graph_warns_nothing() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _GRAD_SCALARS], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
