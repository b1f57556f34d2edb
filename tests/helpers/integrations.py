"""Train a callback for a few steps on the tiny model and record what the trainer scored."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning as L
from lightning.pytorch.loggers import Logger

from lightning_grpo import AgentRolloutCallback, AgentSettings, GRPOModule, PromptDataModule, SamplingConfig
from lightning_grpo.data.tasks import DigitTask


class MemoryLogger(Logger):
    """Keeps every logged metrics dict with its step."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def series(self, key: str) -> list[float]:
        """The values logged under ``key``, in step order."""
        return [m[key] for _, m in self.rows if key in m]


@dataclass
class Scored:
    """One call of the reward set: the completions, their columns and the ``[B, R]`` rewards it returned."""

    completions: list[str]
    columns: dict[str, Any]
    rewards: Any  # RewardScores


@dataclass
class Recorder:
    """Wraps a callback's reward set (and ``run``, for episodes) to keep every scored batch."""

    scored: list[Scored] = field(default_factory=list)
    rollouts: list[Any] = field(default_factory=list)

    def attach(self, callback: Any) -> None:
        score = callback.reward_set.score

        def recording_score(completions, columns=None):
            out = score(completions, columns)
            self.scored.append(Scored(list(completions), dict(columns or {}), out))
            return out

        callback.reward_set.score = recording_score
        run = getattr(callback, "run", None)
        if run is not None:

            def recording_run(*args, **kwargs):
                self.rollouts.append(run(*args, **kwargs))
                return self.rollouts[-1]

            callback.run = recording_run


def fit(callback: Any, steps: int, model: str | None = None, datamodule: Any = None) -> tuple[MemoryLogger, Recorder]:
    """``steps`` optimizer steps of GRPO with ``callback`` (CPU, every step logged in memory, no
    checkpoints / validation); the logger and what the reward set scored."""
    recorder, logger = Recorder(), MemoryLogger()
    recorder.attach(callback)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[callback],
        accelerator="cpu",
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    module = GRPOModule(model=model) if model else GRPOModule(model="tiny:chars")
    trainer.fit(module, datamodule=datamodule or PromptDataModule(DigitTask(), tokenizer_path=model, batch_size=2))
    assert trainer.global_step == steps
    return logger, recorder


def turn_texts(tokenizer: Any, episode: Any) -> list[str]:
    """Each model turn of an episode, decoded from its sampled ids without special tokens."""
    turns = [[i for i, t in zip(episode.ids, episode.turn_ids) if t == k] for k in range(episode.turns)]
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in turns]


def openenv_callback(max_turns: int = 3, **environment_args: Any) -> AgentRolloutCallback:
    """The in-process OpenEnv adapter on the HF engine: 4 episodes per record, 3 tokens a turn."""
    return AgentRolloutCallback(
        agent=AgentSettings(
            environment="lightning_grpo.integrations.openenv.OpenEnvEnvironment",
            environment_args=environment_args,
            max_turns=max_turns,
        ),
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        seed=0,
    )
