"""A weighted set of reward functions that scores a batch of completions into a [B, R] tensor,
with per-call timeouts and one clear error per failure (function and sample named).

Two calling conventions (`RewardSpec.convention`):

* ours, ``fn(completions, **columns)``: ``completions`` the decoded texts (positional), every
  column by keyword (`lightning_grpo.data.rewards`);
* TRL's, ``fn(prompts=, completions=, completion_ids=, **columns)``, all by keyword, as
  ``trl.GRPOTrainer`` calls it: ``prompts`` the prompt column as the data holds it (text, or chat
  messages), ``completions`` the texts, or for chat-message prompts each text as
  ``[{"role": "assistant", "content": text}]``; the other columns as in ours (without TRL's
  ``trainer_state``). Picked for functions with a ``prompts`` parameter or from the ``trl`` package,
  and, as TRL reads the format from the data, for a batch whose prompts are chat messages (the
  package's own rewards excepted: they read text).

A function may return ``None`` for a sample it does not apply to (TRL's convention): the sample is
left out of that function's logged mean and std and counts 0 in the weighted sum (TRL's
``nansum``). A sample no function applies to scores 0 here, with a warning, and is marked in
`RewardScores.applicable`: by default (``model.algorithm.unscored: exclude``, TRL) the advantages leave
it out of its group's mean and std and give it 0.
"""

from __future__ import annotations

import inspect
import math
import numbers
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from lightning_grpo.data.records import RAW_PROMPT, is_chat
from lightning_grpo.data.reward_classes import instantiate_reward_class
from lightning_grpo.data.reward_spec import RewardSpec, as_reward_spec
from lightning_grpo.data.rewards import RewardError, RewardFn, RewardTimeoutError, resolve_reward

#: What TRL passes by keyword besides the columns (RewardSet builds both from the batch).
TRL_ARGS = ("prompts", "completions")

# ---------------------------------------------------------------------------------------- the set


@dataclass
class RewardScores:
    """What `RewardSet.score` returns for one batch."""

    rewards: torch.Tensor
    """``[B, R]`` float32: column r is reward function r's score of each completion."""
    weights: torch.Tensor
    """``[R]`` float32: each function's weight."""
    names: list[str]
    """``[R]`` the functions' log names."""
    timed_out: list[bool]
    """``[R]`` whether function r timed out on this batch (and was scored 0)."""
    applicable: torch.Tensor | None = None
    """``[B, R]`` bool: False where function r returned ``None`` (its score there is 0); None = all True."""

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """``{prefix}{name}/mean`` and ``/std`` (population) per function over the samples it applies
        to (TRL's ``nanmean``; left out when it applies to none), ``/applicable`` (the fraction it
        applies to) when it returned ``None``, ``/timeout`` if it timed out."""
        out: dict[str, float] = {}
        for r, name in enumerate(self.names):
            col = self.rewards[:, r]  # [B]
            if self.applicable is not None and not bool(self.applicable[:, r].all()):
                out[f"{prefix}{name}/applicable"] = self.applicable[:, r].float().mean().item()
                col = col[self.applicable[:, r]]  # [B'] the samples it scored
                if not col.numel():
                    continue
            out[f"{prefix}{name}/mean"] = col.mean().item() if col.numel() else 0.0
            out[f"{prefix}{name}/std"] = col.std(correction=0).item() if col.numel() else 0.0
            if self.timed_out[r]:
                out[f"{prefix}{name}/timeout"] = 1.0
        return out


def call_with_timeout(
    fn: Callable[..., Any], timeout_s: float | None, args: tuple, kwargs: dict, name: str = "reward-timeout"
) -> Any:
    """``fn(*args, **kwargs)``, waiting at most ``timeout_s`` (raises ``CallExpired`` after; shared by
    reward functions and agent tools).

    Runs in a daemon thread behind a ``Future``: a call that never returns cannot be killed, but
    it is left behind without blocking the interpreter's exit.
    """
    if timeout_s is None:
        return fn(*args, **kwargs)
    future: Future = Future()

    def target() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 - re-raised by future.result()
                future.set_exception(err)

    threading.Thread(target=target, name=name, daemon=True).start()
    try:
        return future.result(timeout=timeout_s)
    except TimeoutError:
        if future.done():  # the function itself raised TimeoutError
            raise
        raise CallExpired() from None


