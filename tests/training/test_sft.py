"""SFTModule: the loss by hand, packing equal to padded, LoRA / QLoRA train the adapter only, and the
two stages: SFT through ``lightning-grpo sft``, export, GRPO from the exported folder."""

from __future__ import annotations

import dataclasses
import importlib.util
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch

from lightning_grpo import LoraSettings, SFTDataModule, SFTForwardSettings, SFTModule, SFTPolicySettings
from lightning_grpo.data.sft import collate
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.training.packing import choose_plan
from tests.helpers.bad_input import HF_ENGINE

ROOT = Path(__file__).resolve().parents[2]


def _module(path, **forward) -> SFTModule:
    module = SFTModule(model=str(path), forward=SFTForwardSettings(**forward))
    module.configure_model()
    return module


def _batch() -> dict[str, torch.Tensor]:
    """Three rows of 5, 9 and 4 tokens (the first and last padded; packed, they share one row)."""
    rows = [
        {"input_ids": [5, 6, 7, 15, 8], "loss_mask": [0, 0, 0, 1, 1]},
        {"input_ids": [9, 10, 15, 11, 12, 13, 1, 14, 6], "loss_mask": [0, 0, 0, 1, 1, 1, 1, 0, 1]},
        {"input_ids": [7, 8, 15, 1], "loss_mask": [0, 0, 0, 1]},
    ]
    return collate(rows, pad_id=0)


def test_loss_by_hand(tiny_model_path):
    """Token mean over the rows' assistant tokens of -log softmax(logits)[next token], from the model's logits."""
    module = _module(tiny_model_path, packing="off")
    batch = _batch()
    loss, tokens = module.sft_loss(batch)
    with torch.no_grad():
        logits = module.policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [3, 9, V]
    nll = []
    for row in range(3):
        n = int(batch["attention_mask"][row].sum())
        for t in range(1, n):
            if batch["loss_mask"][row, t]:
                nll.append(-torch.log_softmax(logits[row, t - 1], -1)[batch["input_ids"][row, t]])
    assert tokens == len(nll) == 8
    torch.testing.assert_close(loss, torch.stack(nll).mean(), rtol=1e-6, atol=1e-6)


def test_weighted_loss_by_hand(tiny_model_path):
    """Weights in loss_mask (last_turn_weight): the weighted mean of the same per-token -log p, and the
    logged token count still counts tokens."""
    module = _module(tiny_model_path, packing="off")
    batch = _batch()
    weights = batch["loss_mask"].clone()  # [3, 9]
    weights[1, 8], weights[2, 3] = 5.0, 2.5
    nll = -module.token_logprobs(SFTModule.as_rollout_batch(batch)).detach()  # [3, 6] unweighted per-token -log p
    mask = SFTModule.as_rollout_batch({**batch, "loss_mask": weights}).completion_mask  # [3, 6]
    loss, tokens = module.sft_loss({**batch, "loss_mask": weights})
    assert tokens == 8 and mask.sum() == 6 + 5.0 + 2.5
    torch.testing.assert_close(loss, (nll * mask).sum() / 13.5, rtol=1e-6, atol=1e-6)
    plain, _ = module.sft_loss(batch)
    assert not torch.allclose(loss, plain)


def test_lm_head_starts_at_the_first_assistant_token():
    """The tokens before the batch's first assistant token (a shared system prompt) are context only: the
    LM head runs on the rest (with a 151k vocabulary the head is most of the step)."""
    rollout = SFTModule.as_rollout_batch(_batch())
    assert rollout.prompt_length == 3 and rollout.completion_mask.shape == (3, 6)
    assert rollout.completion_mask.sum() == 8 and (rollout.input_ids[:, :3] != 0).all()  # no padding in the context


