"""verifiers v1 tasksets as prompt records, their ``@vf.reward`` methods as reward functions.

verifiers (``pip install 'lightning-grpo[verifiers]'``, Prime Intellect's package, used as
``import verifiers.v1 as vf``): a ``Taskset`` yields ``Task`` objects whose ``TaskData`` holds the
``prompt`` and ``system_prompt``, and whose methods decorated ``@vf.reward(weight=...)`` score a
``vf.Trace`` of the conversation. Here the trainer samples (single-turn: ``RolloutCallback``):

- :func:`taskset_records` turns each task into a record: ``prompt`` (chat messages: the system
  prompt, then the task's prompt) and ``vf_task`` (the Task object); :class:`TasksetDataModule` is
  :class:`~lightning_grpo.PromptDataModule` over those records (Python); for a recipe,
  ``python -m lightning_grpo.integrations.verifiers my_pkg.tasks.MyTaskset tasks.jsonl`` writes the
  records to a file whose ``vf_task`` column names each task (taskset import path, its config, index);
- :func:`verifiers_reward` scores each completion the way verifiers does: a ``vf.Trace`` of the
  task's prompt plus the completion as the assistant's reply, then ``await task.score(trace)``
  (score-only, in this process: no harness, no runtime); it returns ``trace.reward`` (the weighted
  sum of the task's rewards) or, with ``reward="name"``, that reward's unweighted score.
  :func:`taskset_reward_specs` lists one such reward function per ``@vf.reward`` with its weight.

Out of scope: verifiers' harnesses (agent programs that call the model over HTTP, installed with
``uv`` at rollout time), runtimes (sandboxes, containers) and toolsets (MCP servers); rewards that
need a runtime are skipped by ``task.score`` (verifiers logs which). docs/guide/environments.md says why.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence
from typing import Any, Literal

from ..data.datamodule import PromptDataModule
from ..data.records import PromptFormat
from ..data.reward_set import RewardSpec
from ..data.sources import Rows
from ._common import require, resolve, run_sync

EXTRA = "verifiers"
#: The record column that carries each prompt's Task object.
TASK_COLUMN = "vf_task"


def _vf() -> Any:
    return require("verifiers.v1", EXTRA, "the verifiers adapter")


def load_taskset(taskset: Any, taskset_args: dict[str, Any] | None = None) -> Any:
    """A Taskset: given as itself, or as its class (or import path) built with its config from ``taskset_args``."""
    vf = _vf()
    if isinstance(taskset, vf.Taskset):
        if taskset_args:
            raise ValueError("taskset_args configure a taskset class; this taskset is already built")
        return taskset
    cls = resolve(taskset, "taskset", "'my_pkg.tasks.MyTaskset'")
    if not (isinstance(cls, type) and issubclass(cls, vf.Taskset)):
        raise TypeError(f"taskset {taskset!r} is not a verifiers.v1.Taskset subclass")
    from verifiers.v1.utils.generic import concrete_type

    config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    return cls(config_cls(**dict(taskset_args or {})))


def task_messages(task: Any) -> list[dict[str, str]]:
    """The task's opening as chat messages: its system prompt, then its prompt (text or messages)."""
    from verifiers.v1.types import content_text

    data = task.data
    if data.prompt is None:
        raise ValueError(
            f"task {data.idx} ({type(task).__name__}) has no prompt; tasks where the user opens the conversation are not supported"
        )
    system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        return system + [{"role": "user", "content": data.prompt}]
    messages = [{"role": m.role, "content": content_text(m.content)} for m in data.prompt]
    return messages if messages and messages[0]["role"] == "system" else system + messages


