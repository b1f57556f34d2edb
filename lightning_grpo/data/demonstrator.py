"""A weak demonstrator for partial SFT warm starts: on some right answers it says the next digit instead.

Used by the SFT data of the Qwen3 tracks (:class:`~lightning_grpo.data.word_problems.CountingWordProblems`,
:class:`~lightning_grpo.agents.secret_digit.SecretDigitTranscripts`): a model fitted to its answers is right on
the other digits only, so the warm start's level is set by the data rather than by when SFT stops.
"""

from __future__ import annotations

import random


def check_weak_demonstrator(owner: str, weak_digits: object, slip: object) -> None:
    """One error naming ``<owner>.weak_digits`` / ``<owner>.slip`` when they are not digits / a probability."""
    if not isinstance(weak_digits, str) or not set(weak_digits) <= set("0123456789"):
        raise ValueError(f"{owner}.weak_digits must be a string of digits, got {weak_digits!r}")
    if isinstance(slip, bool) or not isinstance(slip, (int, float)) or not 0.0 <= slip <= 1.0:
        raise ValueError(f"{owner}.slip must be a probability in [0, 1], got {slip!r}")


def demonstrate(answer: str, weak_digits: str, slip: float, rng: random.Random) -> str:
    """What the demonstrator says for the right ``answer``: the next digit with probability ``slip`` when
    ``answer`` is one of ``weak_digits`` (``rng`` is drawn from only then), else ``answer``."""
    if answer in weak_digits and rng.random() < slip:
        return str((int(answer) + 1) % 10)
    return answer