@pytest.mark.parametrize(
    "logprob_path, save_probs", [("chunked_hidden", False), ("chunked_hidden", True), ("logits", False)]
)
def test_packing_equals_padded(tiny_model_path, logprob_path, save_probs):
    """One packed row (block-diagonal attention from restarting positions) gives the padded loss and gradients
    (packed with the saved softmax: the padded, recomputing path's)."""
    results = []
    for packing in ("off", "on"):
        torch.manual_seed(0)
        module = _module(
            tiny_model_path, packing=packing, logprob_path=logprob_path, save_probs=save_probs and packing == "on"
        )
        plan = choose_plan(module.policy, module.as_rollout_batch(_batch()), packing)
        assert (plan.rows, plan.width) == (2, 9) if packing == "on" else plan is None
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t.shape) or t, lambda t: t):
            loss, _ = module.sft_loss(_batch())
        vocab = module.policy.config.vocab_size
        if (
            logprob_path == "chunked_hidden"
        ):  # the [N, V] softmax is kept only when asked (the logits path keeps logits)
            assert any(len(shape) == 2 and shape[-1] == vocab for shape in saved) == (save_probs and packing == "on")
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in module.policy.named_parameters()}))
    (padded, padded_grads), (packed, packed_grads) = results
    torch.testing.assert_close(packed, padded, rtol=1e-6, atol=1e-6)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("logprob_path", ["chunked_hidden", "logits"])
def test_validation_metrics_by_hand(tiny_model_path, logprob_path):
    """val/loss, val/token_accuracy, val/accuracy: a row whose answer is the model's own greedy continuation
    is all right, a row whose answer is another token is wrong; the loss is the token mean by hand."""
    module = _module(tiny_model_path, logprob_path=logprob_path, chunk_size=2)
    with torch.no_grad():
        greedy = module.policy.generate(
            torch.tensor([[5, 6, 7, 15]]), max_new_tokens=3, do_sample=False, pad_token_id=0
        )[0].tolist()
    wrong = [t + 1 if t < 40 else 5 for t in greedy[4:]]
    rows = [
        {"input_ids": greedy, "loss_mask": [0, 0, 0, 0, 1, 1, 1]},
        {"input_ids": greedy[:4] + wrong[:1], "loss_mask": [0, 0, 0, 0, 1]},
    ]
    batch = collate(rows, pad_id=0)
    module.validation_step(batch, 0)
    loss, tokens, right, rows_right, count = module._val_sums.tolist()
    with torch.no_grad():
        logits = module.policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    nll = [
        -torch.log_softmax(logits[r, t - 1], -1)[batch["input_ids"][r, t]] for r, t in [(0, 4), (0, 5), (0, 6), (1, 4)]
    ]
    assert (tokens, right, rows_right, count) == (4, 3, 1, 2)
    assert loss == pytest.approx(float(sum(nll)), rel=1e-5)


def _fit(module, data, steps: int = 2) -> None:
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, data)


@pytest.mark.parametrize("quantized", [False, True], ids=["lora", "qlora"])
def test_lora_trains_the_adapter_only(tiny_model_path, quantized):
    from lightning_grpo import QuantizationSettings

    if quantized and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("QLoRA needs bitsandbytes (the qlora extra, part of dev)")
    module = SFTModule(
        model=str(tiny_model_path),
        policy=SFTPolicySettings(
            lora=LoraSettings(r=4, alpha=8), quantization=QuantizationSettings() if quantized else None
        ),
        optimizer=partial(torch.optim.AdamW, lr=1e-2),
    )
    module.configure_model()
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    _fit(module, SFTDataModule(source=DigitTask(), tokenizer_path=str(tiny_model_path), batch_size=4))
    after = dict(module.policy.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n].detach())}
    adapter = {n for n in before if "lora_" in n}
    assert adapter and changed == {n for n in adapter if "lora_B" in n or "lora_A" in n}, sorted(changed ^ adapter)[:4]


# ----------------------------------------------------------------------- the two stages
def _cli(args: list[str]) -> None:
    from lightning_grpo.cli import main

    main(args)