def taskset_records(
    taskset: Any, taskset_args: dict[str, Any] | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """One record per task (the first ``limit``): ``prompt`` (chat messages) and :data:`TASK_COLUMN`."""
    tasks = load_taskset(taskset, taskset_args)
    if limit is not None:
        tasks = tasks.take(limit)
    elif not tasks.bounded:
        raise ValueError(f"taskset {type(tasks).__name__} is infinite: set limit (how many tasks to use)")
    records = [{"prompt": task_messages(task), TASK_COLUMN: task} for task in tasks]
    if not records:
        raise ValueError(f"taskset {type(tasks).__name__} yielded no tasks")
    return records


def task_reference(taskset: str, taskset_args: dict[str, Any] | None, limit: int | None, idx: int) -> str:
    """A task named by its taskset (import path), the taskset's config, the ``limit`` and its index: a
    :data:`TASK_COLUMN` value that a file can hold (JSON text)."""
    return json.dumps(
        {"taskset": taskset, "taskset_args": dict(taskset_args or {}), "limit": limit, "idx": idx}, sort_keys=True
    )


@functools.lru_cache(maxsize=8)
def _referenced_tasks(taskset: str, taskset_args: str, limit: int | None) -> list[Any]:
    return [record[TASK_COLUMN] for record in taskset_records(taskset, json.loads(taskset_args), limit)]


def resolve_task(value: Any) -> Any:
    """The Task a :data:`TASK_COLUMN` value holds: the Task itself, or the one a :func:`task_reference` names."""
    vf = _vf()
    if isinstance(value, vf.Task):
        return value
    try:
        ref = json.loads(value) if isinstance(value, str) else None
        tasks = _referenced_tasks(ref["taskset"], json.dumps(ref["taskset_args"], sort_keys=True), ref["limit"])
        return tasks[ref["idx"]]
    except (TypeError, KeyError, IndexError, json.JSONDecodeError) as err:
        raise TypeError(
            f"column {TASK_COLUMN!r} must hold verifiers.v1.Task objects (taskset_records) or task references "
            f"(write_taskset), got {value!r:.100}"
        ) from err


def write_taskset(taskset: str, path: str, taskset_args: dict[str, Any] | None = None, limit: int | None = None) -> int:
    """Write the records of :func:`taskset_records` as JSON lines, each task as a :func:`task_reference`
    (for ``data.train_files`` with ``use_chat_template: true`` and ``answer_column: null``); returns the count."""
    records = taskset_records(taskset, taskset_args, limit)
    with open(path, "w") as f:
        for i, record in enumerate(records):
            f.write(
                json.dumps({"prompt": record["prompt"], TASK_COLUMN: task_reference(taskset, taskset_args, limit, i)})
                + "\n"
            )
    return len(records)


def score_traces(completions: Sequence[str], tasks: Sequence[Any]) -> list[Any]:
    """``vf.Trace`` of each (task prompt, completion), scored by ``await task.score(trace)`` (all in one event loop)."""
    vf = _vf()
    from verifiers.v1.graph import MessageNode

    roles = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
    tasks = [resolve_task(task) for task in tasks]
    traces = []
    for task, completion in zip(tasks, completions):
        opening = task_messages(task)
        unknown = [m["role"] for m in opening if m["role"] not in roles]
        if unknown:
            raise ValueError(
                f"task {task.data.idx}: its prompt has a {unknown[0]!r} message; only system / user / assistant are supported"
            )
        messages = [roles[m["role"]](content=m["content"]) for m in opening]
        messages.append(vf.AssistantMessage(content=completion))
        nodes = [
            MessageNode(message=m, parent=i - 1 if i else None, sampled=i == len(messages) - 1)
            for i, m in enumerate(messages)
        ]
        traces.append(
            vf.Trace(
                task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                agent=vf.AgentInfo(config=vf.AgentConfig()),
                nodes=nodes,
            )
        )

    async def score_all() -> None:
        import asyncio

        await asyncio.gather(*(task.score(trace) for task, trace in zip(tasks, traces)))

    run_sync(score_all())
    return traces


class _LastBatch:
    """The traces of the batch scored last, so that one spec per ``@vf.reward`` scores it once."""

    key: tuple = ()
    traces: list[Any] = []


def verifiers_reward(completions: list[str], vf_task: list[Any], reward: str | None = None) -> list[float]:
    """Score completions with their tasks' ``@vf.reward`` methods (see the module docstring).

    Args:
        completions: the sampled replies.
        vf_task: each completion's Task, or a task reference (the :data:`TASK_COLUMN` column of
            :func:`taskset_records` / :func:`write_taskset`).
        reward: None = ``trace.reward``, the weighted sum verifiers trains on; a reward's name = its
            unweighted score (give its weight in the :class:`~lightning_grpo.RewardSpec`).
    """
    key = (tuple(completions), tuple(t if isinstance(t, str) else id(t) for t in vf_task))
    if key != _LastBatch.key:
        _LastBatch.traces, _LastBatch.key = score_traces(completions, vf_task), key
    if reward is None:
        return [trace.reward for trace in _LastBatch.traces]
    out = []
    for trace in _LastBatch.traces:
        if trace.rewards.get(reward) is None:
            raise ValueError(
                f"verifiers_reward: the task has no reward {reward!r} (or it did not run); its rewards: {sorted(trace.rewards)}"
            )
        out.append(trace.rewards[reward].score)
    return out


def taskset_reward_specs(taskset: Any, taskset_args: dict[str, Any] | None = None) -> list[RewardSpec]:
    """One :class:`~lightning_grpo.RewardSpec` per ``@vf.reward`` method of the taskset's task type,
    named after it and weighted as it is (their weighted sum is ``trace.reward``)."""
    tasks = load_taskset(taskset, taskset_args)
    task = next(iter(tasks.take(1)), None)
    if task is None:
        raise ValueError(f"taskset {type(tasks).__name__} yielded no tasks")
    hooks = task.hooks("reward")
    if not hooks:
        raise ValueError(f"task {type(task).__name__} has no @vf.reward method")
    return [
        RewardSpec(
            verifiers_reward,
            weight=float(getattr(fn, "_vf_weight", 1.0)),  # a verifiers reward function (third-party)
            kwargs={"reward": fn.__name__},
            alias=fn.__name__,
        )
        for fn in hooks
    ]


class TasksetDataModule(PromptDataModule):
    """:class:`~lightning_grpo.PromptDataModule` over a verifiers taskset's tasks (chat template on).

    Args:
        taskset: the Taskset class (or its import path), built with ``taskset_args``; or a built taskset.
        taskset_args: fields of the taskset's config (its ``TasksetConfig`` subclass).
        limit: use the first ``limit`` tasks; None = all (an infinite taskset needs one).
        val_fraction: fraction of the tasks held out for validation; None = none.
        max_prompt_length / on_long_prompt: as :class:`~lightning_grpo.PromptFormat`'s.
        The other arguments are :class:`~lightning_grpo.PromptDataModule`'s.
    """

    def __init__(
        self,
        taskset: Any,
        taskset_args: dict[str, Any] | None = None,
        limit: int | None = None,
        val_fraction: float | None = None,
        tokenizer_path: str | None = None,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        max_prompt_length: int | None = None,
        on_long_prompt: Literal["error", "truncate"] = "error",
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        records = taskset_records(taskset, taskset_args, limit)
        fmt = PromptFormat(
            answer_column=None,
            use_chat_template=True,
            max_prompt_length=max_prompt_length,
            on_long_prompt=on_long_prompt,
        )
        super().__init__(
            Rows(records),
            tokenizer_path=tokenizer_path,
            format=fmt,
            val_fraction=val_fraction,
            batch_size=batch_size,
            val_batch_size=val_batch_size,
            seed=seed,
            shuffle=shuffle,
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m lightning_grpo.integrations.verifiers TASKSET OUT.jsonl [--args JSON] [--limit N]``."""
    parser = argparse.ArgumentParser(description="Write a verifiers taskset's tasks as prompt records (JSON lines).")
    parser.add_argument("taskset", help="import path of the Taskset class, e.g. my_pkg.tasks.MyTaskset")
    parser.add_argument("out", help="the .jsonl file to write")
    parser.add_argument("--args", default="{}", help="the taskset config's fields as JSON")
    parser.add_argument("--limit", type=int, default=None, help="the first N tasks (needed for an infinite taskset)")
    opts = parser.parse_args(argv)
    count = write_taskset(opts.taskset, opts.out, json.loads(opts.args), opts.limit)
    print(f"wrote {count} tasks of {opts.taskset} to {opts.out}")


if __name__ == "__main__":
    main()
