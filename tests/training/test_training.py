"""End-to-end training behaviour: forward-pass budget, weight refresh through the callback,
resume, LoRA with the adapter-disabled reference."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import (
    AlgorithmSettings,
    GRPOLoss,
    GRPOModule,
    KLSettings,
    LoraSettings,
    PolicySettings,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    WeightSyncSettings,
)
from lightning_grpo.data.tasks import DigitTask


class Recorder(L.Callback):
    """Per-step copies of the rollout metrics and the loss metrics."""

    def __init__(self):
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        row = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
        row["loss"] = float(outputs["loss"]) if isinstance(outputs, dict) else float(outputs)
        self.steps.append(row)


def _fit(module, callback, steps, *, accumulate=1, ckpt_path=None, root=None, recorder=None, seed=0):
    L.seed_everything(seed)
    recorder = recorder or Recorder()
    trainer = L.Trainer(
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        log_every_n_steps=1,  # the Recorder reads every step's metrics
        callbacks=[callback, recorder],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=root,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=4), ckpt_path=ckpt_path)
    return trainer, recorder


def _hf_callback(**kwargs):
    return RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        rewards=[RewardSpec("prefix_match")],
        seed=3,
        **kwargs,
    )


def _policy(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


class ForwardCounter(L.Callback):
    """Counts the policy's decoder forwards and backwards inside each training step (generation,
    which runs in the RolloutCallback's on_train_batch_start before this, is not counted)."""

    def __init__(self, policy):
        self.forwards = self.backwards = 0
        self.per_step: list[tuple[int, int]] = []
        policy.get_decoder().register_forward_hook(lambda *a: self._count("forwards"))
        policy.get_input_embeddings().weight.register_hook(lambda g: self._count("backwards"))

    def _count(self, what):
        setattr(self, what, getattr(self, what) + 1)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.forwards = self.backwards = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.per_step.append((self.forwards, self.backwards))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_one_forward_and_backward_per_micro_batch(tiny_model_path, accumulate):
    policy = _policy(tiny_model_path)
    module = GRPOModule(model=policy, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    counter = ForwardCounter(policy)
    _fit(module, _hf_callback(), steps=3, accumulate=accumulate, recorder=counter)
    assert counter.per_step == [(1, 1)] * (3 * accumulate)


def test_old_and_reference_logprobs_only_when_needed(tiny_model_path):
    policy = _policy(tiny_model_path)
    module = GRPOModule(
        model=policy,
        loss=GRPOLoss(kl=KLSettings(beta=0.04)),
        algorithm=AlgorithmSettings(num_iterations=2),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
    )
    _fit(module, _hf_callback(), steps=2)
    batch = module.rollout_batch
    assert batch.old_logp is not None and batch.ref_logp is not None
    assert module.reference is not None and not any(p.requires_grad for p in module.reference.parameters())


def _resume_compare(make_callback, policy_path, tmp_path, tolerance):
    def run(steps, ckpt=None):
        module = GRPOModule(model=str(policy_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
        return _fit(module, make_callback(), steps, ckpt_path=ckpt)

    _, full = run(6)
    trainer, first = run(3)
    ckpt = tmp_path / "half.ckpt"
    trainer.save_checkpoint(ckpt)
    _, second = run(6, ckpt=str(ckpt))
    resumed = first.steps + second.steps
    assert len(resumed) == len(full.steps) == 6
    for a, b in zip(full.steps, resumed):
        for key in ("loss", "train/reward_mean", "train/entropy", "train/completion_length_mean"):
            assert a[key] == pytest.approx(b[key], abs=tolerance), key


def test_resume_reproduces_the_uninterrupted_run(tiny_model_path, tmp_path):
    _resume_compare(_hf_callback, tiny_model_path, tmp_path, tolerance=1e-6)


@pytest.mark.vllm
def test_resume_with_vllm_engine(tiny_model_path, vllm_engine, tmp_path):
    """The resumed run pushes the restored weights before its first generation and draws the
    same prompts and seeds; vLLM samples the same tokens, so the metrics agree to float noise."""

    def make_callback():
        callback = RolloutCallback(
            engine="vllm", sampling=SamplingConfig(n=4, max_new_tokens=3), rewards=[RewardSpec("prefix_match")], seed=3
        )
        callback.use_engine(vllm_engine)
        return callback

    _resume_compare(make_callback, tiny_model_path, tmp_path, tolerance=1e-5)


def test_lora_reference_is_the_adapter_free_model(tiny_model_path):
    module = GRPOModule(
        model=str(tiny_model_path),
        loss=GRPOLoss(kl=KLSettings(beta=0.1)),
        policy=PolicySettings(lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])),
        optimizer=lambda p: torch.optim.AdamW(p, lr=5e-2),
    )
    _fit(module, _hf_callback(), steps=3)
    assert module.reference_mode == "adapter" and module.reference is None
    trainable = [n for n, p in module.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    batch = module.rollout_batch
    base = _policy(tiny_model_path)  # the untouched base weights = the reference
    expected = module.token_logprobs(base, batch).logp.detach()
    torch.testing.assert_close(batch.ref_logp, expected, atol=1e-5, rtol=0)
    with torch.no_grad():
        trained = module.token_logprobs(module.policy, batch).logp
    assert (trained - expected).abs().max() > 1e-3  # the adapter moved the policy away from it


@pytest.mark.vllm
@pytest.mark.parametrize("weight_sync", [True, False])
def test_callback_keeps_vllm_in_step_with_the_policy(tiny_model_path, vllm_engine, weight_sync):
    """After every optimizer step the engine samples with the new weights: the log-probs vLLM
    reports equal the trainer's recomputation (mismatch ~ 1e-6); without the push they drift."""
    module = GRPOModule(model=str(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=2e-2))
    callback = RolloutCallback(
        engine="vllm",
        sampling=SamplingConfig(n=4, max_new_tokens=3, temperature=0.9),
        rewards=[RewardSpec("prefix_match")],
        weight_sync=WeightSyncSettings(enabled=weight_sync),
    )
    callback.use_engine(vllm_engine)
    _, recorder = _fit(module, callback, steps=4)
    gaps = [s["train/mismatch_max_abs"] for s in recorder.steps]
    assert gaps[0] < 1e-4  # the first push happens in both modes
    if weight_sync:
        assert max(gaps) < 1e-4, gaps
    else:
        assert min(gaps[1:]) > 1e-2, gaps
