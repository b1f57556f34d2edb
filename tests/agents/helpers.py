"""A scripted rollout engine and the tiny ``tools`` tokenizer for the agent tests."""

from __future__ import annotations

from typing import Callable

from lightning_grpo.rollout.base import Rollout, RolloutEngine, SamplingConfig


class ScriptedEngine(RolloutEngine):
    """Returns scripted turns: ``script(call, row, prompt_ids) -> sampled ids`` (n must be 1).

    Log-prob of the k-th sampled token of a call: -(k + 1) / 10 - row / 100 (distinct, checkable).
    ``finished`` is True when the turn ends with one of the stop ids / EOS.
    """

    needs_weight_sync = False

    def __init__(self, script: Callable[[int, int, list[int]], list[int]], eos_id: int = 1) -> None:
        self.script, self.eos_id, self.calls, self.prompts = script, eos_id, 0, []

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        assert sampling.n == 1
        stops = {self.eos_id, *(sampling.stop_token_ids or ())}
        self.prompts.append([list(p) for p in prompt_ids])
        ids = [list(self.script(self.calls, row, p))[: sampling.max_new_tokens] for row, p in enumerate(prompt_ids)]
        self.calls += 1
        lps = [[-(k + 1) / 10 - row / 100 for k in range(len(x))] for row, x in enumerate(ids)]
        return Rollout([list(p) for p in prompt_ids], ids, lps, [bool(x) and x[-1] in stops for x in ids], 1)

    def load_weights(self, weights) -> None:
        pass


def tools_tokenizer():
    from lightning_grpo.tiny import build_char_tokenizer

    return build_char_tokenizer("tools")


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]
