"""AgentRolloutCallback: the RolloutCallback with multi-turn episodes instead of single completions.

Everything downstream of sampling is the RolloutCallback's: groups, advantages, dynamic sampling,
GFPO (lengths count sampled tokens), the overlong filter, guards, weight pushes and resume; the
engine (``hf`` or ``vllm``) samples every live episode's next turn in one call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import lightning as L

from ..callbacks.completions import CompletionLogSettings
from ..callbacks.rollout import RolloutCallback
from ..callbacks.sampling import SampleResult, sample_groups
from ..callbacks.settings import EvaluationSettings, SelectionSettings, WeightSyncSettings
from ..data.records import RAW_PROMPT
from ..data.reward_set import RewardScores, RewardSpec
from ..data.reward_spec import RewardName
from ..rollout.base import RolloutEngine, SamplingConfig, request_seed
from ..rollout.engine_settings import EngineSettings
from .chat import ChatRenderer, probe_episode
from .environment import resolve_environment
from .episodes import EpisodeLimits, EpisodeRollout, run_episodes
from .report import episode_metrics, successful_calls
from .settings import AgentSettings
from .tools import tool_schema

#: A vocabulary token whose text ends with this marker ends a turn (Hermes / Qwen2.5 tool calls).
TOOL_CALL_END = "</tool_call>"


class AgentRolloutCallback(RolloutCallback):
    """Drives multi-turn episodes for `GRPOModule`.

    Args:
        agent: the episodes (`AgentSettings`): the environment and its arguments, ``max_turns``,
            ``max_episode_tokens``, ``env_workers``, ``stop_tokens``, ``reset_seed``, ``allow_mixed_task_groups``.
            The engine's ``max_model_len``, when not set, is the longest prompt + ``max_episode_tokens`` +
            ``sampling.max_new_tokens`` (one turn: + ``max_new_tokens``); with several turns and no
            ``max_episode_tokens`` set it must be set.
        engine: the rollout engine, as `RolloutCallback`'s (``hf`` or ``vllm`` sample every live episode's next
            turn in one call).
        sampling: one turn's sampling (``max_new_tokens`` per turn); ``n`` episodes per record.
        rewards: reward functions on each episode's final answer (default: ``env_reward``, the environment's).
        selection: as `RolloutCallback`'s (GFPO lengths count sampled tokens).
        evaluation: as `RolloutCallback`'s (greedy episodes on held-out records).
        weight_sync: as `RolloutCallback`'s.
        max_staleness: as `RolloutCallback`'s.
        log_completions: as `RolloutCallback`'s (the transcripts).
        seed: as `RolloutCallback`'s.

    Example:
        ```python
        import lightning as L

        from lightning_grpo import AgentRolloutCallback, AgentSettings, SamplingConfig

        agents = AgentRolloutCallback(
            agent=AgentSettings(environment="calculator", max_turns=6),
            sampling=SamplingConfig(n=8, max_new_tokens=256),
        )
        trainer = L.Trainer(max_steps=500, callbacks=[agents])
        ```
    """

    def __init__(
        self,
        agent: AgentSettings = AgentSettings(),  # noqa: B008 - copied below
        engine: EngineSettings | str = "vllm",
        sampling: SamplingConfig = SamplingConfig(),  # noqa: B008 - copied by RolloutCallback
        rewards: list[RewardSpec | RewardName] | RewardName | None = None,
        selection: SelectionSettings = SelectionSettings(),  # noqa: B008 - copied by RolloutCallback
        evaluation: EvaluationSettings = EvaluationSettings(),  # noqa: B008 - copied by RolloutCallback
        weight_sync: WeightSyncSettings = WeightSyncSettings(),  # noqa: B008 - copied by RolloutCallback
        max_staleness: int = 0,
        log_completions: CompletionLogSettings = CompletionLogSettings(),  # noqa: B008 - copied by RolloutCallback
        seed: int | None = None,
    ) -> None:
        super().__init__(
            engine=engine,
            sampling=sampling,
            rewards=rewards if rewards is not None else [RewardSpec("env_reward")],
            selection=selection,
            evaluation=evaluation,
            weight_sync=weight_sync,
            max_staleness=max_staleness,
            log_completions=log_completions,
            seed=seed,
        )
        self.agent = replace(agent, environment_args=dict(agent.environment_args or {}))
        check_reset_seed(self.agent.reset_seed, self.agent.allow_mixed_task_groups, self.sampling.n)
        self.env_class = resolve_environment(self.agent.environment)
        self.limits = EpisodeLimits(
            max_turns=self.agent.max_turns,
            max_episode_tokens=self.agent.max_episode_tokens,
            workers=self.agent.env_workers,
        )
        self.renderer: ChatRenderer | None = None
        self._tokenizer: Any = None

    # ------------------------------------------------------------------------ set-up
    def make_env(self) -> Any:
        return self.env_class(**self.agent.environment_args)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The checks of `RolloutCallback`, then one environment built: a misconfigured one
        (its arguments, an OpenEnv action class) fails here, before the engine starts."""
        super().setup(trainer, pl_module, stage)
        self.make_env()

    def _prepare(self, tokenizer: Any) -> None:
        """Renderer and stop tokens (once per tokenizer)."""
        if self._tokenizer is tokenizer:
            return
        tools = list(getattr(self.make_env(), "tools", None) or [])  # a user's environment (third-party)
        # a transformers tokenizer (third-party)
        self.renderer = (
            ChatRenderer(tokenizer, tools) if getattr(tokenizer, "chat_template", None) else None
        )  # (third-party)
        self.sampling.stop_token_ids = self._stop_ids(tokenizer)
        self._tokenizer = tokenizer

    def probe_rewards(self, records: list[dict], tokenizer: Any) -> None:
        """Not probed: the episodes' reward columns come from the environment (`score`)."""

    def environment_settings(self) -> dict[str, Any]:
        """``environment_args``, whose ``url`` / ``*_url`` servers the run checks before it starts."""
        return self.agent.environment_args

    def template_conversations(self, records: list[dict]) -> list[tuple[list[dict], Any, str]]:
        """Made-up episodes opened by ``records``' prompts (:func:`~lightning_grpo.agents.chat.probe_episode`, with
        the environment's tools) for the chat-template check
        (:func:`~lightning_grpo.checks.chat_template.check_chat_template`); none with ``max_turns: 1``."""
        if self.limits.max_turns == 1:
            return []
        env = self.make_env()
        tools = [
            t if isinstance(t, dict) else tool_schema(t) for t in getattr(env, "tools", None) or []
        ]  # (third-party)
        return [
            (
                probe_episode(rec.get(RAW_PROMPT, rec["prompt"]), tools),
                tools or None,
                f"an episode opened by training row {i}",
            )
            for i, rec in enumerate(records)
        ]

    def completion_budget(self) -> tuple[int | None, str]:
        """Tokens an episode may take after its prompt: one turn's, or ``max_episode_tokens`` plus a last
        turn's room (episodes stop a turn that would not fit); None with several turns and no budget."""
        limits, new = self.limits, self.sampling.max_new_tokens
        if limits.max_turns == 1:
            return new, "rollout.sampling.max_new_tokens"
        if limits.max_episode_tokens is not None:
            return limits.max_episode_tokens + new, "rollout.agent.max_episode_tokens + rollout.sampling.max_new_tokens"
        return None, f"rollout.agent.max_episode_tokens (max_turns={limits.max_turns})"

    def _stop_ids(self, tokenizer: Any) -> list[int]:
        if self.agent.stop_tokens is not None:
            ids = []
            for token in self.agent.stop_tokens:
                encoded = tokenizer(token, add_special_tokens=False)["input_ids"]
                if len(encoded) != 1:
                    raise ValueError(f"rollout.agent.stop_tokens: {token!r} is {len(encoded)} tokens, not one")
                ids.append(encoded[0])
            return ids
        ids = set()
        if self.renderer is not None:
            end = tokenizer(self.renderer.end_of_turn.strip(), add_special_tokens=False)["input_ids"]
            if len(end) == 1:
                ids.add(end[0])
        for token, i in tokenizer.get_vocab().items():
            if tokenizer.convert_tokens_to_string([token]).endswith(TOOL_CALL_END):
                ids.add(i)
        return sorted(ids)

    # --------------------------------------------------------------------- sampling
    def run(
        self, engine: RolloutEngine, tokenizer: Any, records: list[dict], sampling: SamplingConfig, seed: int
    ) -> EpisodeRollout:
        """Episodes for ``records`` (``sampling.n`` per record) with this callback's environment, each held to the
        run's context length (`RunPlan.context_length`)."""
        self._prepare(tokenizer)
        sampling.stop_token_ids = self.sampling.stop_token_ids
        return run_episodes(
            engine,
            self.make_env,
            tokenizer,
            self.renderer,
            records,
            sampling,
            seed,
            replace(self.limits, max_model_len=self.plan.context_length),
            reset_seed=self.agent.reset_seed,
        )

    def score(self, rollout: EpisodeRollout, records: list[dict]) -> RewardScores:
        """Reward functions on each episode's final answer, with the episode columns (data.rewards)."""
        G, episodes = rollout.group_size, rollout.episodes
        columns = {key: [rec[key] for rec in records for _ in range(G)] for key in records[0]}
        columns.update(
            completion_ids=rollout.completion_ids,
            completion_lengths=rollout.sampled_lengths(),
            truncated=[not f for f in rollout.finished],
            transcript=[s.messages if s.messages is not None else self._tokenizer.decode(s.ids) for s in episodes],
            env_reward=[s.reward for s in episodes],
            turns=[s.turns for s in episodes],
            tool_calls=[successful_calls(s) for s in episodes],
            environments=[getattr(s.env, "unwrapped", s.env) for s in episodes],  # a user's environment (third-party)
        )
        return self.reward_set.score([s.last_text for s in episodes], columns)

    def _sample_groups(self, trainer: L.Trainer, engine: RolloutEngine, prompts_for, seed_for) -> SampleResult:
        tokenizer = trainer.datamodule.tokenizer
        rounds: list[EpisodeRollout] = []

        def generate(records: list[dict], seed: int) -> EpisodeRollout:
            rounds.append(self.run(engine, tokenizer, records, self.sampling, seed))
            return rounds[-1]

        result = sample_groups(
            engine,
            self.reward_set,
            tokenizer,
            self.sampling,
            self.selector,
            prompts_for,
            seed_for,
            target_groups=trainer.datamodule.batch_size,
            max_rounds=self.max_generation_rounds,
            generate=generate,
            score=self.score,
        )
        result.metrics.update(episode_metrics(rounds[0].episodes, sum(r.env_time for r in rounds)))
        return result

    # ------------------------------------------------------------------- validation
    def episode_seed(self, module: L.LightningModule, split: str) -> int:
        """The episodes' seed of the held-out batch being evaluated. Each dev (``val``) batch of a check gets its
        own seed (environments draw per-episode values from it, e.g. the secret digit), so the held-out episodes of
        one check are all different; a test batch's is `test_seed` (never a
        training generation's, the same whatever checkpoint is tested)."""
        check = self.eval_seed(module, split)
        return (check if split == "test" else request_seed(check, self._eval_batch)) & 0x7FFFFFFF

    def evaluate(self, module: L.LightningModule, records: list[dict], split: str = "val") -> dict[str, float]:
        """Greedy episodes on held-out records (``<split>/...``): accuracy (first reward function), tool-call
        rate, turns."""
        trainer = module.trainer
        engine = self.ensure_engine(trainer, module)
        self.sync_weights(module)
        greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=self.sampling.max_new_tokens)
        rollout = self.run(engine, trainer.datamodule.tokenizer, records, greedy, self.episode_seed(module, split))
        scores = self.score(rollout, records)
        stats = episode_metrics(rollout.episodes, rollout.env_time, prefix=f"{split}/")
        return {
            f"{split}/greedy_accuracy": scores.rewards[:, 0].mean().item(),
            f"{split}/reward_mean": (scores.rewards @ scores.weights).mean().item(),
            f"{split}/tool_call_rate": stats[f"{split}/tool_call_rate"],
            f"{split}/turns_mean": stats[f"{split}/turns_mean"],
        }


def check_reset_seed(reset_seed: Any, allow_mixed_task_groups: bool, group_size: int) -> None:
    """One ValueError for an unknown ``reset_seed``, or per-episode seeds in groups nobody chose to mix."""
    if reset_seed not in ("group", "episode"):
        raise ValueError(f"rollout.agent.reset_seed must be 'group' or 'episode', got {reset_seed!r}")
    if reset_seed == "episode" and group_size > 1 and not allow_mixed_task_groups:
        raise ValueError(
            f"rollout.agent.reset_seed: episode gives the {group_size} episodes of a group different reset seeds, so they may "
            "face different tasks, and the group's advantage baseline would compare rewards of unlike tasks. Keep "
            "rollout.agent.reset_seed: group (one task per group, the default), or set "
            "rollout.agent.allow_mixed_task_groups: true "
            "to train that way (each episode on its own opening; docs/guide/agents.md)"
        )
