"""Rollouts with transformers ``generate`` on the live policy (no weight sync needed): `HFEngine`, and its
settings `HFSettings` (``rollout.engine: hf``).

Slower than vLLM for larger models, but exact by construction: it samples from the very module
that is being trained, so :attr:`HFEngine.needs_weight_sync` is False and
:meth:`HFEngine.load_weights` does nothing.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from lightning_grpo.rollout.base import Rollout, RolloutEngine, SamplingConfig, validate_prompts
from lightning_grpo.rollout.engine_settings import EngineContext, EngineSettings, register_engine


class HFEngine(RolloutEngine):
    """Sample with ``model.generate`` (``do_sample=True``), every sample of a group drawn independently.

    Log-probs are ``log_softmax(logits / temperature)`` of the sampled tokens, from the raw logits
    (``output_logits=True``): top-k / top-p shape which tokens can be sampled but are NOT
    renormalised into the reported values (with both off, the values are exactly the sampling
    distribution's). Sampling uses a forked torch RNG seeded with ``seed``, so the caller's global
    RNG state is left untouched. The model is put in eval mode for generation and its previous mode
    is restored afterwards.

    Memory: ``generate`` keeps the raw logits of every step until it returns, P*G x Ln x V floats
    (e.g. 128 x 1024 x 152k float32 = 80 GB for a Qwen2.5 vocabulary): for long completions with a
    large vocabulary use the vLLM engine.

    Sampling is pinned to :class:`SamplingConfig`: processors a checkpoint's
    ``generation_config.json`` may carry (repetition penalty, min-p, typical-p, ...) are switched off.
    """

    needs_weight_sync = False

    def __init__(self, model: nn.Module, eos_token_id: int, pad_token_id: int | None) -> None:
        """
        Args:
            model: the policy (an HF causal LM, optionally wrapped by peft); used in place, not copied.
            eos_token_id: token that ends a completion (returned as its last token when sampled).
            pad_token_id: id used to left-pad prompts inside a batch; None: ``eos_token_id`` (padding
                is masked out, so any id works).
        """
        if not hasattr(model, "generate"):
            raise TypeError(
                f"HFEngine needs a model with a `generate` method (an HF causal LM), got {type(model).__name__}"
            )
        if not isinstance(eos_token_id, numbers.Integral) or isinstance(eos_token_id, bool):
            raise ValueError(
                f"HFEngine eos_token_id must be the tokenizer's EOS token id (an int), got {eos_token_id!r}: "
                "without one no completion could end"
            )
        self.model = model
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id) if pad_token_id is not None else self.eos_token_id

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        validate_prompts(prompt_ids)
        device = next(self.model.parameters()).device
        input_ids, attention_mask = self._left_pad(prompt_ids, sampling.n, device)  # [P*G, Lp] each
        was_training = self.model.training
        fork_devices = [device] if device.type == "cuda" else []
        try:
            self.model.eval()
            with torch.random.fork_rng(devices=fork_devices), torch.no_grad():
                _seed_device(device, seed)
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=self._generation_config(sampling),
                )
        finally:
            self.model.train(was_training)
        new_tokens = out.sequences[:, input_ids.shape[1] :]  # [P*G, Ln]
        token_logprobs = torch.stack(  # one step at a time: never a second [P*G, Ln, V] copy
            [
                torch.log_softmax(step.float() / sampling.logprob_temperature, dim=-1).gather(
                    -1, new_tokens[:, t, None]
                )[:, 0]
                for t, step in enumerate(out.logits)  # step: [P*G, V] raw logits
            ],
            dim=1,
        )  # [P*G, Ln]
        del out
        stops = {self.eos_token_id, *(sampling.stop_token_ids or ())}
        return self._cut_at_eos(prompt_ids, new_tokens.tolist(), token_logprobs.tolist(), sampling.n, stops)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """No-op: the engine samples from the live policy."""

    def score(self, sequences: list[list[int]]) -> dict[str, list[torch.Tensor]]:
        """Log-probs of ``sequences[i][1:]`` under the model ``generate`` samples from (eval mode, as there)."""
        device = next(self.model.parameters()).device
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)  # [S, W] right-padded
        mask = torch.zeros_like(ids)  # [S, W]
        for i, seq in enumerate(sequences):
            ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq, dtype=torch.long), 1
        was_training = self.model.training
        try:
            self.model.eval()
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [S, W, V]
        finally:
            self.model.train(was_training)
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None].to(device))[..., 0]
        return {"its model": [logp[i, : len(seq) - 1].cpu() for i, seq in enumerate(sequences)]}

    def _left_pad(self, prompt_ids: list[list[int]], n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each prompt repeated ``n`` times (group-contiguous), left-padded: ids and mask, both [P*n, Lp]."""
        Lp = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), Lp), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), Lp), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, Lp - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, Lp - len(p) :] = 1
        return ids.repeat_interleave(n, dim=0).to(device), mask.repeat_interleave(n, dim=0).to(device)

    def _generation_config(self, sampling: SamplingConfig):
        from transformers import GenerationConfig

        sample_flags = dict(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=0.0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
        )
        return GenerationConfig(
            do_sample=not sampling.greedy,
            **({} if sampling.greedy else sample_flags),
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            max_new_tokens=sampling.max_new_tokens,
            num_beams=1,
            eos_token_id=[self.eos_token_id, *(sampling.stop_token_ids or ())],
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )

    def _cut_at_eos(
        self, prompt_ids: list[list[int]], tokens: list[list[int]], logprobs: list[list[float]], n: int, stops: set[int]
    ) -> Rollout:
        """Drop everything after the first EOS / stop token (generate pads finished rows) and flag finished rows."""
        completions, lps, finished = [], [], []
        for row_tokens, row_lps in zip(tokens, logprobs):
            end = next((i + 1 for i, tok in enumerate(row_tokens) if tok in stops), None)
            done = end is not None
            end = end if done else len(row_tokens)
            completions.append(row_tokens[:end])
            lps.append(row_lps[:end])
            finished.append(done)
        return Rollout(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=completions,
            logprobs=lps,
            finished=finished,
            group_size=n,
        )


def _seed_device(device: torch.device, seed: int) -> None:
    """Seed the CPU generator and, for a CUDA policy, that device's generator only (``torch.manual_seed``
    would reseed every CUDA device, outside the forked state)."""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


@register_engine
@dataclass
class HFSettings(EngineSettings):
    """The transformers engine (`HFEngine`), ``rollout.engine: hf``.

    It samples from the policy being trained,
    so there is no weight copy and nothing to push; its context limit is the policy's
    ``max_position_embeddings``. No settings: slower than vLLM beyond the tiny models, exact by construction."""

    name: ClassVar[str] = "hf"
    samples_live_policy: ClassVar[bool] = True

    def build(
        self,
        module: Any,
        tokenizer: Any,
        seed: int,
        context: EngineContext,
        *,
        max_model_len: int | None,
        sequences: int,
    ) -> RolloutEngine:
        return HFEngine(module.policy, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
