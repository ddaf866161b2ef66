"""The transformers callback under TRL trainers (GRPO and SFT), a tiny GPT-2 and a word-level
tokenizer built in code: nothing comes from a hub.

Oracles: each trainer's own ``state.log_history`` (every key TRL logs from its
``defaultdict(list)`` of metrics must arrive unchanged), and TRL's own reward
statistics for what the user records from the reward function.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync.integrations.transformers import MetricsyncCallback  # noqa: E402

from ._collect import Collect  # noqa: E402

WORDS = 29


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(WORDS)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=WORDS + 3,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(config)


COMMON = {
    "logging_steps": 1,
    "report_to": "none",
    "save_strategy": "no",
    "use_cpu": True,
    "disable_tqdm": True,
    "learning_rate": 1e-3,
    "seed": 0,
}


def _logged(collect: Collect) -> dict[int, dict[str, float]]:
    return {step: values for step, values, _ in collect.rows if "learning_rate" in values}


def _check_every_trainer_key(trainer: object, collect: Collect, keys: set[str]) -> None:
    history = [h for h in trainer.state.log_history if "learning_rate" in h]  # type: ignore[attr-defined]
    logged = _logged(collect)
    assert sorted(logged) == [h["step"] for h in history]
    for entry in history:
        values = logged[entry["step"]]
        assert keys <= set(entry)  # the trainer did log what this test is about
        for key, value in entry.items():
            if key != "step":
                assert values[key] == value, key


def test_grpo_metrics_and_user_records_pass_through(tmp_path: pytest.TempPathFactory) -> None:
    collect = Collect()
    callback = MetricsyncCallback(
        ms.Metrics({"reward_words": ms.Spec(("mean", "max", "count"))}),
        tracker=ms.Tracker(collect, run_dir=tmp_path / "run"),
    )

    def reward_words(completions: list[str], **kwargs: object) -> list[float]:
        rewards = [float(len(text.split())) for text in completions]
        callback.metrics.record("reward_words", rewards)  # instead of a defaultdict(list)
        return rewards

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        **COMMON,
    )
    trainer = GRPOTrainer(
        model=_model(),
        reward_funcs=reward_words,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"w{i} w{i + 1}" for i in range(8)]}),
        processing_class=_tokenizer(),
        callbacks=[callback],
    )
    trainer.train()
    callback.tracker.close()  # type: ignore[union-attr]
    _check_every_trainer_key(
        trainer, collect, {"reward", "reward_std", "rewards/reward_words/mean", "entropy"}
    )
    for step, values in _logged(collect).items():
        # TRL's own mean of the same rewards is the oracle for what the user recorded.
        assert values["reward_words/mean"] == pytest.approx(
            values["rewards/reward_words/mean"], rel=1e-6
        ), step
        assert values["reward_words/count"] == 4.0  # one generation batch per step


def test_sft_metrics_pass_through(tmp_path: pytest.TempPathFactory) -> None:
    collect = Collect()
    callback = MetricsyncCallback(tracker=ms.Tracker(collect, run_dir=tmp_path / "run"))
    gen = torch.Generator().manual_seed(0)
    texts = [
        " ".join(f"w{int(i)}" for i in torch.randint(0, WORDS, (8,), generator=gen))
        for _ in range(12)
    ]
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=4,
        max_length=16,
        **COMMON,
    )
    trainer = SFTTrainer(
        model=_model(),
        args=args,
        train_dataset=Dataset.from_dict({"text": texts}),
        processing_class=_tokenizer(),
        callbacks=[callback],
    )
    trainer.train()
    _check_every_trainer_key(trainer, collect, {"mean_token_accuracy", "entropy", "num_tokens"})
