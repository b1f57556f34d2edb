"""Sampling rounds for one generation batch: generate, score, select (GFPO), filter (dynamic
sampling) and refill, plus the statistics of what the policy sampled."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..core import SELECTIONS
from ..core.batch import RolloutBatch
from ..data.reward_set import RewardScores, RewardSet
from ..rollout.base import Rollout, RolloutEngine, RolloutTensors, SamplingConfig, rollout_to_tensors
from .settings import SelectionSettings


@dataclass
class GroupSelector:
    """GFPO row selection within each group, then the dynamic-sampling group filter."""

    group_size: int  # G' sampled per prompt
    keep: int | None = None  # GFPO: rows kept per group
    selection: Callable | None = None  # a SELECTIONS entry: (rewards, lengths, G', k) -> [B] bool
    dynamic_sampling: bool = False
    signal_column: int | None = None  # dynamic sampling looks at this reward function only (None: the total)

    def __post_init__(self) -> None:
        if self.keep is not None and not 1 <= self.keep < self.group_size:
            raise ValueError(
                f"rollout.selection.gfpo_keep must be in [1, rollout.sampling.n) = [1, {self.group_size}), got {self.keep}"
            )
        self._group_filter = SELECTIONS.get("dynamic_sampling")

    @classmethod
    def for_selection(cls, selection: SelectionSettings, group_size: int, reward_names: list[str]) -> GroupSelector:
        """The selector ``rollout.selection`` sets up for groups of ``group_size`` scored by ``reward_names``."""
        return cls(
            group_size=group_size,
            keep=selection.gfpo_keep,
            selection=SELECTIONS.get(selection.gfpo_metric) if selection.gfpo_keep is not None else None,
            dynamic_sampling=selection.dynamic_sampling,
            signal_column=_reward_column(selection.dynamic_sampling_reward, reward_names),
        )

    @property
    def out_group_size(self) -> int:
        return self.keep if self.keep is not None else self.group_size

    def rows(self, total: Tensor, lengths: Tensor) -> Tensor:
        """[B] bool: the rows GFPO keeps (all rows without GFPO)."""
        if self.selection is None:
            return torch.ones_like(total, dtype=torch.bool)
        return self.selection(total, lengths, self.group_size, self.keep)

    def groups(self, total_kept: Tensor) -> Tensor:
        """[P] bool: the groups (of kept rows) that carry signal (all groups without dynamic sampling)."""
        if not self.dynamic_sampling:
            return torch.ones(total_kept.numel() // self.out_group_size, dtype=torch.bool)
        return self._group_filter(total_kept, self.out_group_size)


def _reward_column(name: str | None, reward_names: list[str]) -> int | None:
    if name is None:
        return None
    if name not in reward_names:
        raise ValueError(
            f"rollout.selection.dynamic_sampling_reward {name!r} is not one of the configured rewards {reward_names}"
        )
    return reward_names.index(name)


class SampleResult(NamedTuple):
    tensors: RolloutTensors  # padded training tensors of the kept rows
    rewards: Tensor  # [B, R] per reward function
    weights: Tensor  # [R]
    finished: list[bool]  # [B] ended with EOS
    group_size: int
    metrics: dict[str, float]
    generate_time: float
    reward_time: float
    records: list[dict] | None = None  # [P] the prompt record of each kept group (distillation: each row's teacher)
    scored: Tensor | None = None  # [B] bool: some reward function scored the row (None: every row)


def score_rollout(rollout: Rollout, reward_set: RewardSet, tokenizer, records: list[dict]) -> RewardScores:
    """Decode the completions and score them; record columns are repeated over each group."""
    G = rollout.group_size
    completions = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    columns = {key: [rec[key] for rec in records for _ in range(G)] for key in records[0]}
    columns.update(
        completion_ids=rollout.completion_ids,
        completion_lengths=rollout.sampled_lengths(),
        truncated=[not f for f in rollout.finished],
    )
    return reward_set.score(completions, columns)


def rollout_statistics(rollout: Rollout, scores: RewardScores) -> dict[str, float]:
    """Reward, diversity and length statistics of one round as the policy sampled it."""
    G = rollout.group_size
    total = (scores.rewards @ scores.weights).view(-1, G)  # [P, G]
    lengths = torch.tensor(rollout.sampled_lengths(), dtype=torch.float32)  # [B]
    groups = [rollout.completion_ids[p * G : (p + 1) * G] for p in range(total.shape[0])]
    distinct = torch.tensor([len({tuple(c) for c in grp}) for grp in groups], dtype=torch.float32)  # [P]
    out = {
        "reward_mean": total.mean().item(),
        "reward_std": total.std(correction=0).item(),
        "reward_min": total.min().item(),
        "reward_max": total.max().item(),
        "frac_reward_zero_std": (total.max(-1).values == total.min(-1).values).float().mean().item(),
        "reward_levels": float(total.unique().numel()),  # distinct total rewards (2: a pass / fail reward)
        "frac_groups_all_lowest": (total.max(-1).values == total.min())
        .float()
        .mean()
        .item(),  # every sample at the batch minimum
        "frac_identical_groups": (distinct == 1).float().mean().item() if G > 1 else 0.0,
        "distinct_per_group": distinct.mean().item(),
        "completion_length_mean": lengths.mean().item(),
        "completion_length_min": lengths.min().item(),
        "completion_length_max": lengths.max().item(),
        "truncation_ratio": 1.0 - sum(rollout.finished) / len(rollout.finished),
    }
    cut = ~torch.tensor(rollout.finished, dtype=torch.bool)  # [B] ended by the length limit, not EOS
    if cut.any():  # absent when every completion ended with EOS (TruncationGuard)
        out["truncated_reward_mean"] = total.flatten()[cut].mean().item()
        out["truncated_reward_std"] = total.flatten()[cut].std(correction=0).item()
    wrong = total.flatten() <= 0  # [B] no reward: a pass / fail task's wrong answers
    if wrong.any():  # absent when every completion earned something
        out["completion_length_wrong_mean"] = lengths[wrong].mean().item()
    out.update(scores.metrics())
    return out


def _scored(scores: RewardScores) -> Tensor:
    """[B] bool: some reward function scored the row (did not return ``None``)."""
    if scores.applicable is None:
        return torch.ones(scores.rewards.shape[0], dtype=torch.bool)
    return scores.applicable.any(dim=1)


def _take_rows(rollout: Rollout, rows: list[int], group_size: int) -> Rollout:
    return Rollout(
        prompt_ids=[rollout.prompt_ids[rows[i] // rollout.group_size] for i in range(0, len(rows), group_size)],
        completion_ids=[rollout.completion_ids[r] for r in rows],
        logprobs=[rollout.logprobs[r] for r in rows],
        finished=[rollout.finished[r] for r in rows],
        group_size=group_size,
        turn_ids=None if rollout.turn_ids is None else [rollout.turn_ids[r] for r in rows],
        row_prompt_ids=None if rollout.row_prompt_ids is None else [rollout.row_prompt_ids[r] for r in rows],
    )


def sample_groups(
    engine: RolloutEngine,
    reward_set: RewardSet,
    tokenizer,
    sampling: SamplingConfig,
    selector: GroupSelector,
    prompts_for: Callable[[int], list[dict]],
    seed_for: Callable[[int], int],
    target_groups: int,
    max_rounds: int,
    generate: Callable[[list[dict], int], Rollout] | None = None,
    score: Callable[[Rollout, list[dict]], RewardScores] | None = None,
) -> SampleResult:
    """Sample rounds until ``target_groups`` groups are kept (one round without dynamic sampling).

    ``generate(records, seed)`` and ``score(rollout, records)`` replace the engine call and the
    reward scoring (multi-turn episodes, :mod:`lightning_grpo.agents`)."""
    if generate is None:

        def generate(records: list[dict], seed: int) -> Rollout:
            return engine.generate([r["prompt_ids"] for r in records], sampling, seed)

    if score is None:

        def score(rollout: Rollout, records: list[dict]) -> RewardScores:
            return score_rollout(rollout, reward_set, tokenizer, records)

    k = selector.out_group_size
    kept: list[Rollout] = []
    kept_rewards: list[Tensor] = []
    kept_scored: list[Tensor] = []
    kept_records: list[dict] = []
    fallback = None
    gen_time = reward_time = 0.0
    metrics: dict[str, float] = {}
    rounds = 0
    for round_ in range(max_rounds if selector.dynamic_sampling else 1):
        records = prompts_for(round_)
        start = time.perf_counter()
        rollout = generate(records, seed_for(round_))
        gen_time += time.perf_counter() - start
        start = time.perf_counter()
        scores = score(rollout, records)
        reward_time += time.perf_counter() - start
        rounds += 1
        if round_ == 0:
            metrics = rollout_statistics(rollout, scores)
        scored = _scored(scores)  # [B]
        total = scores.rewards @ scores.weights  # [B]
        lengths = torch.tensor(rollout.sampled_lengths(), dtype=torch.float32)  # [B] GFPO counts sampled tokens
        rows = selector.rows(total, lengths).nonzero().flatten()  # [P * k], group-contiguous
        signal = total if selector.signal_column is None else scores.rewards[:, selector.signal_column]  # [B]
        groups = selector.groups(signal[rows])  # [P]
        if fallback is None:
            fallback = (_take_rows(rollout, rows.tolist(), k), scores.rewards[rows], list(records), scored[rows])
        for p in groups.nonzero().flatten().tolist():
            if len(kept) == target_groups:
                break
            group_rows = rows[p * k : (p + 1) * k]
            kept.append(_take_rows(rollout, group_rows.tolist(), k))
            kept_rewards.append(scores.rewards[group_rows])
            kept_scored.append(scored[group_rows])
            kept_records.append(records[p])
        if len(kept) >= target_groups:
            break
    if kept:
        merged = Rollout(
            prompt_ids=[p for r in kept for p in r.prompt_ids],
            completion_ids=[c for r in kept for c in r.completion_ids],
            logprobs=[lp for r in kept for lp in r.logprobs],
            finished=[f for r in kept for f in r.finished],
            group_size=k,
            turn_ids=None if kept[0].turn_ids is None else [t for r in kept for t in r.turn_ids],
            row_prompt_ids=None if kept[0].row_prompt_ids is None else [p for r in kept for p in r.row_prompt_ids],
        )
        rewards, scored = torch.cat(kept_rewards), torch.cat(kept_scored)
    else:  # no group carried signal: train on the first round (advantages are all zero)
        merged, rewards, kept_records, scored = fallback
    metrics.update(kept_groups=float(len(kept)), generation_rounds=float(rounds))
    return SampleResult(
        tensors=rollout_to_tensors(merged, tokenizer.pad_token_id),
        rewards=rewards,
        weights=reward_set.weights.clone(),
        finished=list(merged.finished),
        group_size=k,
        metrics=metrics,
        generate_time=gen_time,
        reward_time=reward_time,
        records=kept_records,
        scored=scored,
    )


def training_batch(result: SampleResult, temperature: float, overlong_filter: bool) -> RolloutBatch:
    """The `RolloutBatch` of a sampled generation batch, before the module prepares it (advantages zero,
    no reference / old log-probs): with ``overlong_filter`` a completion cut off by the token budget keeps
    no token in the loss."""
    tensors = result.tensors
    mask = tensors.completion_mask  # [B, Lc]
    if overlong_filter:
        mask = mask * torch.tensor(result.finished, dtype=mask.dtype).unsqueeze(-1)
    return RolloutBatch(
        input_ids=tensors.input_ids,
        attention_mask=tensors.attention_mask,
        completion_mask=mask,
        advantages=torch.zeros(len(mask)),
        rollout_logp=tensors.rollout_logprobs,
        prompt_length=tensors.input_ids.shape[1] - mask.shape[1],
        group_size=result.group_size,
        temperature=temperature,
        turn_ids=tensors.turn_ids,
    )
