"""The built-in tool task: answer a secret digit that only a tool call reveals.

Each episode draws its own secret digit (from the episode's seed, so nothing can be memorised);
the user message (``question``, or else a dataset record's ``prompt``, e.g. the digit task's
``"4821="``) does not contain it.
The model may call ``secret_digit()``, read the result in a tool message, and answer; the answer
is right when its first character is the secret. A model that never calls the tool is right one
time in ten (chance). With ``tools_enabled=False`` (the control) nothing is offered or executed.

Flow with the tiny ``tools`` tokenizer (one token spells the whole call, see
:data:`~lightning_grpo.models.tiny.TOOLS_WORDS`)::

    <|im_start|>system\\ntools: secret_digit<|im_end|>\\n<|im_start|>user\\nsecret<|im_end|>\\n<|im_start|>assistant\\n
    [model] <tool_call>\\n{"name": "secret_digit", "arguments": {}}\\n</tool_call>        (stop token)
    [env]   <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n7\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n
    [model] 7<|im_end|>                                                          -> reward 1
                                    (recipes/tool_quickstart.yaml samples 1 token per turn: "7")
"""

from __future__ import annotations

import random
from typing import Any

from ..data.demonstrator import check_weak_demonstrator, demonstrate
from ..data.sources import DataSource
from .environment import ENVIRONMENTS, Messages, Turn
from .tools import ToolEnvironment, tool_schema


@ENVIRONMENTS.register("secret_digit")
class SecretDigitEnv(ToolEnvironment):
    """The secret-digit task (see the module docstring).

    Args:
        timeout_s: seconds a tool call may take.
        tools_enabled: False = the control run: no tool offered, every call answered "unknown tool".
        question: the user message of every episode; None = the dataset record's ``prompt``. The tool
            quickstart asks ``"secret"``: a prompt without digits, so the only digit in the context
            is the revealed one (the digit task's prompts put four distractor digits there).
    """

    def __init__(self, timeout_s: float | None = 10.0, tools_enabled: bool = True, question: str | None = None) -> None:
        if question is not None and (not isinstance(question, str) or not question.strip()):
            raise ValueError(f"SecretDigitEnv.question must be a non-empty string or None, got {question!r}")

        def secret_digit() -> str:
            """Reveal the secret digit of this episode."""
            return self.secret

        super().__init__([secret_digit], timeout_s=timeout_s, tools_enabled=tools_enabled)
        self.secret = ""
        self.question = question

    def reset(self, record: dict[str, Any], seed: int) -> Messages:
        self.secret = str(random.Random(seed).randrange(10))
        return [{"role": "user", "content": self.question if self.question is not None else record["prompt"]}]

    def answer(self, message: dict[str, Any], turn: Turn) -> float:
        return 1.0 if (message.get("content") or "")[:1] == self.secret else 0.0


class SecretDigitTranscripts(DataSource):
    """Supervised transcripts of the secret-digit task for ``SFTDataModule`` (the warm start before GRPO): the
    user asks ``question``, the assistant calls ``secret_digit()``, the tool answers a digit and the assistant
    repeats it. Rows hold ``messages`` and ``tools`` (the schema :class:`SecretDigitEnv` offers), so the chat
    template renders them exactly as the environment's episodes are rendered; the secrets are drawn from
    ``seed`` (training) and ``seed + 1`` (validation).

    A weak demonstrator, for a partial warm start that SFT can train to convergence (a sharp call format, the
    answer partly right): when the secret is one of ``weak_digits`` it answers the next digit instead, with
    probability ``slip``. ``weak_digits="3456789", slip=0.85`` (recipes/qwen3_tool_sft.yaml): a model that fits the
    transcripts answers greedily right on 0-2 (0.3 of the secrets) and, sampling, right 0.3 + 0.7 x 0.15 = 0.41 of
    the time, so GRPO has both a signal and the rest to learn.
    ``answer`` holds the true secret.
    """

    def __init__(
        self,
        question: str = "secret",
        num_train: int = 2000,
        num_val: int = 100,
        seed: int = 0,
        weak_digits: str = "",
        slip: float = 0.0,
    ) -> None:
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"SecretDigitTranscripts.question must be a non-empty string, got {question!r}")
        for name, n in (("num_train", num_train), ("num_val", num_val)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"SecretDigitTranscripts.{name} must be a positive integer, got {n!r}")
        check_weak_demonstrator("SecretDigitTranscripts", weak_digits, slip)
        self.question, self.num_train, self.num_val, self.seed = question, num_train, num_val, seed
        self.weak_digits, self.slip = weak_digits, slip

    def _rows(self, n: int, seed: int) -> list[dict[str, Any]]:
        tools = [tool_schema(fn) for fn in SecretDigitEnv(question=self.question).tools]
        call = {"type": "function", "function": {"name": tools[0]["function"]["name"], "arguments": {}}}
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            digit = str(rng.randrange(10))
            said = demonstrate(digit, self.weak_digits, self.slip, rng)
            messages = [
                {"role": "user", "content": self.question},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": digit},
                {"role": "assistant", "content": said},
            ]
            rows.append({"messages": messages, "tools": tools, "answer": digit})
        return rows

    def train_rows(self) -> list[dict[str, Any]]:
        return self._rows(self.num_train, self.seed)

    def val_rows(self) -> list[dict[str, Any]]:
        return self._rows(self.num_val, self.seed + 1)

    def describe(self, split: str) -> str:
        return f"the secret-digit transcripts' {'training' if split == 'train' else 'validation'} split"
