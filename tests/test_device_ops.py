"""Device ops per record, counted on the meta device (a count, not a timing).

On a GPU every aten op is at least one kernel launch, several microseconds of
CPU each, so the number of ops ``record()`` dispatches for a device tensor is
its cost. ``metricsync.testing.count_device_ops`` counts them on the ``meta``
device, which has no data: any read of it raises, so a record that completes
there never read the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import metricsync as ms  # noqa: E402
from metricsync._record._device_refs import REF_LIMIT  # noqa: E402
from metricsync.testing import (  # noqa: E402
    count_blocking_uploads,
    count_device_ops,
    meta_records,
)

META = torch.device("meta")
WINDOW = 512  # records counted per path, a fold among them: the per-record figure is the mean


# --- the counter itself, against ops written out by hand ---------------------


def test_counter_counts_each_op_on_the_device_by_name() -> None:
    x = torch.ones(4, 256, device=META)
    mask = torch.ones(4, 256, dtype=torch.bool, device=META)
    with count_device_ops() as ops:
        kept = (x * mask).sum()
        count = mask.sum()
        _ = kept / count
        torch.full((3,), 1.0, device=META)  # a factory op counts by its output
    assert dict(ops) == {"aten.mul": 1, "aten.sum": 2, "aten.div": 1, "aten.full": 1}
    assert ops.total() == 5


def test_counter_ignores_other_devices_and_stops_at_the_end_of_the_block() -> None:
    host = torch.ones(8)
    x = torch.ones(8, device=META)
    with count_device_ops() as ops:
        host.sum()
        host * 2.0
        x.sum()
    x.sum()  # after the block: not counted
    assert dict(ops) == {"aten.sum": 1}
    with count_device_ops("cpu") as cpu_ops:
        host.sum()
        x.sum()
    assert dict(cpu_ops) == {"aten.sum": 1}


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda t: t.item(), id="item"),
        pytest.param(lambda t: t.tolist(), id="tolist"),
        pytest.param(lambda t: t.cpu(), id="cpu"),
        pytest.param(lambda t: float(t), id="float"),
        pytest.param(lambda t: bool(t > 0), id="bool"),
    ],
)
def test_any_read_of_the_meta_device_raises(read: Callable[[Any], object]) -> None:
    # the oracle the no-read test below relies on
    with count_device_ops(), pytest.raises((RuntimeError, NotImplementedError, TypeError)):
        read(torch.ones((), device=META))


def test_blocking_upload_counter_against_uploads_written_out_by_hand() -> None:
    # each of these copies host memory to the device and waits for it on CUDA
    import numpy as np

    x = torch.zeros(10, 5, device=META)
    host = torch.ones(5)
    with count_blocking_uploads() as uploads:
        x[[1, 2]]
        x[np.array([1, 2]), 0]
        x[torch.tensor([0, 3])]
        x[0] = host
        x[0].copy_(host)
        torch.tensor([1.0, 2.0], device=META)
        torch.as_tensor(np.ones(3), device=META)
        host.to(META)
        host.to(device=META)
    assert dict(uploads) == {
        "Tensor.__getitem__": 3,
        "Tensor.__setitem__": 1,
        "Tensor.copy_": 1,
        "torch.tensor": 1,
        "torch.as_tensor": 1,
        "Tensor.to": 2,
    }
    # and none of these does: views, device-side indices, 0-d host scalars, non-blocking
    # copies, and host-only work
    index = torch.tensor([0, 3], device=META)
    with count_blocking_uploads() as none:
        x[1:3, 0]
        x[index]
        x[0] = torch.tensor(2.0)
        torch.where(x > 0, x, torch.tensor(1.0))
        host.to(META, non_blocking=True)
        x[0].copy_(host, non_blocking=True)
        torch.full((3,), 1.0, device=META)
        host[[0, 1]]
        host.to(torch.float64)
    assert dict(none) == {}


# --- what record() dispatches ------------------------------------------------


def _inputs() -> dict[str, Any]:
    """Inputs made on the meta device outside any counted block."""
    return {
        "scalar": torch.zeros((), device=META),
        "tokens": torch.zeros(4, 256, device=META),
        "mask": torch.zeros(4, 256, dtype=torch.bool, device=META),
        "lengths": torch.zeros(8, dtype=torch.int64, device=META),
        "weights": torch.zeros(4, 256, device=META),
    }


SPECS = {
    "loss": ms.Spec(),
    "entropy": ms.Spec("mean"),
    "adv": ms.Spec(("mean", "max", "min")),
    "response_length": ms.Spec(("mean", "p50", "p99")),
    "kl": ms.Spec(("mean", "std"), nan="error"),
    "score": ms.Spec(("mean", "last"), nan="ignore"),
    "pg": ms.Spec("sum", across="mean"),
}

PATHS: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "0-d": lambda m, x: m.record("loss", x["scalar"]),
    "masked mean": lambda m, x: m.record("entropy", x["tokens"], mask=x["mask"]),
    "masked (mean, max, min)": lambda m, x: m.record("adv", x["tokens"], mask=x["mask"]),
    "int tensor into a quantile": lambda m, x: m.record("response_length", x["lengths"]),
    "weighted, nan='error'": lambda m, x: m.record("kl", x["tokens"], weight=x["weights"]),
    "nan='ignore', last": lambda m, x: m.record("score", x["tokens"], mask=x["mask"]),
    "across='mean'": lambda m, x: m.record("pg", x["scalar"], weight=2.0),
}


def ops_per_record(path: str) -> float:
    """Mean device ops of one ``record()`` on this path over WINDOW records that include
    a fold (the pending references reach their bound in the middle of the window)."""
    m = ms.Metrics(SPECS)
    x = _inputs()
    record = PATHS[path]
    with meta_records():  # meta tensors stand in for an accelerator's
        for _ in range(REF_LIMIT - WINDOW // 2):  # the first record of a name allocates
            record(m, x)
        with count_device_ops() as ops:
            for _ in range(WINDOW):
                record(m, x)
    assert ops["aten.index_add"] + ops["aten.index_add_"] > 0  # the window held a fold
    return ops.total() / WINDOW


@pytest.mark.parametrize("path", list(PATHS))
def test_recording_on_meta_never_reads_the_device(path: str) -> None:
    # A read of a meta tensor raises, so completing these records (and the fold among
    # them) proves no .item()/.tolist()/.cpu() happened; ops > 0: the fold ran there
    assert ops_per_record(path) > 0


def test_budget_0d_record() -> None:
    assert ops_per_record("0-d") <= 0.1


def test_budget_masked_tensor_of_a_mean_spec() -> None:
    assert ops_per_record("masked mean") <= 1


def test_budget_masked_tensor_into_mean_max_min() -> None:
    assert ops_per_record("masked (mean, max, min)") <= 1


def test_budget_int_tensor_into_a_quantile_metric() -> None:
    assert ops_per_record("int tensor into a quantile") <= 1


def test_budget_weighted_and_nan_policies() -> None:
    for path in ("weighted, nan='error'", "nan='ignore', last", "across='mean'"):
        assert ops_per_record(path) <= 1, path


def test_a_0d_record_launches_nothing_between_folds() -> None:
    m = ms.Metrics(SPECS)
    x = _inputs()
    with meta_records():
        m.record("loss", x["scalar"])
        m.record("adv", x["tokens"], mask=x["mask"])
        with count_device_ops() as ops:
            for _ in range(100):
                m.record("loss", x["scalar"])
                m.record("adv", x["tokens"], mask=x["mask"])
    assert dict(ops) == {}


def test_a_0d_record_in_a_graph_costs_one_detach() -> None:
    p = torch.zeros((), device=META, requires_grad=True)
    loss = p * 2.0
    m = ms.Metrics()
    with meta_records():
        m.record("loss", loss)
        with count_device_ops() as ops:
            m.record("loss", loss)
    assert dict(ops) == {"aten.detach": 1}


def test_meta_tensors_are_refused_outside_meta_records() -> None:
    # A meta tensor holds no data: accepted, it would make compute() raise for every
    # metric. Refused at the record, naming the metric; what was recorded stays.
    m = ms.Metrics()
    m.record("a", 1.0)
    m.record("t", torch.ones(3))
    for value, kwargs in [
        (torch.ones((), device=META), {}),
        (torch.ones(4, device=META), {"mask": torch.ones(4, dtype=torch.bool, device=META)}),
        (torch.ones(4), {"weight": torch.ones(4, device=META)}),
        (torch.ones(4), {"mask": torch.ones(4, dtype=torch.bool, device=META)}),
    ]:
        with pytest.raises(TypeError, match=r"metric 'b'.*'meta' device"):
            m.record("b", value, **kwargs)
    m.record("empty", torch.ones(0, device=META))  # no samples: nothing to fold
    assert m.compute() == {"a": 1.0, "t": 1.0}
    with meta_records():
        m.record("c", torch.ones((), device=META))  # a lane on meta, opened inside the block
    with pytest.raises(TypeError, match=r"metric 'c'.*'meta' device"):
        m.record("c", torch.ones((), device=META))  # its later records outside: refused too


def test_pending_references_fold_when_their_elements_pass_the_bound() -> None:
    # the memory pending references hold is bounded: 2M referenced elements fold
    x = torch.zeros(1 << 19, device=META)  # a quarter of the bound
    m = ms.Metrics()
    with meta_records():
        m.record("e", x)
        with count_device_ops() as below:
            for _ in range(3):  # 2M elements pending: at the bound, not past it
                m.record("e", x)
        with count_device_ops() as past:
            m.record("e", x)
    assert dict(below) == {}
    assert past["aten.index_add"] > 0  # the fold ran


def test_a_device_that_cannot_hold_the_state_is_refused_naming_the_metric(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as on a device without float64 (mps): the error names the metric; nothing is lost
    from metricsync._record import _device

    def no_float64(self: Any, device: Any) -> None:
        raise TypeError("Cannot convert a tensor to float64 dtype on this device")

    m = ms.Metrics()
    m.record("a", 2.0)
    monkeypatch.setattr(_device.DeviceState, "__init__", no_float64)
    with meta_records(), pytest.raises(TypeError, match=r"metric 'b'.*cannot be accumulated"):
        m.record("b", torch.ones(3, device=META))
    assert m.compute() == {"a": 2.0}
