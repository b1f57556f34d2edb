"""On-policy distillation in GRPOModule: teachers (path, module, several, LoRA base / adapter),
the token advantage, packing and dtype, GKD, the checks made before training, multi-turn episodes
and the asynchronous pipeline. That a student learns from a teacher: tests/e2e/test_recipes_learn.py
(test_recipe_learns[distill_quickstart])."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch

from lightning_grpo import (
    DistillSettings,
    ForwardSettings,
    GRPOLoss,
    GRPOModule,
    OffPolicySettings,
    PolicySettings,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
)
from lightning_grpo.core import LOGPROBS
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.training.packing import padded_token_logprobs
from tests.helpers.agents import BatchCatcher

from .test_module import _policy, _rollout_batch, _ticks

REWARDS = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0], [1.0], [0.0], [0.0]])


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _perturbed(policy, seed=1, scale=0.5):
    teacher = copy.deepcopy(policy)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g) * p.abs().mean())
    return teacher


def _direct_logp(model, batch):
    with torch.no_grad():
        return padded_token_logprobs(
            model, batch, score=LOGPROBS.variant("logits"), compute_entropy=False, chunk_size=1024
        ).logp


def _module(path, distillation, packing="auto", policy=None):
    forward = ForwardSettings(packing=packing, rows_per_pass=3)  # no-grad passes of 3 rows: a group split across passes
    module = GRPOModule(
        model=_policy(path),
        policy=policy or PolicySettings(),
        forward=forward,
        distillation=distillation,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
    )
    module.configure_model()
    module.distiller.build(_tokenizer(path))
    return module


def _prepared(module, records=None, rewards=REWARDS):
    batch = _rollout_batch(module.policy.config.vocab_size)
    batch.rollout_logp = _direct_logp(module.policy, batch) * batch.completion_mask  # the student sampled them
    module.use_rollout(module.prepare_rollout_batch(batch, rewards, torch.ones(1), records=records))
    return module.rollout_batch


# ------------------------------------------------------------------------------ advantages
def test_pure_distillation_advantage_is_the_negative_reverse_kl(tiny_model_path):
    teacher = _perturbed(_policy(tiny_model_path))
    module = _module(tiny_model_path, DistillSettings(teacher=teacher))
    batch = _prepared(module)
    expected_teacher = _direct_logp(teacher, batch) * batch.completion_mask
    torch.testing.assert_close(batch.teacher_logp * batch.completion_mask, expected_teacher, atol=1e-5, rtol=0)
    k = (batch.rollout_logp - batch.teacher_logp) * batch.completion_mask
    assert batch.advantages.shape == batch.completion_mask.shape and k.abs().max() > 0.1
    torch.testing.assert_close(batch.advantages, -k, atol=1e-6, rtol=0)
    # no reward reaches the student: other rewards, the same advantages
    again = _prepared(_module(tiny_model_path, DistillSettings(teacher=teacher)), rewards=1.0 - REWARDS)
    torch.testing.assert_close(again.advantages, batch.advantages, atol=0, rtol=0)


def test_mixed_distillation_adds_the_reward_advantage(tiny_model_path):
    teacher = _perturbed(_policy(tiny_model_path))
    module = _module(tiny_model_path, DistillSettings(teacher=teacher, coef=0.5, use_task_rewards=True))
    batch = _prepared(module)
    grpo = module.compute_advantages(REWARDS, torch.ones(1), 4)  # [B]
    expected = (grpo[:, None] - 0.5 * (batch.rollout_logp - batch.teacher_logp)) * batch.completion_mask
    torch.testing.assert_close(batch.advantages, expected, atol=1e-6, rtol=0)


def test_teacher_forward_is_packed_like_the_reference_and_gets_no_gradient(tiny_model_path):
    teacher = _perturbed(_policy(tiny_model_path))
    packed = _prepared(_module(tiny_model_path, DistillSettings(teacher=teacher), packing="on")).teacher_logp
    padded = _prepared(_module(tiny_model_path, DistillSettings(teacher=teacher), packing="off")).teacher_logp
    mask = _rollout_batch(64).completion_mask
    torch.testing.assert_close(packed * mask, padded * mask, atol=2e-5, rtol=0)
    module = _module(tiny_model_path, DistillSettings(teacher=teacher))
    _prepared(module)
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    trainer.fit(module, train_dataloaders=_ticks(1))
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not any(k.startswith("teacher") for k in module.state_dict())  # not saved in checkpoints
    assert "train/distill_reverse_kl" in trainer.callback_metrics


def test_teacher_from_a_path_in_another_dtype(tiny_model_path, digit_teacher_path):
    fp32 = _prepared(_module(tiny_model_path, DistillSettings(teacher=str(digit_teacher_path)))).teacher_logp
    module = _module(tiny_model_path, DistillSettings(teacher=str(digit_teacher_path), dtype="bfloat16"))
    assert next(module.distiller._models["default"].parameters()).dtype == torch.bfloat16
    bf16 = _prepared(module).teacher_logp
    mask = module.rollout_batch.completion_mask
    assert bf16.dtype == torch.float32
    gap = ((bf16 - fp32).abs() * mask).max().item()
    assert 0 < gap < 0.3  # bf16 rounding, nothing more


def test_several_teachers_chosen_per_record(tiny_model_path):
    policy = _policy(tiny_model_path)
    a, b = _perturbed(policy, seed=1), _perturbed(policy, seed=2)
    module = _module(tiny_model_path, DistillSettings(teacher={"math": a, "code": b}, teacher_key="task"))
    batch = _prepared(module, records=[{"task": "code"}, {"task": "math"}])  # group 0 -> b, group 1 -> a
    expected = torch.cat([_direct_logp(b, batch)[:4], _direct_logp(a, batch)[4:]]) * batch.completion_mask
    torch.testing.assert_close(batch.teacher_logp * batch.completion_mask, expected, atol=1e-5, rtol=0)
    with pytest.raises(
        ValueError,
        match=r"model.distillation.teacher_key 'task': a record has 'poetry'; the teachers are \['math', 'code'\]",
    ):
        _prepared(module, records=[{"task": "poetry"}, {"task": "math"}])
    with pytest.raises(ValueError, match=r"several teachers need the batch's records"):
        _prepared(module, records=None)
    with pytest.raises(
        ValueError, match=r"teacher_key 'task': a record has None"
    ):  # the training records, before training
        module.distiller.build(None, records=[{"task": "math"}, {"prompt": "no task column"}])


def test_lora_teacher_is_the_base_or_another_adapter(tiny_model_path, tmp_path):
    from peft import get_peft_model

    from lightning_grpo import LoraSettings, PolicySettings

    lora = LoraSettings(r=4, alpha=8, init_lora_weights=False)
    other = get_peft_model(_policy(tiny_model_path), lora.to_peft())  # a second, different adapter
    other.save_pretrained(tmp_path / "adapter")
    base = _module(tiny_model_path, DistillSettings(teacher="base"), policy=PolicySettings(lora=lora))
    batch = _prepared(base)
    with base.policy.disable_adapter():
        expected = _direct_logp(base.policy, batch)
    torch.testing.assert_close(
        batch.teacher_logp * batch.completion_mask, expected * batch.completion_mask, atol=1e-5, rtol=0
    )
    module = _module(
        tiny_model_path, DistillSettings(teacher=f"adapter:{tmp_path / 'adapter'}"), policy=PolicySettings(lora=lora)
    )
    trainable = {n for n, p in module.policy.named_parameters() if p.requires_grad}
    batch = _prepared(module)
    torch.testing.assert_close(
        batch.teacher_logp * batch.completion_mask,
        _direct_logp(other, batch) * batch.completion_mask,
        atol=1e-5,
        rtol=0,
    )
    assert module.policy.active_adapter == "default"  # the student's adapter is back, and only it trains
    assert {n for n, p in module.policy.named_parameters() if p.requires_grad} == trainable
    assert not any("teacher" in n for n in trainable)


# --------------------------------------------------------------------------------------- GKD
def test_gkd_term_is_the_token_mean_of_the_generalised_jsd(tiny_model_path):
    from lightning_grpo.core.distill import generalized_jsd
    from lightning_grpo.training.packing import padded_completion_logits

    teacher = _perturbed(_policy(tiny_model_path))
    module = _module(tiny_model_path, DistillSettings(teacher=teacher, coef=0.0, gkd_coef=2.0, beta=0.3))
    batch = _prepared(module)
    assert (batch.advantages == 0).all()  # coef 0: only GKD trains

    class Capture(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, b, i):
            self.loss = outputs["loss"].detach()

    capture = Capture()
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        callbacks=[capture],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with torch.no_grad():
        jsd = generalized_jsd(
            padded_completion_logits(module.policy, batch),
            padded_completion_logits(teacher, batch),
            0.3,
            batch.temperature,
        )
    expected = 2.0 * (jsd * batch.completion_mask).sum() / batch.completion_mask.sum()
    trainer.fit(module, train_dataloaders=_ticks(1))
    assert capture.loss.item() == pytest.approx(expected.item(), abs=1e-5)  # the policy loss is 0 with A = 0
    assert float(trainer.callback_metrics["train/gkd_jsd"]) == pytest.approx(
        (jsd * batch.completion_mask).sum().item() / batch.completion_mask.sum().item(), abs=1e-5
    )


def test_gkd_off_policy_batches_use_the_reference_answers(tiny_model_path):
    teacher = _perturbed(_policy(tiny_model_path))
    module = _module(tiny_model_path, DistillSettings(teacher=teacher, gkd_coef=1.0, lmbda=0.0))
    module.trainer = L.Trainer(accelerator="cpu", logger=False)  # the tokenizer comes from the data module
    dm = PromptDataModule(DigitTask(), tokenizer_path=str(tiny_model_path), batch_size=2)
    dm.setup("fit")
    module.trainer.datamodule = dm
    records = dm.train_records[:2]
    _prepared(module, records=records)
    gkd = module.distiller._gkd
    tok = dm.tokenizer
    assert len(gkd) == 2 and gkd.group_size == 1
    for row, record in enumerate(records):
        completion = gkd.completion_ids[row][gkd.completion_mask[row] > 0].tolist()
        assert completion == tok(record["answer"], add_special_tokens=False).input_ids + [tok.eos_token_id]


# ---------------------------------------------------------------------------- bad input
def test_settings_are_checked():
    with pytest.raises(ValueError, match=r"model.distillation.teacher is required"):
        DistillSettings()
    with pytest.raises(ValueError, match=r"model.distillation.teacher_key must name the record column"):
        DistillSettings(teacher={"a": "x", "b": "y"})
    with pytest.raises(ValueError, match=r"model.distillation.lmbda out of range: 1.5"):
        DistillSettings(teacher="x", lmbda=1.5)
    with pytest.raises(ValueError, match=r"coef = gkd_coef = 0 without use_task_rewards leaves nothing to learn"):
        DistillSettings(teacher="x", coef=0.0)


def test_teacher_with_another_tokenizer_fails_before_training(tiny_model_path):
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

    tools = str(tiny_model_dir(TinyModelConfig(tokenizer="tools"), cache_dir=tiny_model_path.parent))
    module = GRPOModule(model=_policy(tiny_model_path), distillation=DistillSettings(teacher=tools))
    module.configure_model()
    with pytest.raises(
        ValueError, match=r"model.distillation.teacher .* has another tokenizer than the student's \(\d+ tokens differ"
    ):
        module.distiller.build(_tokenizer(tiny_model_path))
    small = _policy(tiny_model_path)
    small.resize_token_embeddings(10)
    module = GRPOModule(model=_policy(tiny_model_path), distillation=DistillSettings(teacher=small))
    module.configure_model()
    with pytest.raises(
        ValueError, match=r"model.distillation.teacher: its LM head has 10 rows but the tokenizer has \d+ tokens"
    ):
        module.distiller.build(_tokenizer(tiny_model_path))
    missing = str(tiny_model_path.parent / "no_such_teacher")
    with pytest.raises(ValueError, match=r"teacher\['default'\] '.*no_such_teacher': no model directory there"):
        GRPOModule(model=_policy(tiny_model_path), distillation=DistillSettings(teacher=missing)).configure_model()
    with pytest.raises(ValueError, match=r"teacher\['default'\] = 'base' needs a LoRA policy"):
        GRPOModule(model=_policy(tiny_model_path), distillation=DistillSettings(teacher="base")).configure_model()


def test_multi_turn_episodes_distil_on_model_tokens_only(tiny_model_path):
    """Episodes of the secret-digit environment: the teacher scores whole episodes, but only the
    tokens the model sampled get an advantage (environment tokens are outside the completion mask)."""
    from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

    path = str(tiny_model_dir(TinyModelConfig(tokenizer="tools"), cache_dir=tiny_model_path.parent))
    teacher = _perturbed(_policy(path))
    catcher = BatchCatcher()
    callback = AgentRolloutCallback(
        agent=AgentSettings(max_turns=3), engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=2), seed=1
    )
    module = GRPOModule(model=path, distillation=DistillSettings(teacher=teacher))
    trainer = L.Trainer(
        max_steps=2,
        callbacks=[callback, catcher],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), tokenizer_path=path, batch_size=2))
    batch = catcher.batches[0]
    assert trainer.global_step == 2 and batch.turn_ids is not None
    outside = batch.completion_mask == 0  # padding and the environment's tokens
    assert (batch.advantages[outside] == 0).all() and (batch.advantages[~outside] != 0).any()
    assert torch.equal(batch.completion_mask, (batch.turn_ids >= 0).float())


@pytest.mark.vllm
def test_distillation_under_the_asynchronous_pipeline(tiny_model_path, digit_teacher_path, vllm_server):
    """max_staleness 1 on the session's vLLM server: each batch is scored by the teacher on the
    trainer when it is used, with the engine's log-probs of the (stale) sampling policy."""
    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_engine import ServerEngine

    catcher = BatchCatcher()
    callback = RolloutCallback(
        engine="vllm_server",
        max_staleness=1,
        sampling=SamplingConfig(n=4, max_new_tokens=2),
        rewards=[RewardSpec("prefix_match")],
        seed=0,
    )
    callback.use_engine(ServerEngine([ServerClient(vllm_server)]))
    module = GRPOModule(
        model=str(tiny_model_path),
        loss=GRPOLoss(off_policy=OffPolicySettings(correction="tis_token")),  # max_staleness needs a correction
        distillation=DistillSettings(teacher=str(digit_teacher_path)),
    )
    trainer = L.Trainer(
        max_steps=3,
        callbacks=[callback, catcher],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=2))
    assert trainer.global_step == 3 and len(catcher.batches) == 3
    for batch in catcher.batches:
        expected = -(batch.rollout_logp - batch.teacher_logp) * batch.completion_mask
        torch.testing.assert_close(batch.advantages, expected, atol=1e-6, rtol=0)
    assert float(trainer.callback_metrics["train/staleness_max"]) >= 1


def test_save_pretrained_writes_a_model_directory_a_teacher_can_load(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from lightning_grpo import SavePretrained

    out = tmp_path / "teacher"
    callback = RolloutCallback(
        engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=2), rewards=[RewardSpec("prefix_match")], seed=0
    )
    module = GRPOModule(model=str(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    trainer = L.Trainer(
        max_steps=2,
        callbacks=[callback, SavePretrained(str(out))],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=2))
    saved = AutoModelForCausalLM.from_pretrained(out)
    for name, value in module.policy.state_dict().items():
        torch.testing.assert_close(saved.state_dict()[name], value, atol=0, rtol=0)
    assert _tokenizer(out).get_vocab() == _tokenizer(tiny_model_path).get_vocab()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["teacher"]  # no temporary directory left
    # a directory that is not a saved model (a logger's, say) is refused before training
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[callback, SavePretrained(str(tmp_path / "logs"))],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(ValueError, match=r"SavePretrained.dirpath '.*logs' exists and is not a saved model directory"):
        trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=2))
    assert (tmp_path / "logs" / "metrics.csv").exists()
