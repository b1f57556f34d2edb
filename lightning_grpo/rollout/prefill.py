"""vLLM scheduling on CPU that never splits a seeded prefill.

Every request we send carries its own seed (:func:`~lightning_grpo.rollout.base.request_seed`), so
each sample has its own random stream. vLLM's CPU defaults are chunked prefill with a budget of
2,048 (servers) or 4,096 (in-process) tokens per scheduler step: once the prompts of one
``generate`` call add up to more than that, a prompt is prefilled over several steps, and vLLM
then rewinds that request's generator (``gen.set_offset(...)`` in
``gpu_model_runner._bookkeeping_sync``), which a CPU generator cannot do::

    RuntimeError: CPU Generator does not use offset

So on CPU the engines turn chunked prefill off. vLLM then prefills each prompt whole, in one
step, and admits a waiting prompt only when it fits the step's remaining token budget
(``max_num_batched_tokens``); vLLM itself requires that budget to be at least ``max_model_len``,
so any prompt the engine accepts fits. The budget bounds the tokens of one forward pass (its
activation memory), not how many prompts a call may hold. GPU generators support offsets: on a
GPU vLLM's defaults are kept.
"""

from __future__ import annotations

from typing import Any

from .engine_settings import ENGINE_ARGS

#: Prefill budget (tokens per scheduler step) on CPU when the user sets none: vLLM's own default
#: for in-process engines, raised to ``max_model_len`` when that is longer.
DEFAULT_CPU_PREFILL_TOKENS = 4096

CHUNKED_PREFILL_ON_CPU = (
    "chunked prefill is not supported with per-request seeds on CPU (vLLM rewinds the random "
    "generator of a request whose prefill it splits: 'CPU Generator does not use offset'); "
    "lightning-grpo turns it off on CPU"
)


def cpu_prefill_budget(max_model_len: int, max_num_batched_tokens: int | None, field: str) -> int:
    """The tokens one CPU scheduler step may prefill: ``max_num_batched_tokens`` when given, else
    ``max(max_model_len, DEFAULT_CPU_PREFILL_TOKENS)``. Raises a ValueError naming ``field`` when a
    given budget is below ``max_model_len`` (a prompt that long could never be scheduled whole)."""
    if max_num_batched_tokens is None:
        return max(int(max_model_len), DEFAULT_CPU_PREFILL_TOKENS)
    if not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1:
        raise ValueError(
            f"{field} must be a positive integer (tokens per prefill step), got {max_num_batched_tokens!r}"
        )
    if max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"{field} ({max_num_batched_tokens}) is below max_model_len ({max_model_len}): on CPU every prompt is "
            f"prefilled whole in one scheduler step ({CHUNKED_PREFILL_ON_CPU}), so a prompt of up to "
            f"max_model_len tokens must fit: raise {field} to at least {max_model_len}, or leave it unset"
        )
    return max_num_batched_tokens


def cpu_llm_kwargs(
    max_model_len: int, max_num_batched_tokens: int | None, extra: dict[str, Any], where: str = ENGINE_ARGS
) -> dict[str, Any]:
    """``vllm.LLM`` scheduler arguments for a CPU engine: chunked prefill off, the prefill budget of
    :func:`cpu_prefill_budget`. ``extra`` (the user's other ``LLM`` arguments, ``{where}.extra_llm_kwargs``)
    must not switch chunked prefill back on; its ``max_num_batched_tokens``, if any, is the budget."""
    extra_field = f"{where}.extra_llm_kwargs"
    if extra.get("enable_chunked_prefill"):
        raise ValueError(f"{extra_field}.enable_chunked_prefill=True: {CHUNKED_PREFILL_ON_CPU}; remove the option")
    field = f"{where}.max_num_batched_tokens"
    if "max_num_batched_tokens" in extra:
        max_num_batched_tokens, field = extra["max_num_batched_tokens"], f"{extra_field}.max_num_batched_tokens"
    budget = cpu_prefill_budget(max_model_len, max_num_batched_tokens, field)
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": budget}


def cpu_server_args(max_model_len: int, max_num_batched_tokens: int | None, server_args: list[str]) -> list[str]:
    """``vllm serve`` options for a CPU server we start (chunked prefill off, the prefill budget);
    ``server_args`` (the user's ``launch.args``) must not switch chunked prefill on or set the budget themselves."""
    for arg in server_args:
        name = str(arg).split("=", 1)[0]
        if name in ("--enable-chunked-prefill", "--enable_chunked_prefill"):
            raise ValueError(f"{ENGINE_ARGS}.launch.args {arg!r}: {CHUNKED_PREFILL_ON_CPU}; remove the option")
        if name in ("--max-num-batched-tokens", "--max_num_batched_tokens"):
            raise ValueError(
                f"{ENGINE_ARGS}.launch.args {arg!r}: set the prefill budget with {ENGINE_ARGS}.max_num_batched_tokens "
                "(checked against max_model_len before the server starts)"
            )
    budget = cpu_prefill_budget(max_model_len, max_num_batched_tokens, f"{ENGINE_ARGS}.max_num_batched_tokens")
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]


def is_cpu_platform() -> bool:
    """True when vLLM runs on CPU here: vLLM's platform when vLLM is already imported, else "no CUDA"."""
    import sys

    vllm = sys.modules.get("vllm")
    if vllm is not None:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    import torch

    return not torch.cuda.is_available()
