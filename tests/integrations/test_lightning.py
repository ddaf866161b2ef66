"""The Lightning callback and logger against a real Trainer on CPU, a tiny module.

Oracles: numpy over the raw samples the module keeps for what it records,
Lightning's own CSVLogger file for what reaches the trainer's loggers, and a
count of the collectives each step enters (against ``self.log(...,
sync_dist=True)``, one per key) on 2 gloo ranks under DDP.
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync.integrations.lightning import MetricsyncCallback, MetricsyncLogger  # noqa: E402
from metricsync.testing import run_distributed  # noqa: E402

from ._collect import Collect  # noqa: E402
from ._launch import as_launched  # noqa: E402

KEYS = 12  # per-step keys besides the two below

# The order a sync over several ranks computes: metrics by name, each one's keys in its spec's.
NAME_ORDER = [
    "abs_err/mean",
    "abs_err/max",
    "abs_err/p90",
    *(f"k/{k}" for k in sorted(str(k) for k in range(KEYS))),
    "samples",
]


class Tiny(pl.LightningModule):
    """A linear regression that records its errors, its batch sizes and KEYS more keys."""

    def __init__(self, sync_dist_keys: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.metrics = ms.Metrics(
            {
                "abs_err": ms.Spec(("mean", "max", "p90"), fmt=".4f"),
                "samples": ms.Spec("sum", fmt=",.0f"),
                "k/*": ms.Spec("max"),
            }
        )
        self.val_metrics = ms.Metrics({"val_abs_err": ms.Spec(("mean", "max"))})
        self.raw: dict[int, list[np.ndarray]] = {}
        self.val_raw: list[np.ndarray] = []
        self.sync_dist_keys = sync_dist_keys

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        err = self.layer(x).squeeze(-1) - y
        abs_err = err.detach().abs()
        self.metrics.record("abs_err", abs_err)
        self.metrics.record("samples", len(x))
        for k in range(KEYS):
            self.metrics.record(f"k/{k}", float(k + self.global_rank))
        step = self.trainer.global_step + 1
        self.raw.setdefault(step, []).append(abs_err.numpy().copy())
        for k in range(self.sync_dist_keys):  # what metricsync replaces: a collective per key
            self.log(f"plain/{k}", abs_err.mean(), sync_dist=True, on_step=True, on_epoch=False)
        return (err**2).mean()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        abs_err = (self.layer(x).squeeze(-1) - y).abs()
        self.val_metrics.record("val_abs_err", abs_err)
        if not self.trainer.sanity_checking:
            self.val_raw.append(abs_err.numpy().copy())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader(n: int = 24, batch: int = 4, seed: int = 0) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen)
    y = x.sum(-1) + 0.1 * torch.randn(n, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)


def _trainer(tmp: str, callbacks: list[object], **extra: object) -> pl.Trainer:
    options: dict[str, object] = {
        "default_root_dir": tmp,
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 4,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "log_every_n_steps": 1,
        "num_sanity_val_steps": 0,
    }
    options.update(extra)
    return pl.Trainer(callbacks=callbacks, **options)


def _check_window(values: dict[str, float], raw: np.ndarray) -> None:
    assert values["abs_err/mean"] == pytest.approx(raw.mean(), rel=1e-9)
    assert values["abs_err/max"] == raw.max()
    ordered = np.sort(raw)
    rank = 0.9 * (len(raw) - 1)
    low, high = ordered[int(np.floor(rank))], ordered[int(np.ceil(rank))]
    assert low / 1.01 <= values["abs_err/p90"] <= high * 1.01


def test_callback_syncs_and_logs_each_step_to_a_tracker(tmp_path: pytest.TempPathFactory) -> None:
    collect = Collect()
    module = Tiny()
    with ms.Tracker(collect, run_dir=tmp_path / "run") as tracker:
        callback = MetricsyncCallback(tracker=tracker)
        _trainer(str(tmp_path), [callback]).fit(module, _loader())
    assert collect.steps() == [1, 2, 3, 4]
    for step, values, formats in collect.rows:
        _check_window(values, np.concatenate(module.raw[step]).astype(np.float64))
        assert values["samples"] == 4.0 and values["k/11"] == 11.0
        assert formats["abs_err/mean"] == ".4f" and formats["samples"] == ",.0f"
    assert len(module.metrics) == 0  # reset after the last sync


def test_every_n_steps_accumulates_and_validation_is_logged(
    tmp_path: pytest.TempPathFactory,
) -> None:
    collect = Collect()
    module = Tiny()
    with ms.Tracker(collect, run_dir=tmp_path / "run") as tracker:
        callback = MetricsyncCallback(tracker=tracker, every_n_steps=2)
        trainer = _trainer(
            str(tmp_path), [callback], max_steps=5, val_check_interval=3, num_sanity_val_steps=1
        )
        trainer.fit(module, _loader(), _loader(n=8, seed=1))
    train_rows = [(s, v) for s, v, _ in collect.rows if "abs_err/mean" in v]
    val_rows = [(s, v) for s, v, _ in collect.rows if "val_abs_err/mean" in v]
    # Steps 2 and 4 by cadence, 5 at the end of training; each covers every step since the last.
    assert [s for s, _ in train_rows] == [2, 4, 5]
    windows = {2: (1, 2), 4: (3, 4), 5: (5,)}
    for step, values in train_rows:
        raw = np.concatenate([np.concatenate(module.raw[s]) for s in windows[step]])
        _check_window(values, raw.astype(np.float64))
        assert values["samples"] == 4.0 * len(windows[step])
    # One validation run (after step 3); the sanity check's samples were dropped.
    assert [s for s, _ in val_rows] == [3]
    val = np.concatenate(module.val_raw).astype(np.float64)
    assert val_rows[0][1]["val_abs_err/mean"] == pytest.approx(val.mean(), rel=1e-9)
    assert val_rows[0][1]["val_abs_err/max"] == val.max()


def test_without_tracker_the_trainers_loggers_get_the_values(
    tmp_path: pytest.TempPathFactory,
) -> None:
    module = Tiny()
    csv_logger = CSVLogger(str(tmp_path), name="csv", version=0)
    ms_logger = MetricsyncLogger(backends=("jsonl",), run_dir=str(tmp_path / "ms"))
    collect = Collect()
    ms_logger_with_tracker = MetricsyncLogger(ms.Tracker(collect, run_dir=tmp_path / "unused"))
    trainer = _trainer(
        str(tmp_path),
        [MetricsyncCallback()],
        logger=[csv_logger, ms_logger, ms_logger_with_tracker],
    )
    trainer.fit(module, _loader())
    # Lightning's own CSV file holds what the callback synced, at the steps Lightning gives
    # its loggers (its count of batches that stepped: one less than global_step)
    with open(os.path.join(csv_logger.log_dir, "metrics.csv")) as f:
        rows = [row for row in csv.DictReader(f) if row.get("abs_err/mean")]
    assert [int(row["step"]) for row in rows] == [0, 1, 2, 3]
    for row in rows:
        raw = np.concatenate(module.raw[int(row["step"]) + 1]).astype(np.float64)
        assert float(row["abs_err/mean"]) == pytest.approx(raw.mean(), rel=1e-6)
        assert float(row["samples"]) == 4.0
    # A MetricsyncLogger gets the Metrics whole: the specs' formats arrive with the values.
    synced = [(s, v, f) for s, v, f in collect.rows if "abs_err/mean" in v]
    assert [s for s, _, _ in synced] == [0, 1, 2, 3]
    assert all(f["abs_err/mean"] == ".4f" for _, _, f in synced)
    # The jsonl one made its own Tracker and closed it at the end of training.
    lines = [json.loads(line) for line in (tmp_path / "ms" / "metrics.jsonl").open()]
    steps = [line["step"] for line in lines if "abs_err/mean" in line.get("values", {})]
    assert steps == [0, 1, 2, 3]


def test_a_module_without_metrics_is_named_in_the_error(tmp_path: pytest.TempPathFactory) -> None:
    module = Tiny()
    module.metrics = {}  # type: ignore[assignment]
    with pytest.raises(AttributeError, match=r"Tiny\.metrics to be a metricsync\.Metrics"):
        _trainer(str(tmp_path), [MetricsyncCallback()]).fit(module, _loader())


def _ddp_rank(
    rank: int, world: int, tmp: str
) -> tuple[list, dict[int, list[float]], list[int], int]:
    """Lightning DDP on the gloo group run_distributed made (Lightning does not start processes)."""
    import torch.distributed as dist

    as_launched(rank, world, NODE_RANK="0")
    count = [0]
    original, original_gather = dist.all_reduce, dist.all_to_all_single  # a gloo sync's gather

    def counting(*args: object, **kwargs: object) -> object:
        count[0] += 1
        return original(*args, **kwargs)

    def counting_gather(*args: object, **kwargs: object) -> object:
        count[0] += 1
        return original_gather(*args, **kwargs)

    per_step: list[int] = []
    baseline: list[int] = []

    class Counting(MetricsyncCallback):
        def on_train_batch_start(self, *args: object) -> None:
            count[0] = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            baseline.append(count[0])  # what the step's self.log(sync_dist=True) calls cost
            count[0] = 0
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            per_step.append(count[0])

    dist.all_reduce, dist.all_to_all_single = counting, counting_gather
    try:
        collect = Collect()
        module = Tiny(sync_dist_keys=KEYS)
        tracker = ms.Tracker(collect, run_dir=os.path.join(tmp, "run"))
        trainer = _trainer(tmp, [Counting(tracker=tracker, timeout=60)], devices=2, strategy="ddp")
        trainer.fit(module, _loader(n=32, batch=4))
        tracker.close()
    finally:
        dist.all_reduce, dist.all_to_all_single = original, original_gather
    raw = {step: np.concatenate(parts).tolist() for step, parts in module.raw.items()}
    return collect.rows, raw, per_step, max(baseline)


@pytest.mark.distributed
def test_ddp_one_packed_sync_per_step(tmp_path: pytest.TempPathFactory) -> None:
    (rows, raw0, steps0, base0), (rows1, raw1, steps1, _) = run_distributed(
        _ddp_rank, 2, timeout=120, args=(str(tmp_path),)
    )
    assert rows1 == []  # only rank 0 writes
    assert [step for step, _, _ in rows] == [1, 2, 3, 4]
    for step, values, _ in rows:
        union = np.array(raw0[step] + raw1[step])  # both ranks' samples of that step
        _check_window(values, union)
        assert values["samples"] == 8.0
        assert values["k/3"] == 3.0 + 1.0  # max over ranks of k + rank
        assert list(values) == NAME_ORDER  # as on one rank (test_keys_are_logged_in_name_order...)
    # KEYS + 2 metrics synced in one gather per step after the first, which agrees on a layout (two
    # when a quantile metric's samples leave the sketch cells agreed so far); Lightning's
    # sync_dist=True costs one per key.
    for counts in (steps0, steps1):
        assert len(counts) == 4 and all(1 <= c <= 2 for c in counts[1:]) and counts[0] <= 5
    assert base0 >= KEYS


def test_the_logger_keeps_logging_in_a_stage_after_fit(tmp_path: pytest.TempPathFactory) -> None:
    module = Tiny()
    logger = MetricsyncLogger(backends=("jsonl",), run_dir=str(tmp_path / "ms"))
    trainer = _trainer(str(tmp_path), [MetricsyncCallback()], logger=logger)
    trainer.fit(module, _loader())
    # before: RuntimeError, Tracker.log() called after close() (fit's end closed it)
    trainer.validate(module, _loader(8), verbose=False)
    lines = [json.loads(line) for line in (tmp_path / "ms" / "metrics.jsonl").open()]
    keys = {key for line in lines for key in line.get("values", {})}
    assert "abs_err/mean" in keys and "val_abs_err/mean" in keys, sorted(keys)


class Logged(Tiny):
    """Tiny, also logging a value per step with ``self.log``."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.log("from_self_log", float(batch_idx))
        return super().training_step(batch, batch_idx)


