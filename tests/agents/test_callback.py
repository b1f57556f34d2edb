"""End to end on tiny models: the chat template + tool-call path with real sampling (HF engine),
training steps on episodes, and turn-synchronous episodes on the vLLM engine."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import (
    AlgorithmSettings,
    GRPOLoss,
    GRPOModule,
    LossTerms,
    PromptDataModule,
    RewardSpec,
    SamplingConfig,
)
from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
from lightning_grpo.data.tasks import DigitTask
from tests.helpers.agents import CALL_TEXT, BatchCatcher, caller_model_dir, ids_of


@pytest.fixture(scope="module")
def caller_dir(tmp_path_factory):
    return caller_model_dir(tmp_path_factory)


def _callback(**kwargs):
    return AgentRolloutCallback(
        agent=AgentSettings(max_turns=3),
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=2),
        seed=1,
        rewards=[RewardSpec("env_reward"), RewardSpec("tool_call_made", weight=0.2)],
        **kwargs,
    )


def test_tool_path_end_to_end_with_training(caller_dir):
    catcher = BatchCatcher()
    callback = _callback()
    module = GRPOModule(
        model=caller_dir, loss=GRPOLoss(terms=LossTerms(llds_coef=0.1)), algorithm=AlgorithmSettings(num_iterations=2)
    )
    trainer = L.Trainer(
        max_steps=4,
        callbacks=[callback, catcher],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), tokenizer_path=caller_dir, batch_size=2))
    tok = trainer.datamodule.tokenizer
    im_end, call = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids(CALL_TEXT)
    assert {im_end, call, tok.convert_tokens_to_ids("</tool_call>")} <= set(callback.sampling.stop_token_ids)
    batch = catcher.batches[0]  # [8 episodes, ...]
    mask, turns = batch.completion_mask, batch.turn_ids  # [B, Lc]
    assert torch.equal(mask, (turns >= 0).float())
    assert (turns.max(-1).values >= 1).any()  # multi-turn episodes: the call, then an answer
    ids = batch.completion_ids  # [B, Lc]
    first_calls = ids[:, 0] == call
    assert first_calls.float().mean() > 0.5  # the taught model calls the tool ...
    for row in first_calls.nonzero().flatten().tolist():  # ... and the tool's answer follows the call
        text = tok.decode(ids[row][turns[row] == -1].tolist())
        assert text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n") or text == ""
    # old log-probs from one forward over the whole sequence match the engine's on sampled tokens
    gap = ((batch.old_logp - batch.rollout_logp).abs() * mask).max()
    assert gap < 1e-4
    assert batch.rollout_logp[mask == 0].abs().max() == 0
    logged = trainer.callback_metrics
    for key in (
        "train/agent/turns_mean",
        "train/agent/tool_call_rate",
        "train/agent/env_tokens",
        "train/agent/env_time",
    ):
        assert key in logged
    assert float(logged["train/agent/turns_mean"]) > 1.0


def test_validation_batches_draw_their_own_episodes(caller_dir):
    """Each held-out batch of one check gets its own seed: the secret digits differ between batches
    (one seed per check made every batch replay the same few secrets)."""
    callback = _callback()
    secrets, run = [], callback.run

    def recording_run(*args, **kwargs):
        rollout = run(*args, **kwargs)
        secrets.append([episode.env.secret for episode in rollout.episodes])
        return rollout

    callback.run = recording_run
    trainer = L.Trainer(
        callbacks=[callback],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=3,
    )
    trainer.validate(
        GRPOModule(model=caller_dir),
        datamodule=PromptDataModule(DigitTask(), tokenizer_path=caller_dir, batch_size=2, val_batch_size=10),
    )
    assert [len(s) for s in secrets] == [10, 10, 10]
    assert secrets[0] != secrets[1] and secrets[1] != secrets[2] and secrets[0] != secrets[2]


@pytest.mark.vllm
def test_vllm_engine_runs_turn_synchronous_episodes(vllm_engine, tiny_model_path):
    """Plain-text episodes on the session's vLLM engine: stop token ids end turns (kept as the last
    sampled token), and the engine's log-probs match the policy's over the whole trajectory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.agents.environment import Environment, Step
    from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
    from lightning_grpo.core.batch import RolloutBatch
    from lightning_grpo.models.weights import policy_weights_for_engine
    from lightning_grpo.rollout.base import rollout_to_tensors

    class Count(Environment):
        def step(self, turn):
            return Step(messages=" next=", done=turn.index == 2)

    tok, model = AutoTokenizer.from_pretrained(tiny_model_path), AutoModelForCausalLM.from_pretrained(tiny_model_path)
    vllm_engine.load_weights(policy_weights_for_engine(model))
    stops = ids_of(tok, " ") + ids_of(tok, "a")
    sampling = SamplingConfig(n=4, max_new_tokens=6, stop_token_ids=stops)
    records = [{"prompt_ids": ids_of(tok, "1234=")}, {"prompt_ids": ids_of(tok, "9876=")}]
    out = run_episodes(vllm_engine, Count, tok, None, records, sampling, seed=5, limits=EpisodeLimits(max_turns=3))
    assert len(out.completion_ids) == 8 and all(ep.turns == 3 for ep in out.episodes)
    for ids, turn_ids in zip(out.completion_ids, out.turn_ids):
        for t in range(3):
            turn = [i for i, k in zip(ids, turn_ids) if k == t]
            assert len(turn) == 6 or turn[-1] in stops or turn[-1] == tok.eos_token_id
            assert all(i not in stops for i in turn[:-1])
    tensors = rollout_to_tensors(out, tok.pad_token_id)
    batch = RolloutBatch(
        tensors.input_ids,
        tensors.attention_mask,
        tensors.completion_mask,
        torch.zeros(8),
        tensors.rollout_logprobs,
        tensors.input_ids.shape[1] - tensors.completion_mask.shape[1],
        4,
        1.0,
        turn_ids=tensors.turn_ids,
    )
    module = GRPOModule(model=model)
    module.configure_model()
    logp = module.token_logprobs(model, batch).logp  # [8, Lc]
    assert ((logp - batch.rollout_logp).abs() * batch.completion_mask).max() < 1e-4
