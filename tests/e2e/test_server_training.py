"""Training with ``engine: vllm_server`` on the session's vLLM server (a child process): the weight
push through vLLM's RL API keeps the server's log-probs equal to the trainer's; distinct seeds
keep groups diverse; the asynchronous pipeline respects its staleness bound."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import (
    GRPOLoss,
    GRPOModule,
    OffPolicySettings,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    ServerSettings,
    WeightSyncSettings,
    WeightTransfer,
)
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.rollout.server_client import ServerClient

pytestmark = pytest.mark.vllm

SEQUENCE_LENGTH = 200  # longer than one KV block (128 on CPU): a stale prefix cache would show


def _sequence(vocab: int) -> list[int]:
    generator = torch.Generator().manual_seed(7)
    return torch.randint(3, vocab, (SEQUENCE_LENGTH,), generator=generator).tolist()


@torch.no_grad()
def _trainer_logprobs(policy, ids: list[int]) -> torch.Tensor:
    logits = policy(torch.tensor([ids])).logits[0, :-1].float()  # [L-1, V]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)  # [L-1]


class PushProbe(L.Callback):
    """After each push (the RolloutCallback pushes in on_train_batch_start, before this runs) and
    after a final push at the end: max |server - trainer| log-prob over a fixed 200-token sequence."""

    def __init__(self, rollout: RolloutCallback, url: str) -> None:
        self.rollout, self.client = rollout, ServerClient(url)
        self.gaps: list[float] = []

    def _measure(self, module) -> None:
        ids = _sequence(module.policy.config.vocab_size)
        server = torch.tensor(self.client.prompt_logprobs(ids))
        self.gaps.append((server - _trainer_logprobs(module.policy, ids)).abs().max().item())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step > 0:  # step 0 pushes the untrained weights
            self._measure(pl_module)

    def on_train_end(self, trainer, pl_module):
        self.rollout.sync_weights(pl_module)
        self._measure(pl_module)


#: The loss of asynchronous runs: the off-policy correction max_staleness >= 1 needs.
ASYNC_LOSS = {"off_policy": OffPolicySettings(correction="tis_token")}


def _fit(callbacks, model_path, steps, root=None, batch_size=4, ckpt_path=None, loss=None):
    L.seed_everything(0)
    module = GRPOModule(
        model=str(model_path), loss=GRPOLoss(**(loss or {})), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2)
    )
    trainer = L.Trainer(
        max_steps=steps,
        log_every_n_steps=1,  # the tests' Recorder reads every step's logged metrics
        callbacks=callbacks,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=root,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=batch_size), ckpt_path=ckpt_path)
    return trainer, module


def _server_callback(url, transfer="shm", weight_sync=True, **kwargs):
    return RolloutCallback(
        engine=ServerSettings(urls=[url], transfer=WeightTransfer(backend=transfer)),
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        rewards=[RewardSpec("prefix_match")],
        seed=3,
        weight_sync=WeightSyncSettings(enabled=weight_sync),
        **kwargs,
    )


@pytest.mark.parametrize("weight_sync", [True, False])
def test_push_keeps_server_logprobs_equal_to_trainer(vllm_server, tiny_model_path, tmp_path, weight_sync):
    rollout = _server_callback(vllm_server, weight_sync=weight_sync)
    probe = PushProbe(rollout, vllm_server)
    _fit([rollout, probe], tiny_model_path, steps=3, root=tmp_path)
    assert len(probe.gaps) == 3  # after the pushes at steps 1, 2 and after step 3
    print(f"weight_sync={weight_sync}: max |server - trainer| log-prob after each push {probe.gaps}")
    if weight_sync:
        assert max(probe.gaps) < 1e-5, probe.gaps
    else:  # the server keeps the step-0 weights: the gap exceeds the tolerance and grows with training
        assert min(probe.gaps) > 1e-5 and probe.gaps[-1] > 0.1, probe.gaps


class SeedLog:
    """Wraps ServerClient.generate to record the seed of every request sent to a server."""

    def __init__(self, monkeypatch):
        self.seeds: list[tuple[int, int]] = []  # (request seed, n)
        original = ServerClient.generate

        def generate(client, prompt_ids, params):
            self.seeds.append((params["seed"], params["n"]))
            return original(client, prompt_ids, params)

        monkeypatch.setattr(ServerClient, "generate", generate)


def test_async_run_distinct_seeds_diverse_groups_bounded_staleness(vllm_server, tiny_model_path, tmp_path, monkeypatch):
    from lightning_grpo import IdenticalSamplesGuard
    from tests.training.test_training import Recorder

    log = SeedLog(monkeypatch)
    guard, recorder = IdenticalSamplesGuard(), Recorder()
    rollout = _server_callback(vllm_server, max_staleness=1)
    _, module = _fit([rollout, guard, recorder], tiny_model_path, steps=4, root=tmp_path, loss=ASYNC_LOSS)
    # no shared random stream: every sample of every request of every step has its own seed (vLLM: sample i = seed + i)
    sample_seeds = [seed + i for seed, n in log.seeds for i in range(n)]
    assert len(log.seeds) >= 4 * 4  # 4 prompts x 4 trained batches (+ the batch sampled ahead, if it started)
    assert len(set(sample_seeds)) == len(sample_seeds)
    assert not guard.alarms
    assert all(step["train/frac_identical_groups"] < 0.5 for step in recorder.steps)
    # step 0 trains a batch sampled by its own weights, later steps one sampled a step earlier
    assert [step["train/staleness_max"] for step in recorder.steps] == [0.0, 1.0, 1.0, 1.0]
    assert module.loss_fn.correction == "tis_token"  # the loss's correction
    assert all("train/is_weight_mean" in step for step in recorder.steps)


def test_identical_samples_guard_fires_on_a_deliberately_shared_seed(vllm_server, tiny_model_path, tmp_path):
    """The seed-004 bug reproduced on the server: G requests of one sample each, all with one seed."""
    from lightning_grpo import IdenticalSamplesGuard
    from lightning_grpo.rollout.server_engine import ServerEngine, _to_rollout

    class SharedSeedEngine(ServerEngine):
        def generate(self, prompt_ids, sampling, seed, stop_token_ids=None):
            params = {"n": 1, "temperature": sampling.temperature, "max_tokens": sampling.max_new_tokens, "seed": seed}
            client = self.live_clients()[0]
            per_prompt = [[client.generate(p, params)[0] for _ in range(sampling.n)] for p in prompt_ids]
            return _to_rollout(prompt_ids, per_prompt, sampling.n)

    engine = SharedSeedEngine([ServerClient(vllm_server)])
    rollout, guard = _server_callback(vllm_server), IdenticalSamplesGuard()
    rollout.use_engine(engine)
    _fit([rollout, guard], tiny_model_path, steps=1, root=tmp_path)
    assert len(guard.alarms) == 1 and "share one random seed" in guard.alarms[0]["message"]


def test_resume_restarts_the_pipeline_with_the_restored_weights(vllm_server, tiny_model_path, tmp_path):
    from tests.training.test_training import Recorder

    trainer, _ = _fit(
        [_server_callback(vllm_server, max_staleness=1)], tiny_model_path, steps=2, root=tmp_path, loss=ASYNC_LOSS
    )
    path = str(tmp_path / "two.ckpt")
    trainer.save_checkpoint(path)
    recorder = Recorder()
    _fit(
        [_server_callback(vllm_server, max_staleness=1), recorder],
        tiny_model_path,
        steps=4,
        root=tmp_path,
        ckpt_path=path,
        loss=ASYNC_LOSS,
    )
    # the first resumed step trains a batch sampled by the restored weights (version 2), not one
    # left over from before the checkpoint; the next is one step stale again
    assert [s["train/weight_version_min"] for s in recorder.steps] == [2.0, 2.0]
    assert [s["train/staleness_max"] for s in recorder.steps] == [0.0, 1.0]


def test_an_async_push_that_does_nothing_stops_the_run(vllm_server, tiny_model_path, tmp_path, monkeypatch):
    """max_staleness 1: the push check's trainer side runs when a push is prepared, the engine's noise is measured
    on the rollout thread before the first push after the probe, and a push that never reaches the server stops
    the run, naming the step the server still holds."""
    import threading

    from lightning_grpo.callbacks.push_check import PushCheck, WeightPushError
    from lightning_grpo.rollout.server_engine import ServerEngine

    engine = ServerEngine([ServerClient(vllm_server)])
    real, versions, calibrated = engine.transport.push, [], []
    calibrate = PushCheck.calibrate

    def recorded(check, on):  # (thread, versions pushed so far, the noise once measured)
        calibrate(check, on)
        calibrated.append((threading.current_thread().name.split("_")[0], list(versions), check.noise))

    monkeypatch.setattr(PushCheck, "calibrate", recorded)

    def first_only(client, prepared, version):  # the step-0 push lands, no later one
        versions.append(version)
        if len(versions) == 1:
            real(client, prepared, version)

    engine.transport.push = first_only
    rollout = _server_callback(vllm_server, max_staleness=1)
    rollout.use_engine(engine)
    try:
        with pytest.raises(WeightPushError, match=rf"ServerEngine \({vllm_server}\) at step 1 .*still holds step 0's"):
            _fit([rollout], tiny_model_path, steps=4, root=tmp_path, loss=ASYNC_LOSS)
    finally:
        engine.close()
    assert versions[:2] == [0, 1]
    (thread, _, _), (_, pushed, noise) = calibrated[:2]  # before push 0 (no probe yet), before push 1: measured
    assert thread == "lightning-grpo-rollout" and pushed == [0] and noise < 1e-5, calibrated