def test_callback_rows_and_self_log_rows_share_the_loggers_steps(
    tmp_path: pytest.TempPathFactory,
) -> None:
    from metricsync._log._logread import read_timeline, scan

    logger = MetricsyncLogger(backends=("jsonl",), run_dir=str(tmp_path / "ms"))
    trainer = _trainer(str(tmp_path), [MetricsyncCallback()], logger=logger, log_every_n_steps=2)
    trainer.fit(Logged(), _loader())
    path = tmp_path / "ms" / "metrics.jsonl"
    rows = list(read_timeline(path, scan(path)))  # what show and plot read
    # before: the callback's rows at 2 and 4, self.log's at 1 and 3: the reader took each
    # lower step for a resumed run and kept the self.log rows only
    assert [step for step, _ in rows] == [1, 3]
    assert all("abs_err/mean" in values and "from_self_log" in values for _, values in rows)


def test_keys_are_logged_in_name_order_on_one_rank(tmp_path: pytest.TempPathFactory) -> None:
    collect = Collect()
    with ms.Tracker(collect, run_dir=tmp_path / "run") as tracker:
        callback = MetricsyncCallback(tracker=tracker)
        _trainer(str(tmp_path), [callback]).fit(Tiny(), _loader())
    # before: the order the module recorded in (abs_err, samples, k/0 ... k/11) on one rank,
    # name order on two (test_ddp_one_packed_sync_per_step checks that side)
    assert [list(values) for _, values, _ in collect.rows] == [NAME_ORDER] * 4
    assert list(callback.last_values) == NAME_ORDER


