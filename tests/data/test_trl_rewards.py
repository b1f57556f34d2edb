"""TRL-style reward functions work unchanged: called by keyword with prompts, completions,
completion_ids and the other columns; chat completions as message lists for chat prompts."""

from __future__ import annotations

import re
import threading

import pytest

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.reward_set import RewardSet, RewardSpec
from lightning_grpo.data.rewards import RewardError
from lightning_grpo.data.sources import Rows

RECEIVED: dict[str, dict] = {}


# Written as TRL's GRPOTrainer documentation writes reward functions.
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(prompts, completions, ground_truth, **kwargs):
    """Reward function that checks if the completion is the same as the ground truth."""
    RECEIVED["reward_func"] = {"prompts": prompts, "completions": completions, "ground_truth": ground_truth, **kwargs}
    matches = [re.search(r"\\boxed\{(.*?)\}", c[0]["content"] if isinstance(c, list) else c) for c in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def reward_len(prompts, completions, completion_ids, **kwargs):
    """Plain-text data: the number of completion tokens away from 3."""
    RECEIVED["reward_len"] = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids}
    return [-abs(3 - len(ids)) for ids in completion_ids]


CHAT = [
    {"prompt": [{"role": "user", "content": "1+1="}], "ground_truth": "2", "level": 1},
    {
        "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}],
        "ground_truth": "4",
        "level": 2,
    },
]
COMPLETIONS = [
    "<think>a</think><answer>\\boxed{2}</answer>",
    "\\boxed{3}",
    "<think>b</think><answer>\\boxed{4}</answer>",
    "4",
]


def columns_of(records: list[dict], group: int, completion_ids: list[list[int]]) -> dict[str, list]:
    """What the rollout hands the reward set: every record column repeated over its group."""
    columns = {k: [r[k] for r in records for _ in range(group)] for k in records[0]}
    columns.update(completion_ids=completion_ids, completion_lengths=[len(c) for c in completion_ids])
    return columns


@pytest.fixture
def chat_records(tiny_model_path) -> list[dict]:
    dm = PromptDataModule(
        source=Rows(CHAT),
        tokenizer_path=str(tiny_model_path),
        format=PromptFormat(answer_column=None, use_chat_template=True),
        batch_size=2,
    )
    dm.setup("fit")
    return dm.train_records


def test_conversational_functions_receive_messages(chat_records):
    ids = [[5, 6], [7], [8, 9, 10], [11]]
    rewards = RewardSet([RewardSpec(format_reward_func, convention="trl"), RewardSpec(reward_func)])
    out = rewards.score(COMPLETIONS, columns_of(chat_records, 2, ids))
    assert out.rewards.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    got = RECEIVED["reward_func"]
    assert got["prompts"] == [CHAT[0]["prompt"]] * 2 + [CHAT[1]["prompt"]] * 2  # as the data holds them, no template
    assert got["completions"] == [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    assert got["ground_truth"] == ["2", "2", "4", "4"]
    assert got["completion_ids"] == ids
    assert got["level"] == [1, 1, 2, 2]  # every other column by name
    assert got["completion_lengths"] == [2, 1, 3, 1]
    assert got["prompt_ids"] == [r["prompt_ids"] for r in chat_records for _ in range(2)]
    assert "prompt" not in got and "raw_prompt" not in got and "trainer_state" not in got


def test_plain_text_functions_receive_strings(tiny_model_path):
    dm = PromptDataModule(
        source=Rows([{"prompt": "12=", "answer": "3"}, {"prompt": "45=", "answer": "6"}]),
        tokenizer_path=str(tiny_model_path),
        batch_size=2,
    )
    dm.setup("fit")
    ids = [[1, 2, 3], [4]]
    out = RewardSet([RewardSpec(reward_len)]).score(["abc", "d"], columns_of(dm.train_records, 1, ids))
    assert out.rewards.tolist() == [[0.0], [-2.0]]
    assert RECEIVED["reward_len"] == {"prompts": ["12=", "45="], "completions": ["abc", "d"], "completion_ids": ids}


def test_prompts_parameter_was_misread_before():
    """Our convention passed the completions positionally into ``prompts`` and then reported the
    completions missing; a ``prompts`` parameter now selects TRL's convention."""
    out = RewardSet([RewardSpec(reward_len)]).score(["ab"], {"prompt": ["x="], "completion_ids": [[1, 2]]})
    assert out.rewards.tolist() == [[-1.0]]
    assert RECEIVED["reward_len"]["prompts"] == ["x="]  # 'prompt' (the fed text) when there is no raw prompt


def test_functions_from_the_trl_package_use_its_convention():
    def accuracy(completions, solution, **kwargs):
        return [float(c[0]["content"] == s) for c, s in zip(completions, solution)]

    accuracy.__module__ = "trl.rewards.accuracy_rewards"  # as trl.rewards.accuracy_reward reports it
    chat = [[{"role": "user", "content": "1+1="}]] * 2
    out = RewardSet([RewardSpec(accuracy)]).score(["2", "3"], {"raw_prompt": chat, "solution": ["2", "2"]})
    assert out.rewards.tolist() == [[1.0], [0.0]]


def test_our_convention_is_kept_and_can_be_forced():
    def ours(completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    def prompts_column(completions, prompts, **columns):  # a data column that happens to be named prompts
        return [float(p == c) for p, c in zip(prompts, completions)]

    assert RewardSet([RewardSpec(ours)]).score(["1", "2"], {"answer": ["1", "1"]}).rewards.tolist() == [[1.0], [0.0]]
    forced = RewardSet([RewardSpec(prompts_column, convention="columns")])
    assert forced.score(["a", "b"], {"prompts": ["a", "c"]}).rewards.tolist() == [[1.0], [0.0]]
    with pytest.raises(ValueError, match=r"reward 'x': convention must be 'auto', 'columns' or 'trl', got 'openai'"):
        RewardSpec("x", convention="openai")


# ------------------------------------------------------------- errors, timeouts, located failures
def fails_on_second(prompts, completions, **kwargs):
    return [1.0 / (len(c[0]["content"]) - 1) for c in completions]  # "x": ZeroDivisionError


RELEASE = threading.Event()


def hangs(prompts, completions, **kwargs):
    RELEASE.wait(30)
    return [1.0] * len(completions)


@pytest.fixture
def release():
    RELEASE.clear()
    yield
    RELEASE.set()


def test_failures_are_located_and_timeouts_kept(chat_records, release):
    columns = columns_of(chat_records, 1, [[1], [2]])
    with pytest.raises(
        RewardError,
        match=r"reward function 'fails_on_second' raised ZeroDivisionError: float division by zero on sample 1 \(completion 'x'\)",
    ):
        RewardSet([RewardSpec(fails_on_second)]).score(["ok", "x"], columns)
    zero = RewardSet([RewardSpec(hangs, timeout_s=0.2, on_timeout="zero")])
    out = zero.score(["a", "b"], columns)
    assert out.rewards.tolist() == [[0.0], [0.0]] and out.timed_out == [True]
    with pytest.raises(
        ValueError,
        match=r"reward 'reward_len' is called TRL's way \(prompts, completions, \.\.\.\), but the columns \['completion_ids'\] hold no prompt",
    ):
        RewardSet([RewardSpec(reward_len)]).score(["a"], {"completion_ids": [[1]]})
    with pytest.raises(
        ValueError,
        match=r"reward 'reward_func' needs \['ground_truth'\], found neither in its kwargs nor in the columns",
    ):
        RewardSet([RewardSpec(reward_func)]).score(["a"], {"raw_prompt": ["x"]})