class CallExpired(Exception):
    """The call did not finish in time."""


#: What to do about a reward function that raised (the end of its error message).
FAILURE_HINT = "fix the function for this input, or have it return None for a sample it cannot score"


def _prefix(text: str, n: int = 40) -> str:
    return repr(text[:n] + ("..." if len(text) > n else ""))


def _of_prompt(columns: Mapping[str, Any], i: int) -> str:
    """`` of prompt '...'`` (shortened) for sample ``i`` when the columns hold its prompt, else ''."""
    prompts = columns.get("prompt", columns.get(RAW_PROMPT))
    if prompts is None or i >= len(prompts):
        return ""
    prompt = prompts[i]
    return f" of prompt {_prefix(prompt if isinstance(prompt, str) else str(prompt)[-40:])}"


class _Params(NamedTuple):
    """What `RewardSet` needs to know about a reward function's signature."""

    named: set[str]  # keyword-passable parameters the columns / kwargs may fill
    required: set[str]  # those without a default
    takes_all: bool  # has ``**columns``: receives every column, not only the named ones
    accepts: set[str]  # every keyword it takes (``named`` + TRL's ``prompts`` / ``completions``)


def _uses_trl(spec: RewardSpec, fn: RewardFn) -> bool | None:
    """Whether ``fn`` is called TRL's way (see `RewardSpec.convention`); None: as the data
    says (TRL's way when a batch's prompts are chat messages)."""
    if spec.convention != "auto":
        return spec.convention == "trl"
    module = getattr(fn, "__module__", None) or ""  # a user's reward function
    if module == "trl" or module.startswith("trl."):
        return True
    if module == "lightning_grpo" or module.startswith("lightning_grpo."):  # the package's own rewards read text
        return False
    try:
        return True if "prompts" in inspect.signature(fn).parameters else None
    except (TypeError, ValueError):
        return False