def test_sft_then_export_then_grpo(tiny_model_path, tmp_path, monkeypatch):
    """recipes/sft_quickstart.yaml for a few steps, ``lightning-grpo export`` of its run, and
    recipes/quickstart.yaml started from the exported folder: GRPO's policy is the SFT policy."""
    from safetensors.torch import load_file

    from lightning_grpo.models.export import load_checkpoint

    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
    monkeypatch.chdir(tmp_path)
    run = ["--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.enable_progress_bar", "false"]
    _cli(
        [
            "sft",
            "fit",
            "-c",
            str(ROOT / "recipes/sft_quickstart.yaml"),
            *run,
            "--trainer.max_steps",
            "6",
            "--trainer.val_check_interval",
            "3",
        ]
    )
    checkpoint = tmp_path / "runs/sft_quickstart/version_0/checkpoints/last.ckpt"
    assert checkpoint.is_file()
    sft_weights, info, hparams = load_checkpoint(checkpoint)
    assert hparams["forward"]["packing"] == "auto" and info["tokenizer_files"]
    _cli(["export", str(tmp_path / "runs/sft_quickstart"), "--out", str(tmp_path / "sft_model")])
    exported = load_file(tmp_path / "sft_model/model.safetensors")
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, sft_weights[name], rtol=0, atol=0)
    from lightning_grpo.cli import build_cli

    cli = build_cli(
        [
            "-c",
            str(ROOT / "recipes/quickstart.yaml"),
            *run,
            "--model.model",
            str(tmp_path / "sft_model"),
            *HF_ENGINE,
            "--trainer.max_steps",
            "1",
        ],
        run=False,
    )
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.model_source == str(tmp_path / "sft_model") and cli.trainer.global_step == 1


def test_grpo_model_from_an_sft_checkpoint(tiny_model_path, tmp_path, monkeypatch):
    """``model.model`` naming the SFT run folder (or its last.ckpt): exported once next to the checkpoint,
    the same tensors as ``lightning-grpo export``; a file that is no checkpoint is one error naming model.model."""
    from safetensors.torch import load_file

    from lightning_grpo import GRPOModule
    from lightning_grpo.models.export import load_checkpoint

    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
    run = tmp_path / "runs"
    _cli(
        [
            "sft",
            "fit",
            "-c",
            str(ROOT / "recipes/sft_quickstart.yaml"),
            "--trainer.logger.init_args.save_dir",
            str(run),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.max_steps",
            "3",
            "--trainer.limit_val_batches",
            "0",
        ]
    )
    checkpoint = run / "sft_quickstart/version_0/checkpoints/last.ckpt"
    module = GRPOModule(model=str(run / "sft_quickstart"))
    assert module.model_source == str(checkpoint.parent / "last_model")
    folder_time = Path(module.model_source).stat().st_mtime
    assert GRPOModule(model=str(checkpoint)).model_source == module.model_source  # up to date: not written again
    assert Path(module.model_source).stat().st_mtime == folder_time
    weights, _, _ = load_checkpoint(checkpoint)
    exported = load_file(Path(module.model_source) / "model.safetensors")
    assert all(torch.equal(tensor, weights[name]) for name, tensor in exported.items())
    module.configure_model()
    assert torch.equal(module.policy.model.embed_tokens.weight, weights["model.embed_tokens.weight"])
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"model.model: .*notes.txt is not a Lightning checkpoint"):
        GRPOModule(model=str(tmp_path / "notes.txt"))


def test_grpo_only_settings_are_not_offered_to_sft():
    """SFTModule's settings types hold no GRPO-only field; GRPO's own settings are refused naming the type."""
    from lightning_grpo import ForwardSettings, PolicySettings

    for cls, field in (
        (SFTPolicySettings, "reference"),
        (SFTForwardSettings, "prefix_sharing"),
        (SFTForwardSettings, "rows_per_pass"),
    ):
        assert field not in {f.name for f in dataclasses.fields(cls)}
        with pytest.raises(TypeError, match=field):
            cls(**{field: "on"})
    for kwargs, expected in (
        (dict(policy=PolicySettings()), "expected SFTPolicySettings .* got PolicySettings"),
        (dict(forward=ForwardSettings()), "expected SFTForwardSettings .* got ForwardSettings"),
    ):
        with pytest.raises(TypeError, match=expected):
            SFTModule(model="tiny:chars", **kwargs)
    module = SFTModule(model="tiny:chars", forward=SFTForwardSettings(packing="off", save_probs=True))
    assert module.forward_settings.save_probs and module._layout.prefix_sharing == "off"
