"""The transformers callback against a real Trainer: a 2-layer GPT-2 built in code, trained on CPU.

Oracles: the trainer's own ``state.log_history`` for what it logs, numpy over
the raw samples the test keeps for what the user records, and TensorBoard's
own reader for what the trainer's ``report_to`` wrote.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

import metricsync as ms  # noqa: E402
from metricsync.integrations.transformers import MetricsyncCallback  # noqa: E402
from metricsync.testing import run_distributed  # noqa: E402

from ._collect import Collect  # noqa: E402
from ._launch import as_launched  # noqa: E402

SEQ = 8
SPECS = {
    "tokens": ms.Spec("sum", fmt=",.0f"),
    "logit_abs": ms.Spec(("mean", "max", "p50")),
    "learning_rate": ms.Spec("last", fmt=".2e"),
}


class _Data(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int = 16, vocab: int = 32) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, SEQ), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=32,
        n_positions=SEQ,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=1,
    )
    return GPT2LMHeadModel(config)


class _RecordingTrainer(Trainer):  # type: ignore[misc]
    """Records into the callback's Metrics from compute_loss, keeping the raw samples by step."""

    def __init__(self, *args: object, callback: MetricsyncCallback, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.ms_callback = callback
        self.raw: dict[int, list[np.ndarray]] = {}
        self.tokens: dict[int, int] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        step = self.state.global_step + 1  # the optimizer step this batch belongs to
        logits = outputs.logits.detach().abs().flatten()
        self.ms_callback.metrics.record("tokens", inputs["input_ids"].numel())
        self.ms_callback.metrics.record("logit_abs", logits)  # a tensor: stays a tensor
        self.raw.setdefault(step, []).append(logits.numpy().copy())
        self.tokens[step] = self.tokens.get(step, 0) + inputs["input_ids"].numel()
        return (loss, outputs) if return_outputs else loss


def _args(out: str, **extra: object) -> TrainingArguments:
    options: dict[str, object] = {
        "output_dir": out,
        "max_steps": 4,
        "logging_steps": 1,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-3,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
    }
    options.update(extra)
    return TrainingArguments(**options)


def test_trainer_logs_and_user_records_reach_the_tracker(tmp_path: pytest.TempPathFactory) -> None:
    collect = Collect()
    with ms.Tracker(("jsonl", collect), run_dir=tmp_path / "run") as tracker:
        callback = MetricsyncCallback(ms.Metrics(SPECS), tracker=tracker)
        trainer = _RecordingTrainer(
            model=_tiny_gpt2(),
            args=_args(str(tmp_path / "out")),
            train_dataset=_Data(),
            callbacks=[callback],
            callback=callback,
        )
        trainer.train()
    assert collect.closed
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    rows = {step: (values, formats) for step, values, formats in collect.rows if "loss" in values}
    assert sorted(rows) == [1, 2, 3, 4]
    for entry in history:
        values, formats = rows[entry["step"]]
        # What the trainer logged passes through unchanged (its spec is "last": no rounding).
        assert values["loss"] == entry["loss"]
        assert values["learning_rate"] == entry["learning_rate"]
        assert values["grad_norm"] == pytest.approx(entry["grad_norm"], rel=1e-6)
        # What the user recorded: numpy over the raw samples of that step.
        raw = np.concatenate(trainer.raw[entry["step"]]).astype(np.float64)
        assert values["tokens"] == trainer.tokens[entry["step"]] == 2 * SEQ
        assert values["logit_abs/mean"] == pytest.approx(raw.mean(), rel=1e-9)
        assert values["logit_abs/max"] == raw.max()
        ordered = np.sort(raw)  # p50 lies within 1% of the order statistics around the median
        low, high = ordered[(len(raw) - 1) // 2], ordered[len(raw) // 2]
        assert low / 1.01 <= values["logit_abs/p50"] <= high * 1.01
        assert formats["tokens"] == ",.0f" and formats["learning_rate"] == ".2e"
    # The end-of-training summary is logged too, with nothing recorded since the last step.
    summary = [values for _, values, _ in collect.rows if "train_runtime" in values]
    assert len(summary) == 1 and "tokens" not in summary[0]
    assert collect.steps()[-1] == 4


def test_attached_callback_feeds_the_trainers_own_reporting(
    tmp_path: pytest.TempPathFactory,
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Probe(TrainerCallback):  # type: ignore[misc]  # a plain callback, added after ours
        def __init__(self) -> None:
            self.seen: list[dict[str, float]] = []

        def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
            self.seen.append(dict(logs or {}))

    probe = Probe()
    callback = MetricsyncCallback(ms.Metrics(SPECS))
    out = str(tmp_path / "out")
    trainer = _RecordingTrainer(
        model=_tiny_gpt2(),
        args=_args(out, report_to="tensorboard"),
        train_dataset=_Data(),
        callbacks=[probe],
        callback=callback,
    )
    callback.attach(trainer)
    trainer.train()
    trained = [logs for logs in probe.seen if "loss" in logs]
    assert [logs["tokens"] for logs in trained] == [2.0 * SEQ] * 4
    # The trainer's TensorBoard integration wrote what the user recorded (train/ prefix is HF's).
    (run,) = glob.glob(os.path.join(out, "runs", "*"))
    events = EventAccumulator(run)
    events.Reload()
    tokens = [(e.step, e.value) for e in events.Scalars("train/tokens")]
    assert tokens == [(1, 16.0), (2, 16.0), (3, 16.0), (4, 16.0)]
    maxima = [e.value for e in events.Scalars("train/logit_abs/max")]
    expected = [np.concatenate(trainer.raw[s]).max() for s in (1, 2, 3, 4)]
    np.testing.assert_allclose(maxima, expected, rtol=1e-6)  # TensorBoard stores float32
    # One train/ prefix, HF's own, on every name the trainer's TensorBoard wrote.
    assert not [tag for tag in events.Tags()["scalars"] if tag.startswith("train/train/")]


def test_non_numbers_stay_in_logs_and_declared_specs_win() -> None:
    callback = MetricsyncCallback(ms.Metrics({"loss": ms.Spec(("mean", "max"))}))
    logs = {"loss": 0.5, "note": "warmup", "flag": True, "epoch": 1}
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    assert logs["note"] == "warmup" and logs["flag"] is True
    assert logs["loss/mean"] == 0.5 and logs["loss/max"] == 0.5 and logs["epoch"] == 1
    assert callback.last_values == {"loss/mean": 0.5, "loss/max": 0.5, "epoch": 1.0}


class _CountingCallback(MetricsyncCallback):
    """Counts the collectives each on_log enters (all of them go through torch.distributed)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.collectives: list[int] = []

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        import torch.distributed as dist

        names = (
            "all_reduce",
            "all_gather",
            "all_gather_into_tensor",
            "all_gather_single",
            "all_to_all_single",
            "broadcast",
            "barrier",
        )
        originals = {name: getattr(dist, name) for name in names}
        count = [0]

        def counting(original):  # type: ignore[no-untyped-def]
            def call(*a, **k):  # type: ignore[no-untyped-def]
                count[0] += 1
                return original(*a, **k)

            return call

        for name, original in originals.items():
            setattr(dist, name, counting(original))
        try:
            return super().on_log(args, state, control, logs=logs, **kwargs)
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)
            self.collectives.append(count[0])


class _ManyKeysTrainer(_RecordingTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        for k in range(40):  # many keys, still one packed sync per log
            self.ms_callback.metrics.record(f"k/{k}", float(k))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def _ddp_rank(rank: int, world: int, out: str) -> tuple[list, dict[int, list[float]], list[int]]:
    """A real Trainer on 2 gloo ranks (the process group run_distributed made is the trainer's)."""
    as_launched(rank, world, LOCAL_WORLD_SIZE=str(world))
    collect = Collect()
    tracker = ms.Tracker(collect, run_dir=os.path.join(out, "run"))
    callback = _CountingCallback(ms.Metrics({**SPECS, "k/*": ms.Spec("sum")}), tracker, timeout=60)
    trainer = _ManyKeysTrainer(
        model=_tiny_gpt2(),
        args=_args(os.path.join(out, f"out{rank}"), ddp_find_unused_parameters=False),
        train_dataset=_Data(),
        callbacks=[callback],
        callback=callback,
    )
    assert trainer.args.world_size == world
    trainer.train()
    tracker.close()
    raw = {step: np.concatenate(parts).tolist() for step, parts in trainer.raw.items()}
    return collect.rows, raw, callback.collectives


@pytest.mark.distributed
def test_ddp_trainer_syncs_once_per_log_and_rank0_writes(tmp_path: pytest.TempPathFactory) -> None:
    (rows, raw0, counts0), (rows1, raw1, counts1) = run_distributed(
        _ddp_rank, 2, timeout=120, args=(str(tmp_path),)
    )
    assert rows1 == []  # only rank 0 writes
    trained = [(step, values) for step, values, _ in rows if "loss" in values]
    assert [step for step, _ in trained] == [1, 2, 3, 4]
    for step, values in trained:
        union = np.array(raw0[step] + raw1[step])  # both ranks' samples of that step
        assert values["tokens"] == 2 * 2 * SEQ
        assert values["logit_abs/max"] == union.max()
        assert values["logit_abs/mean"] == pytest.approx(union.mean(), rel=1e-9)
        assert values["k/39"] == 2 * 39.0  # one record per rank per step
    # 46 keys: every log after the first costs one gather (two when a quantile metric's
    # samples leave the sketch cells agreed so far; the first agrees on a layout)
    for counts in (counts0, counts1):
        assert len(counts) == 5 and all(1 <= c <= 2 for c in counts[1:4]) and counts[0] <= 6


def _per_rank_logs(rank: int, world: int) -> dict[str, float]:
    """Each rank's Trainer logs its own clock's speed metrics; rank 1 records last."""
    import time

    import torch.distributed as dist

    callback = MetricsyncCallback(update_logs=True)
    logs = {
        "eval_loss": 3.0,
        "eval_runtime": [0.50, 0.25][rank],
        "eval_samples_per_second": [8.0, 16.0][rank],
    }
    dist.barrier()
    if rank == 1:
        time.sleep(0.2)
    callback.on_log(None, TrainerState(global_step=4), TrainerControl(), logs=logs)
    return logs


def test_numbers_that_differ_by_rank_are_rank_zeros() -> None:
    # before: the value of whichever rank recorded last (here rank 1's 0.25 and 16.0)
    for logs in run_distributed(_per_rank_logs, 2):
        assert logs == {"eval_loss": 3.0, "eval_runtime": 0.5, "eval_samples_per_second": 8.0}


def test_a_fraction_in_the_logs_is_logged_as_a_float() -> None:
    from fractions import Fraction

    callback = MetricsyncCallback(ms.Metrics({"tokens": ms.Spec("sum")}), update_logs=True)
    callback.metrics.record("tokens", 10)
    logs = {"loss": 0.5, "ratio": Fraction(1, 4)}
    # before: TypeError from record(), and "tokens" stayed to be logged again next step
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    assert logs == {"loss": 0.5, "ratio": 0.25, "tokens": 10.0}
    assert callback.metrics.names == []


def test_an_int_beyond_float64_in_the_logs_is_left_out() -> None:
    callback = MetricsyncCallback(ms.Metrics({"tokens": ms.Spec("sum")}), update_logs=True)
    callback.metrics.record("tokens", 10)
    logs = {"loss": 0.5, "huge": 10**400}
    # before: ValueError from record(), and "loss" and "tokens" stayed to be logged again
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    assert logs == {"loss": 0.5, "huge": 10**400, "tokens": 10.0}
    assert callback.metrics.names == []


@pytest.mark.parametrize("disable_tqdm", [False, True])  # ProgressCallback / PrinterCallback
def test_an_attached_callback_with_a_console_tracker_prints_each_log_once(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], disable_tqdm: bool
) -> None:
    with ms.Tracker("console", run_dir=tmp_path / "run") as tracker:
        callback = MetricsyncCallback(ms.Metrics(SPECS), tracker=tracker)
        trainer = _RecordingTrainer(
            model=_tiny_gpt2(),
            args=_args(str(tmp_path / "out"), logging_steps=2, disable_tqdm=disable_tqdm),
            train_dataset=_Data(),
            callback=callback,
        )
        callback.attach(trainer)
        trainer.train()
    out = capsys.readouterr().out
    # before: the trainer printed every log a second time, as a dict ("{'loss': ...")
    assert "{'loss'" not in out and "'train_runtime'" not in out
    assert [line.split("|")[0].strip() for line in out.splitlines() if "| loss" in line] == [
        "step 2",
        "step 4",
    ]


def test_a_console_tracker_without_attach_warns_once_of_the_double_print(
    tmp_path: pytest.TempPathFactory,
) -> None:
    with ms.Tracker("console", run_dir=tmp_path / "run") as tracker:
        callback = MetricsyncCallback(tracker=tracker)
        with pytest.warns(UserWarning, match="attach"):
            callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs={"loss": 1})
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            callback.on_log(None, TrainerState(global_step=2), TrainerControl(), logs={"loss": 2})


def _logged_key_order(rank: int, world: int) -> list[str]:
    callback = MetricsyncCallback(ms.Metrics({"reward": ms.Spec(("mean", "max"))}))
    for name in ("zeta", "reward", "alpha"):  # recorded out of name order
        callback.metrics.record(name, float(rank))
    logs = {"loss": 0.5, "learning_rate": 1e-3, "epoch": 1.0}
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    return list(callback.last_values)


def test_logged_keys_come_in_the_same_order_on_one_rank_and_on_two() -> None:
    expected = ["loss", "learning_rate", "epoch", "alpha", "reward/mean", "reward/max", "zeta"]
    # before: insertion order on one rank, name order on two
    assert _logged_key_order(0, 1) == expected
    assert run_distributed(_logged_key_order, 2) == [expected, expected]


class _HistogramBackend:
    def __init__(self) -> None:
        self.histograms: list[list[str]] = []

    def log(self, values, step, formats):  # type: ignore[no-untyped-def]
        pass

    def log_histograms(self, histograms, step):  # type: ignore[no-untyped-def]
        self.histograms.append(sorted(histograms))

    def close(self) -> None:
        pass


def test_the_callback_hands_the_tracker_its_histograms(tmp_path: pytest.TempPathFactory) -> None:
    backend = _HistogramBackend()
    metrics = ms.Metrics({"reward": ms.Spec(("mean", "p50"))})
    tracker = ms.Tracker((backend,), run_dir=tmp_path, histograms=True)
    callback = MetricsyncCallback(metrics, tracker)
    metrics.record("reward", [1.0, 2.0, 3.0])
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs={"loss": 1.0})
    tracker.close()
    assert backend.histograms == [["reward"]]
