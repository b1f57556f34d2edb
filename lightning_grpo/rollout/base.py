"""The rollout engine interface: sample G completions per prompt and report their log-probs.

An engine turns P prompts (token ids) into a `Rollout` of P*G completions, grouped by
prompt, with the log-probability of every sampled token under the sampling distribution. Two
engines implement it: `HFEngine` (transformers ``generate`` on
the live policy) and `VLLMEngine` (an in-process vLLM copy of
the policy that is refreshed with `RolloutEngine.load_weights` after each optimizer step).

This module imports torch only; heavy libraries are imported by the engines that need them.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

_MASK64 = (1 << 64) - 1
_MASK31 = (1 << 31) - 1
#: `derive_seed` keeps this many low bits for the rank (ranks 0..1023).
_RANK_BITS = 10


@dataclass
class SamplingConfig:
    """How completions are sampled. The same values drive every engine.

    Example:
        ```python
        from lightning_grpo import SamplingConfig

        sampling = SamplingConfig(n=8, temperature=1.0, top_p=1.0, max_new_tokens=512)
        ```
    """

    n: int = 8
    """Completions per prompt (the group size G)."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy decoding. Log-probs are reported after temperature scaling
    (for greedy decoding: of softmax(logits))."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1.0 = off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off."""
    max_new_tokens: int = 16
    """Most tokens sampled per completion (the EOS token counts)."""
    stop_token_ids: list[int] | None = None
    """Token ids that end a completion like EOS (kept as its last token), e.g. a chat template's
    end-of-turn / end-of-tool-call marker; None = EOS only."""

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingConfig.n must be an integer >= 1 (completions per prompt), got {self.n!r}")
        if not self.temperature >= 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.stop_token_ids is not None and not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(
                f"SamplingConfig.stop_token_ids must be a list of token ids (ints >= 0), got {self.stop_token_ids!r}"
            )

    @property
    def greedy(self) -> bool:
        """Temperature 0: always the most likely token."""
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature the reported log-probs are computed at (1 for greedy decoding)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class Rollout:
    """P prompts and their P*G sampled completions, grouped by prompt.

    Row ``i`` of the per-completion lists belongs to prompt ``i // group_size``: rows
    ``p*G .. p*G+G-1`` are the group of prompt ``p``.
    """

    prompt_ids: list[list[int]]
    """P prompts, as token ids (unpadded)."""
    completion_ids: list[list[int]]
    """P*G sampled completions (unpadded), including the EOS id when one was sampled; nothing after it."""
    logprobs: list[list[float]]
    """P*G lists: log-prob of each sampled token under softmax(logits / temperature), same lengths as
    ``completion_ids`` (see the engine for how top-k / top-p enter)."""
    finished: list[bool]
    """P*G flags: True = the completion ended with EOS, False = it hit ``max_new_tokens``."""
    group_size: int
    """G, completions per prompt."""
    turn_ids: list[list[int]] | None = None
    """Multi-turn episodes (`lightning_grpo.agents`): P*G lists, same lengths as ``completion_ids``:
    the 0-based model turn of each sampled token, -1 on tokens the environment appended (no loss,
    log-prob 0). None: every completion token was sampled (one turn)."""
    row_prompt_ids: list[list[int]] | None = None
    """P*G prompts, one per row, where the rows of a group were sampled from different prompts
    (episodes whose environment opened each one differently); None: row ``i``'s prompt is
    ``prompt_ids[i // group_size]``."""
    versions: list[int] | None = None
    """P*G weight versions that sampled each row (the ``trainer.global_step`` of the push; -1 = weights
    this run never pushed), from engines that report them (vLLM servers); None = not reported."""

    def __post_init__(self) -> None:
        expected = len(self.prompt_ids) * self.group_size
        rows = ("completion_ids", "logprobs", "finished", "turn_ids", "row_prompt_ids", "versions")
        for field in [f for f in rows if getattr(self, f) is not None]:
            got = len(getattr(self, field))
            if got != expected:
                raise ValueError(
                    f"Rollout.{field} has {got} rows; expected {expected} "
                    f"(= {len(self.prompt_ids)} prompts x group_size {self.group_size})"
                )
        for i, (ids, lps) in enumerate(zip(self.completion_ids, self.logprobs)):
            if len(ids) != len(lps):
                raise ValueError(f"Rollout.logprobs[{i}] has {len(lps)} values for {len(ids)} completion tokens")
            if self.turn_ids is not None and len(self.turn_ids[i]) != len(ids):
                raise ValueError(
                    f"Rollout.turn_ids[{i}] has {len(self.turn_ids[i])} values for {len(ids)} completion tokens"
                )

    def prompt_of(self, row: int) -> list[int]:
        """The prompt row ``row`` was sampled from."""
        return self.row_prompt_ids[row] if self.row_prompt_ids is not None else self.prompt_ids[row // self.group_size]

    def sampled_lengths(self) -> list[int]:
        """Tokens the policy sampled per row (environment tokens of multi-turn episodes not counted)."""
        if self.turn_ids is None:
            return [len(c) for c in self.completion_ids]
        return [sum(1 for t in turns if t >= 0) for turns in self.turn_ids]


class RolloutTensors(NamedTuple):
    """A `Rollout` padded into tensors (B = P*G rows, Lp = longest prompt, Lc = longest completion).

    Row ``b`` is ``[pad ... pad, prompt, completion, pad ... pad]``: the prompt of row ``b`` is
    LEFT-padded to Lp and its completion RIGHT-padded to Lc, so every completion starts at column
    Lp and ``input_ids[:, Lp:]`` lines up with the completion tensors. The token at column
    ``Lp + j`` is predicted by the logits at column ``Lp + j - 1``.
    """

    input_ids: torch.Tensor
    """[B, Lp+Lc] long: prompt + completion tokens, pad id elsewhere."""
    attention_mask: torch.Tensor
    """[B, Lp+Lc] long: 1 on prompt and completion tokens, 0 on padding."""
    completion_mask: torch.Tensor
    """[B, Lc] float: 1 on sampled tokens (EOS included), 0 on padding (and on environment tokens)."""
    rollout_logprobs: torch.Tensor
    """[B, Lc] float32: the engine's log-prob of each sampled token, 0 on padding."""
    turn_ids: torch.Tensor | None = None
    """[B, Lc] long: model turn of each sampled token, -1 elsewhere (multi-turn episodes only)."""


def rollout_to_tensors(rollout: Rollout, pad_id: int) -> RolloutTensors:
    """Pad ``rollout`` into training tensors; see `RolloutTensors` for the layout and shapes."""
    B = len(rollout.completion_ids)
    Lp = max((len(rollout.prompt_of(b)) for b in range(B)), default=0)
    Lc = max((len(c) for c in rollout.completion_ids), default=0)
    input_ids = torch.full((B, Lp + Lc), pad_id, dtype=torch.long)  # [B, Lp+Lc]
    attention_mask = torch.zeros((B, Lp + Lc), dtype=torch.long)  # [B, Lp+Lc]
    completion_mask = torch.zeros((B, Lc), dtype=torch.float32)  # [B, Lc]
    rollout_logprobs = torch.zeros((B, Lc), dtype=torch.float32)  # [B, Lc]
    turn_ids = None if rollout.turn_ids is None else torch.full((B, Lc), -1, dtype=torch.long)  # [B, Lc]
    for b, (ids, lps) in enumerate(zip(rollout.completion_ids, rollout.logprobs)):
        prompt = rollout.prompt_of(b)
        if prompt:
            input_ids[b, Lp - len(prompt) : Lp] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[b, Lp - len(prompt) : Lp] = 1
        if ids:
            input_ids[b, Lp : Lp + len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[b, Lp : Lp + len(ids)] = 1
            completion_mask[b, : len(ids)] = 1
            rollout_logprobs[b, : len(ids)] = torch.tensor(lps, dtype=torch.float32)
            if turn_ids is not None:
                turn_ids[b, : len(ids)] = torch.tensor(rollout.turn_ids[b], dtype=torch.long)
    if turn_ids is not None:
        completion_mask = (turn_ids >= 0).float()  # environment tokens carry no loss
    return RolloutTensors(input_ids, attention_mask, completion_mask, rollout_logprobs, turn_ids)


class RolloutEngine(abc.ABC):
    """Samples completions for prompts given as token ids.

    This class declares everything a caller (the `RolloutCallback`, the weight push,
    the agents) may use of an engine; the defaults suit an engine that samples from the live policy."""

    needs_weight_sync: bool = True
    """True when the engine holds its own copy of the weights, which the trainer must refresh with
    `load_weights` after every optimizer step (False for engines that sample from the live policy)."""

    max_model_len: int | None = None
    """Longest prompt + completion the engine takes, in tokens; None = no limit the engine knows of."""

    dtype: torch.dtype | None = None
    """The dtype the engine's own copy of the weights computes in; None = the policy's (engines that
    sample from the live policy). The weight push check derives its tolerance from it."""

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        """Sample ``sampling.n`` completions for each prompt; the same ``seed`` reproduces the rollout.
        Engines that know which weights sampled a row report it in `Rollout.versions`."""

    @abc.abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Replace the engine's weights with ``(hf_name, tensor)`` pairs named as in an HF checkpoint;
        ``version``: the trainer's optimizer step they come from (engines that tag samples with it)."""

    def score(self, sequences: list[list[int]]) -> dict[str, list[torch.Tensor]]:
        """Log-probs of given tokens under the weights the engine samples with now (its adapter included):
        for each sequence, ``[len(seq) - 1]`` float32 values, ``log_softmax(logits)`` at temperature 1 of token
        ``t`` given tokens ``< t``, for t = 1 .. len - 1. Keyed by the copy of the weights that scored them
        (one key for an in-process engine, one per server), each with one tensor per sequence. The weight push
        check (``rollout.weight_sync.check_every``) compares them with the trainer's."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot score given tokens, which the weight push check needs: implement "
            "RolloutEngine.score, or set rollout.weight_sync.check_every: 0"
        )

    def prepare_push(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        """Snapshot ``weights`` for a later `send_push` (the caller may change them afterwards);
        by default a detached copy of every tensor."""
        return [(name, tensor.detach().clone()) for name, tensor in weights]

    def send_push(self, prepared: Any, version: int) -> None:
        """Load weights snapshotted by `prepare_push` as ``version`` (may run on another thread)."""
        self.load_weights(prepared, version=version)

    @property
    def weights_discarded(self) -> bool:
        """True when the engine dropped its weights (vLLM sleep level 2): push them even if the policy
        did not change."""
        return False

    def load_lora_adapter(self, path: str) -> None:
        """Sample with the peft adapter saved in ``path`` from now on (engines that serve adapters)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not serve LoRA adapters (rollout.weight_sync.lora: merged)"
        )

    def unload_lora_adapter(self) -> None:  # noqa: B027 - optional hook, a no-op unless the engine overrides it
        """Stop applying the adapter of `load_lora_adapter` (no-op when none is loaded)."""

    def sleep(self) -> None:  # noqa: B027 - optional hook, a no-op unless the engine overrides it
        """Release memory until the next `load_weights` or `generate` (engines with a
        sleep mode; no-op by default). The RolloutCallback calls it after each generation batch."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op unless the engine overrides it
        """Release the engine's resources (no-op by default)."""


def validate_prompts(prompt_ids: list[list[int]]) -> None:
    """Raise one clear ValueError if ``prompt_ids`` is not a non-empty list of non-empty id lists."""
    if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
        raise ValueError(f"prompt_ids must be a non-empty list of token-id lists, got {type(prompt_ids).__name__}")
    for i, ids in enumerate(prompt_ids):
        if not isinstance(ids, (list, tuple)) or not ids:
            raise ValueError(f"prompt_ids[{i}] must be a non-empty list of token ids, got {ids!r:.80}")


def check_fits(prompt_ids: list[list[int]], max_new_tokens: int, max_model_len: int, whose: str, remedy: str) -> None:
    """Raise one clear ValueError if the longest prompt + ``max_new_tokens`` exceeds ``max_model_len``
    (``whose``: the engine named in the message, ``remedy``: the setting to raise)."""
    longest = max(len(p) for p in prompt_ids)
    if longest + max_new_tokens > max_model_len:
        raise ValueError(
            f"longest prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"{whose} max_model_len ({max_model_len}); raise {remedy}"
        )


def _mix64(x: int) -> int:
    """SplitMix64 finaliser: a bijection on 64-bit integers that scrambles nearby inputs."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _mix31(x: int) -> int:
    """A bijection on 31-bit integers (xorshift-multiply rounds with odd multipliers mod 2**31)."""
    for mult in (0x2C1B3C6D, 0x297A2D39):
        x ^= x >> 16
        x = (x * mult) & _MASK31
    return x ^ (x >> 15)


def derive_seed(run_seed: int, rank: int, step: int) -> int:
    """The sampling seed of ``rank`` at ``step``: deterministic, fits 31 bits, distinct per (rank, step).

    ``(step, rank)`` is packed into 31 bits as ``step * 1024 + rank`` and sent through a bijection
    keyed by ``run_seed``, so for one run seed the seeds of ranks 0..1023 and steps
    0..2**21-1 (about 2M) are all distinct; larger steps wrap around.
    """
    if not 0 <= rank < (1 << _RANK_BITS):
        raise ValueError(f"derive_seed: rank must be in [0, {1 << _RANK_BITS}), got {rank}")
    if step < 0:
        raise ValueError(f"derive_seed: step must be >= 0, got {step}")
    packed = ((step << _RANK_BITS) | rank) & _MASK31
    offset = _mix64(run_seed + 0x9E3779B97F4A7C15) & _MASK31
    return _mix31((packed + offset) & _MASK31)


#: The largest step whose derive_seed is distinct from every other (rank, step) of its run seed.
_TOP_STEP = (1 << (31 - _RANK_BITS)) - 1


def test_seed(run_seed: int, rank: int, index: int) -> int:
    """The seed of test batch ``index`` on ``rank`` (``lightning-grpo test``): `derive_seed` of the run
    seed at steps counted down from the top of its distinct range, so never the seed of a training generation
    of the run (those count up from 0; they would meet after about 2M generations), and the same test batches
    whatever checkpoint is tested."""
    return derive_seed(run_seed, rank, _TOP_STEP - index)


def request_seed(seed: int, index: int) -> int:
    """A 62-bit seed for request ``index`` of a rollout seeded with ``seed`` (scrambled, so requests
    of neighbouring seeds do not share random streams)."""
    return _mix64(_mix64(seed) + index) >> 2
