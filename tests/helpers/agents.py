"""A scripted rollout engine, the tiny ``tools`` tokenizer and a tiny model that calls the
secret-digit tool, for the agent tests (and the TRL-style adapter's)."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L

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

    def load_weights(self, weights, version=None) -> None:
        pass


def tools_tokenizer():
    from lightning_grpo.models.tiny import build_char_tokenizer

    return build_char_tokenizer("tools")


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


CALL_TEXT = '<tool_call>\n{"name": "secret_digit", "arguments": {}}\n</tool_call>'


def caller_model_dir(tmp_path_factory) -> str:
    """The tiny tools model taught (30 supervised steps) to open each episode with the ``secret_digit``
    call: sampling then runs the whole chat-template + tool path (mechanics, not learning)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.data.tasks import digit_task
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

    src = tiny_model_dir(TinyModelConfig(tokenizer="tools"), cache_dir=tmp_path_factory.mktemp("tools-cache"))
    tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
    schema = {
        "type": "function",
        "function": {"name": "secret_digit", "description": "x", "parameters": {"type": "object", "properties": {}}},
    }
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], tools=[schema], tokenize=False, add_generation_prompt=True
        )
        for r in digit_task(num_train=16)[0]
    ]
    ids = torch.tensor([ids_of(tok, p) + ids_of(tok, CALL_TEXT) for p in prompts])  # [16, L]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(30):
        logits = model(input_ids=ids[:, :-1]).logits[:, -1]  # [16, V] the position that predicts the call
        loss = torch.nn.functional.cross_entropy(logits, ids[:, -1])
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = tmp_path_factory.mktemp("caller")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


class BatchCatcher(L.Callback):
    """Keeps every rollout batch the trainer trained on (``on_rollout_end``)."""

    def __init__(self):
        self.batches = []

    def on_rollout_end(self, trainer, module, batch):
        self.batches.append(batch)