class LoggedBoth(Tiny):
    """Tiny, also logging with ``self.log`` in training and in validation."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.log("from_self_log", float(batch_idx))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_self_log", 1.0)
        super().validation_step(batch, batch_idx)


def _console_blocks(out: str) -> list[tuple[str, str]]:
    """(``step N``, the keys' text) of each step the console printed, with its wrapped lines."""
    blocks: list[tuple[str, str]] = []
    for line in out.splitlines():
        head, sep, rest = line.partition("|")
        if sep and head.startswith("step "):
            blocks.append((head.strip(), rest))
        elif sep and not head.strip() and blocks:  # a continuation line
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + rest)
    return blocks


def test_the_callbacks_keys_and_self_logs_share_one_console_line_per_log(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = MetricsyncLogger(backends="console", run_dir=str(tmp_path / "ms"))
    trainer = _trainer(
        str(tmp_path),
        [MetricsyncCallback()],
        logger=logger,
        val_check_interval=2,
        limit_val_batches=1,
    )
    trainer.fit(LoggedBoth(), _loader(n=16), _loader(n=8, seed=1))
    blocks = _console_blocks(capsys.readouterr().out)
    # before: each step printed twice, the callback's keys and self.log's on lines of their own
    assert [head for head, _ in blocks] == [
        "step 0",
        "step 1",
        "step 1",  # validation, after step 1's training line
        "step 2",
        "step 3",
        "step 3",
    ]
    for i, (_, keys) in enumerate(blocks):
        if i in (2, 5):
            assert "val_abs_err/mean" in keys and "val_self_log" in keys, keys
            assert "abs_err/mean" not in keys.replace("val_abs_err", "")
        else:
            assert "abs_err/mean" in keys and "from_self_log" in keys and "k/11" in keys, keys


class Prefixed(pl.LightningModule):
    """Names with ``train/`` and ``val/`` prefixes, recorded and ``self.log``-ged."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.metrics = ms.Metrics({"train/err": ms.Spec(("mean", "max"))})
        self.val_metrics = ms.Metrics({"val/err": ms.Spec("mean")})

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        err = self.layer(x).squeeze(-1) - y
        self.metrics.record("train/err", err.detach().abs())
        self.log("train/mse", (err**2).mean())
        return (err**2).mean()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.val_metrics.record("val/err", (self.layer(x).squeeze(-1) - y).abs())
        self.log("val/seen", 1.0)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


@pytest.mark.parametrize("tracker", [False, True], ids=["to-loggers", "to-tracker"])
def test_names_reach_lightnings_loggers_and_the_console_unprefixed(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], tracker: bool
) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    csv_logger = CSVLogger(str(tmp_path), name="csv", version=0)
    tb_logger = TensorBoardLogger(str(tmp_path), name="tb", version=0)
    console = ms.Tracker("console", run_dir=tmp_path / "ms") if tracker else None
    trainer = _trainer(
        str(tmp_path),
        [MetricsyncCallback(tracker=console)],
        logger=[csv_logger, tb_logger],
        val_check_interval=2,
        limit_val_batches=1,
    )
    trainer.fit(Prefixed(), _loader(n=16), _loader(n=8, seed=1))
    if console is not None:
        console.close()
    ours = {"train/err/mean", "train/err/max", "val/err"}
    lightnings = {"train/mse", "val/seen", "epoch"}
    expected = lightnings if tracker else ours | lightnings
    with open(os.path.join(csv_logger.log_dir, "metrics.csv")) as f:
        assert set(next(csv.reader(f))) - {"step"} == expected
    events = EventAccumulator(tb_logger.log_dir)
    events.Reload()
    assert set(events.Tags()["scalars"]) == expected
    blocks = _console_blocks(capsys.readouterr().out)
    if tracker:  # one line per log: 4 training steps, 2 validations
        assert [head for head, _ in blocks] == [f"step {s}" for s in (1, 2, 2, 3, 4, 4)]
        printed = {word for _, keys in blocks for word in keys.split() if "/" in word}
        assert printed == ours
    else:
        assert blocks == []