def _params(fn: RewardFn, trl: bool) -> _Params | None:
    """The signature summary of ``fn``, or None when it cannot be inspected (then nothing is checked)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    keywords = {p.name for p in params if p.kind in kinds}
    params = [p for p in params if p.name not in TRL_ARGS] if trl else params[1:]  # ours: completions first
    named = {p.name for p in params if p.kind in kinds}
    required = {p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty}
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return _Params(named, required, takes_all, keywords if trl else named)


class RewardSet:
    """Several weighted reward functions that score a batch of completions into a ``[B, R]`` tensor."""

    def __init__(self, specs: Sequence[RewardSpec | Mapping[str, Any] | str] | str) -> None:
        """Resolve every function and check its kwargs (errors here, before any rollout); build
        the reward classes (`instantiate_reward_class`). A name alone (``"my_rewards.fn"``, or a list
        holding some) stands for ``RewardSpec("my_rewards.fn")``."""
        specs = [specs] if isinstance(specs, str) else specs
        self.specs = [instantiate_reward_class(as_reward_spec(s)) for s in specs]
        if not self.specs:
            raise ValueError("RewardSet needs at least one reward function")
        self.fns = [resolve_reward(s.name) for s in self.specs]
        self.names = [s.label for s in self.specs]
        duplicates = sorted({n for n in self.names if self.names.count(n) > 1})
        if duplicates:
            raise ValueError(f"reward names must be unique; give an alias to the repeated {duplicates}")
        self._trl = [_uses_trl(spec, fn) for spec, fn in zip(self.specs, self.fns)]
        self._params = [_params(fn, bool(trl)) for fn, trl in zip(self.fns, self._trl)]
        self._trl_params = [
            _params(fn, True) if trl is None else p for fn, trl, p in zip(self.fns, self._trl, self._params)
        ]
        for spec, fn, params in zip(self.specs, self.fns, self._params):
            unknown = sorted(set(spec.kwargs) - params.named) if params else []
            if unknown:
                raise ValueError(
                    f"reward {spec.label!r}: unknown kwargs {unknown}; its named parameters are {sorted(params.named)}"
                )
            check = getattr(fn, "validate_kwargs", None)  # a reward is any callable: the hook is optional
            if check is not None:
                check(**spec.kwargs)
        #: Timed-out calls per function name since construction (``on_timeout="zero"``).
        self.timeout_counts: dict[str, int] = {n: 0 for n in self.names}
        self.weights = torch.tensor([float(s.weight) for s in self.specs], dtype=torch.float32)  # [R]

    def timeout_totals(self, prefix: str = "reward/") -> dict[str, float]:
        """``{prefix}{name}/timeouts``: calls timed out so far, for each function with a ``timeout_s``."""
        return {
            f"{prefix}{spec.label}/timeouts": float(self.timeout_counts[spec.label])
            for spec in self.specs
            if spec.timeout_s is not None
        }

    def totals(self, prefix: str = "reward/") -> dict[str, float]:
        """`timeout_totals` plus the running counters of reward objects that keep some
        (``fn.totals()``, e.g. ``llm_judge``'s ``judge_failures``) as ``{prefix}{name}/{key}``."""
        out = self.timeout_totals(prefix)
        for spec, fn in zip(self.specs, self.fns):
            counters = getattr(fn, "totals", None)  # a reward is any callable: the counters are optional
            if callable(counters):
                out.update({f"{prefix}{spec.label}/{key}": float(v) for key, v in counters().items()})
        return out

    def _check_inputs(self, completions: Sequence[str], columns: Mapping[str, Any]) -> None:
        batch = len(completions)
        for key, value in columns.items():
            size = len(value) if hasattr(value, "__len__") else None  # a user's reward output
            if size != batch:
                raise ValueError(
                    f"column {key!r} has {size} entries for {batch} completions; expected one per completion"
                )
        for r, spec in enumerate(self.specs):
            trl, params = self._convention(r, columns)
            if trl and RAW_PROMPT not in columns and "prompt" not in columns:
                raise ValueError(
                    f"reward {spec.label!r} is called TRL's way (prompts, completions, ...), but the columns "
                    f"{sorted(columns)} hold no prompt ({RAW_PROMPT!r} or 'prompt')"
                )
            shadowed = sorted(set(spec.kwargs) & set(columns))
            if shadowed:
                raise ValueError(f"reward {spec.label!r}: kwargs {shadowed} shadow data columns of the same name")
            missing = sorted(params.required - set(spec.kwargs) - set(columns)) if params else []
            if missing:
                raise ValueError(
                    f"reward {spec.label!r} needs {missing}, found neither in its kwargs nor in the columns "
                    f"{sorted(columns)}"
                )

    def score(self, completions: Sequence[str], columns: Mapping[str, Any] | None = None) -> RewardScores:
        """Score ``completions`` (``[B]``) with every function; ``columns`` are aligned with them."""
        completions = list(completions)
        columns = dict(columns or {})
        self._check_inputs(completions, columns)
        scores: list[list[float]] = []
        applies: list[list[bool]] = []
        timed_out: list[bool] = []
        for r in range(len(self.specs)):
            values, applicable, expired = self._score_one(r, completions, columns)
            scores.append(values)
            applies.append(applicable)
            timed_out.append(expired)
        shape = (len(scores), len(completions))
        rewards = torch.tensor(scores, dtype=torch.float32).reshape(shape).T  # [B, R]
        applicable = torch.tensor(applies, dtype=torch.bool).reshape(shape).T  # [B, R]
        unscored = (~applicable).all(dim=1).nonzero().flatten().tolist()
        if unscored:
            i = unscored[0]
            warnings.warn(
                f"every reward function returned None for sample {i} (completion {_prefix(completions[i])}): it is left "
                f"out of its group's baseline and gets advantage 0, as in TRL (model.algorithm.unscored: zero scores it 0 "
                f"instead; {len(unscored)} such sample(s) in this batch); make at least one function score every sample",
                stacklevel=2,
            )
        return RewardScores(
            rewards.contiguous(), self.weights.clone(), list(self.names), timed_out, applicable.contiguous()
        )

    def _convention(self, r: int, columns: Mapping[str, Any]) -> tuple[bool, _Params | None]:
        """(called TRL's way, its signature summary) of function ``r`` for a batch with ``columns``:
        an ``auto`` function without TRL's markers goes TRL's way when the prompts are chat messages."""
        trl = self._trl[r]
        if trl is None:
            prompts = columns.get(RAW_PROMPT, columns.get("prompt"))
            first = prompts[0] if prompts is not None and len(prompts) else None
            trl = isinstance(first, list) and bool(first) and is_chat(first)
        return trl, self._trl_params[r] if trl else self._params[r]

    def _arguments(self, r: int, completions: list[str], columns: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """(args, kwargs) of reward function ``r`` for a batch, in its convention; a function
        without ``**columns`` receives only the columns it names."""
        trl, params = self._convention(r, columns)
        if trl:
            prompts = list(columns[RAW_PROMPT] if RAW_PROMPT in columns else columns["prompt"])
            texts = [[{"role": "assistant", "content": t}] if is_chat(p) else t for p, t in zip(prompts, completions)]
            rest = {k: v for k, v in columns.items() if k not in (RAW_PROMPT, "prompt", *TRL_ARGS)}
            args, kwargs = (), {"prompts": prompts, "completions": texts, **rest}
        else:
            args, kwargs = (completions,), dict(columns)
        if params is not None and not params.takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in params.accepts}
        return args, {**kwargs, **self.specs[r].kwargs}

    def _score_one(
        self, r: int, completions: list[str], columns: dict[str, Any]
    ) -> tuple[list[float], list[bool], bool]:
        spec, fn = self.specs[r], self.fns[r]
        try:
            out = call_with_timeout(fn, spec.timeout_s, *self._arguments(r, completions, columns))
        except CallExpired:
            if spec.on_timeout == "raise":
                raise RewardTimeoutError(
                    f"reward function {spec.label!r} did not finish within timeout_s={spec.timeout_s} on a batch "
                    f"of {len(completions)} completions (set on_timeout='zero' to score 0 instead)"
                ) from None
            self.timeout_counts[spec.label] += 1
            return [0.0] * len(completions), [True] * len(completions), True
        except RewardError as err:  # the function named the failing sample itself (llm_judge, reward_model)
            raise RewardError(f"reward function {spec.label!r}: {err}") from err
        except Exception as err:
            raise self._locate_failure(r, completions, columns, err) from err
        return *self._check_output(spec.label, out, completions), False

    def _locate_failure(self, r: int, completions: list[str], columns: dict[str, Any], err: Exception) -> RewardError:
        """Re-run the failed call one completion at a time to name the first sample that fails."""
        spec, fn = self.specs[r], self.fns[r]
        what = f"{type(err).__name__}: {err}"
        for i, text in enumerate(completions):
            one = {k: v[i : i + 1] for k, v in columns.items()}
            try:
                call_with_timeout(fn, spec.timeout_s, *self._arguments(r, [text], one))
            except CallExpired:
                continue
            except Exception:  # noqa: BLE001 - this is the sample we are looking for
                return RewardError(
                    f"reward function {spec.label!r} raised {what} on sample {i} (completion {_prefix(text)})"
                    f"{_of_prompt(columns, i)}; {FAILURE_HINT}"
                )
        return RewardError(
            f"reward function {spec.label!r} raised {what} on a batch of {len(completions)} completions "
            f"(no single completion reproduces it); {FAILURE_HINT}"
        )

    @staticmethod
    def _check_output(label: str, out: Any, completions: list[str]) -> tuple[list[float], list[bool]]:
        """(scores, applicable): ``None`` (not applicable, TRL's convention) scores 0 and is not applicable."""
        if isinstance(out, torch.Tensor):
            out = out.tolist()
        expected = len(completions)
        if isinstance(out, (str, bytes, Mapping)) or not hasattr(out, "__len__"):  # a user's reward output
            raise RewardError(
                f"reward function {label!r} returned a {type(out).__name__}; expected a list of {expected} numbers"
            )
        if len(out) != expected:
            raise RewardError(
                f"reward function {label!r} returned the wrong number of scores: expected {expected}, got {len(out)}"
            )
        values, applicable = [], []
        for i, v in enumerate(out):
            applicable.append(v is not None)
            if v is None:
                values.append(0.0)
                continue
            if not isinstance(v, numbers.Real):
                raise RewardError(
                    f"reward function {label!r} returned a non-number {v!r} ({type(v).__name__}) at index {i} "
                    f"(completion {_prefix(completions[i])})"
                )
            if not math.isfinite(float(v)):
                raise RewardError(
                    f"reward function {label!r} returned {float(v)} at index {i} "
                    f"(completion {_prefix(completions[i])}); scores must be finite"
                )
            values.append(float(v))
        return values, applicable
