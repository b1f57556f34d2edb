"""The refusals of the matrix's REFUSED pairs, checked in process (fast; the slow matrix test runs them
through ``lightning-grpo fit``)."""

from __future__ import annotations

import pytest


def test_qlora_with_fsdp2_is_refused_by_the_fit_checks():
    pytest.importorskip("bitsandbytes")
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lightning_grpo import GRPOModule, PolicySettings
    from lightning_grpo.plan.engine_rules import check_layout

    module = GRPOModule(model="unused-path", policy=PolicySettings(lora={"r": 4}, quantization={"quant_type": "nf4"}))
    fsdp2 = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        logger=False,
        enable_checkpointing=False,
    )
    with pytest.raises(
        ValueError,
        match=r"^model\.policy\.quantization \(QLoRA\) does not shard with trainer\.strategy ModelParallelStrategy",
    ):
        check_layout(fsdp2, module)
    check_layout(
        L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False), module
    )


def test_hf_engine_with_fsdp2_is_refused_by_the_fit_checks():
    """HF generation on the FSDP2-sharded policy failed at the first rollout ("aten.embedding.default got
    mixed torch.Tensor and DTensor", matrix cell fsdp2-hf-lora-agent-tensorboard before this check)."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lightning_grpo import GRPOModule, RolloutCallback
    from lightning_grpo.plan.engine_rules import check_layout

    module = GRPOModule(model="unused-path")
    fsdp2 = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        logger=False,
        enable_checkpointing=False,
    )
    with pytest.raises(
        ValueError,
        match=r"^rollout\.engine 'hf' generates with the live policy, which trainer\.strategy ModelParallelStrategy",
    ):
        check_layout(fsdp2, module, RolloutCallback(engine="hf").plan_side())
    check_layout(fsdp2, module, RolloutCallback(engine="vllm").plan_side())
