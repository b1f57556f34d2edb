"""Model-backed rewards in a training run (engine "hf"): an ``llm_judge`` (a local stub judge that
pays for short answers) drives learning, and a ``reward_model`` scores alongside; both are logged,
and the reward model's scores of each trained batch equal a direct forward of the classifier."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import GRPOModule, PromptDataModule, RewardSpec, RolloutCallback, SamplingConfig
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.models.tiny import save_tiny_reward_model
from tests.data.test_reward_models import chatml, direct
from tests.helpers.judge_stub import StubJudge, user_text
from tests.training.test_training import Recorder


class RewardModelProbe(L.Callback):
    """After the rollouts of ``steps``: the reward model's mean over the batch, recomputed by a
    direct forward of each row."""

    def __init__(self, path: str, steps: tuple[int, ...]):
        self.path, self.steps, self.gaps = path, steps, []

    def on_rollout_end(self, trainer, module, batch):
        if trainer.global_step not in self.steps:
            return
        tokenizer = trainer.datamodule.tokenizer
        prompts = tokenizer.batch_decode(batch.input_ids[:, : batch.prompt_length], skip_special_tokens=True)
        completions = tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)
        expected = direct(self.path, [chatml(p, c) for p, c in zip(prompts, completions)])[:, 0].mean().item()
        self.gaps.append(abs(module.rollout_metrics["reward/reward_model/mean"] - expected))


@pytest.mark.slow
def test_a_judge_reward_trains_and_both_model_rewards_are_logged(tiny_model_path, tmp_path):
    stub = StubJudge(lambda body: (200, f"Score: {8 - len(user_text(body).split('R:', 1)[1])}"))
    rm_path = str(save_tiny_reward_model(tmp_path / "rm"))
    try:
        rewards = [
            RewardSpec(
                "llm_judge",
                kwargs={
                    "base_url": stub.base_url,
                    "model": "judge",
                    "template": "Q:{prompt} R:{completion}",
                    "clamp": [0, 8],
                    "normalize": True,
                    "requests": {"max_concurrency": 8},
                },
            ),
            RewardSpec("reward_model", weight=0.0, kwargs={"model": rm_path, "batch_size": 16}),
        ]
        rollout = RolloutCallback(
            engine="hf", sampling=SamplingConfig(n=8, temperature=1.0, max_new_tokens=8), rewards=rewards, seed=0
        )
        probe, recorder = RewardModelProbe(rm_path, steps=(0, 5)), Recorder()
        from transformers import AutoModelForCausalLM

        module = GRPOModule(
            model=AutoModelForCausalLM.from_pretrained(tiny_model_path),
            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0),
        )
        L.seed_everything(0)
        trainer = L.Trainer(
            max_steps=6,
            log_every_n_steps=1,  # the Recorder reads every step's logged metrics
            callbacks=[rollout, probe, recorder],
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=8))
    finally:
        stub.close()
    judge = [step["train/reward/llm_judge/mean"] for step in recorder.steps]
    print("judge reward per step", [round(r, 3) for r in judge])
    assert judge[-1] > judge[0] + 0.3, judge  # shorter answers: the judge's reward rises
    assert len(stub.requests) == 6 * 64  # every completion of every step went to the judge once
    assert all(step["train/reward/llm_judge/judge_failures"] == 0.0 for step in recorder.steps)
    assert len(probe.gaps) == 2 and max(probe.gaps) < 1e-5, probe.gaps
    rm_means = [step["train/reward/reward_model/mean"] for step in recorder.steps]
    assert len(set(rm_means)) == 6, rm_means  # scored afresh each step
