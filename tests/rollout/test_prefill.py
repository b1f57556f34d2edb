"""The CPU prefill settings (lightning_grpo/rollout/prefill.py): budget rules and server flags."""

from __future__ import annotations

import pytest

from lightning_grpo.rollout.prefill import cpu_llm_kwargs, cpu_prefill_budget, cpu_server_args


@pytest.mark.parametrize(
    ("max_model_len", "given", "budget"), [(512, None, 4096), (8192, None, 8192), (512, 512, 512), (512, 20000, 20000)]
)
def test_budget_holds_max_model_len(max_model_len, given, budget):
    assert cpu_prefill_budget(max_model_len, given, "f") == budget


def test_budget_must_be_a_positive_integer():
    with pytest.raises(ValueError, match=r"f must be a positive integer \(tokens per prefill step\), got 0"):
        cpu_prefill_budget(512, 0, "f")


def test_llm_kwargs_turn_chunked_prefill_off_and_take_the_extra_budget():
    assert cpu_llm_kwargs(512, None, {}) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
    assert cpu_llm_kwargs(512, 1024, {"max_num_batched_tokens": 2048}) == {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 2048,
    }
    assert cpu_llm_kwargs(512, None, {"enable_chunked_prefill": False})["enable_chunked_prefill"] is False


def test_server_flags():
    assert cpu_server_args(512, None, ["--seed", "3"]) == [
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",
    ]
    assert cpu_server_args(2048, 8192, []) == ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]


def test_server_process_command_carries_the_flags(tmp_path):
    from lightning_grpo.rollout.server_process import ServerProcess

    command = ServerProcess("model", 8000, tmp_path, max_model_len=1024, extra_args=["--seed", "1"]).command
    assert command[-7:] == [
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",
        "--seed",
        "1",
        "--kv-cache-memory-bytes",
        str(64 * 1024**2),
    ]


def test_drop_in_engine_rejects_chunked_prefill(tiny_model_path):
    pytest.importorskip("vllm")
    from lightning_grpo.rollout.vllm import VLLMEngine
    from lightning_grpo.rollout.vllm_args import VLLMArgs

    with pytest.raises(
        ValueError,
        match=r"rollout.engine.init_args.extra_llm_kwargs.enable_chunked_prefill=True: chunked prefill is not supported",
    ):
        VLLMEngine(str(tiny_model_path), VLLMArgs(extra_llm_kwargs={"enable_chunked_prefill": True}))
