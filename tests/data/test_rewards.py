"""Reward functions: built-ins on hand examples, resolution by name or import path, the scoring set."""

from __future__ import annotations

import math
import os
import sys
import threading

import pytest
import torch

from lightning_grpo.data.reward_set import RewardSet, RewardSpec
from lightning_grpo.data.rewards import (
    REWARDS,
    RewardError,
    RewardTimeoutError,
    exact_match,
    length,
    math_accuracy,
    prefix_match,
    regex_format,
    resolve_reward,
    soft_overlong,
)
from lightning_grpo.data.tasks import digit_task

# ------------------------------------------------------------------------------------ built-ins


def test_exact_match():
    completions = ["2", " 2\n", "23", "", "3", "7"]
    answers = ["2", "2", "2", "2", 3, " 7 "]
    assert exact_match(completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def test_exact_match_gives_chance_to_a_digit_printer():
    """A policy that prints one fixed digit, whatever the prompt, scores exactly 0.1 on the digit task."""
    train, _ = digit_task(seed=0)
    answers = [r["answer"] for r in train]
    for digit in "0123456789":
        scores = exact_match([digit] * len(train), answer=answers)
        assert sum(scores) / len(scores) == pytest.approx(0.1, abs=1e-12)


def test_prefix_match():
    completions = ["2", " 2x", "x2", "", "12", "2"]
    answers = ["2", "2", "2", "2", "12", ""]
    assert prefix_match(completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_math_accuracy():
    pytest.importorskip("math_verify")
    completions = ["The answer is $\\frac{1}{2}$", "0.5", "so \\boxed{3}", "2"]
    answers = ["0.5", "1/2", "4", 2]
    assert math_accuracy(completions, answer=answers) == [1.0, 1.0, 0.0, 1.0]


def test_math_accuracy_runs_in_a_thread_under_a_timeout():
    """math-verify's signal-based timeouts are switched off outside the main thread."""
    pytest.importorskip("math_verify")
    rewards = RewardSet([RewardSpec("math_accuracy", timeout_s=60.0)])
    out = rewards.score(["$\\frac{1}{2}$", "3"], {"answer": ["0.5", "4"]})
    assert out.rewards.tolist() == [[1.0], [0.0]]


def test_math_accuracy_without_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    with pytest.raises(ImportError, match=r"needs the math-verify package: pip install 'lightning-grpo\[math\]'"):
        RewardSet([RewardSpec("math_accuracy")])
    with pytest.raises(ImportError, match=r"lightning-grpo\[math\]"):
        math_accuracy(["1"], answer=["1"])


def test_regex_format_fullmatch_and_search():
    completions = ["7", "a7", "77", "<a>x\ny</a>"]
    assert regex_format(completions, pattern=r"\d") == [1.0, 0.0, 0.0, 0.0]
    assert regex_format(completions, pattern=r"\d", match="search") == [1.0, 1.0, 1.0, 0.0]
    # DOTALL: '.' crosses newlines
    assert regex_format(completions, pattern=r"<a>.*</a>") == [0.0, 0.0, 0.0, 1.0]


def test_regex_format_kwargs_are_checked_when_the_set_is_built():
    with pytest.raises(ValueError, match=r"'regex_format' needs kwargs.pattern \(a regex string\), got None"):
        RewardSet([RewardSpec("regex_format")])
    with pytest.raises(ValueError, match=r"pattern '\(' is not a valid regex"):
        RewardSet([RewardSpec("regex_format", kwargs={"pattern": "("})])
    with pytest.raises(ValueError, match=r"match must be 'fullmatch' or 'search', got 'match'"):
        RewardSet([RewardSpec("regex_format", kwargs={"pattern": "a", "match": "match"})])


def test_soft_overlong():
    # free length 10 - 4 = 6 tokens, then linear to -1 at 10, -1 beyond.
    lengths = [0, 6, 7, 8, 10, 11]
    out = soft_overlong(["x"] * 6, completion_lengths=lengths, max_length=10, cache_length=4)
    assert out == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    # cache_length 0: the hard punishment, -1 only beyond max_length
    assert soft_overlong(["x"] * 3, completion_lengths=[10, 11, 0], max_length=10, cache_length=0) == [0.0, -1.0, 0.0]
    assert soft_overlong([], completion_lengths=[], max_length=10, cache_length=4) == []


def test_soft_overlong_kwargs_are_checked():
    with pytest.raises(ValueError, match=r"needs integer kwargs max_length and cache_length"):
        RewardSet([RewardSpec("soft_overlong", kwargs={"max_length": 10})])
    with pytest.raises(
        ValueError, match=r"needs 0 <= cache_length <= max_length and max_length > 0, got cache_length=12"
    ):
        RewardSet([RewardSpec("soft_overlong", kwargs={"max_length": 10, "cache_length": 12})])


def test_length():
    assert length(["a", "b"], completion_lengths=[3, 5]) == [3.0, 5.0]
    assert length(["a", "b"], completion_lengths=[3, 5], max_length=10) == [0.3, 0.5]
    with pytest.raises(ValueError, match=r"max_length must be a positive integer or null, got 0"):
        RewardSet([RewardSpec("length", kwargs={"max_length": 0})])


# ------------------------------------------------------------------------------------ resolution


def test_registry_has_the_built_ins_and_rejects_duplicates():
    assert {
        "exact_match",
        "prefix_match",
        "math_accuracy",
        "regex_format",
        "soft_overlong",
        "length",
        "reward_model",
        "llm_judge",
    } <= set(REWARDS)
    with pytest.raises(ValueError, match=r"reward function 'exact_match' is already registered"):
        REWARDS.register("exact_match")(lambda completions, **_: [])


def test_resolve_by_name_and_by_import_path():
    assert resolve_reward("exact_match") is exact_match
    assert resolve_reward("lightning_grpo.data.rewards.exact_match") is exact_match
    assert resolve_reward("lightning_grpo.data.rewards:exact_match") is exact_match
    assert resolve_reward("os.path:join") is os.path.join
    assert resolve_reward("collections:OrderedDict.fromkeys") == __import__("collections").OrderedDict.fromkeys
    assert resolve_reward(exact_match) is exact_match


def test_resolve_errors_name_the_string():
    with pytest.raises(
        ValueError,
        match=r"unknown reward function 'exact'; registered: env_reward, exact_match, final_number, length, llm_judge, math_accuracy",
    ):
        resolve_reward("exact")
    with pytest.raises(
        ValueError, match=r"reward function 'no_such_pkg.fn' could not be imported: No module named 'no_such_pkg'"
    ):
        resolve_reward("no_such_pkg.fn")
    with pytest.raises(ValueError, match=r"reward function 'os.path:no_such_fn' could not be imported"):
        resolve_reward("os.path:no_such_fn")
    with pytest.raises(TypeError, match=r"reward function 'math.pi' resolves to a float, which is not callable"):
        resolve_reward("math.pi")


# ------------------------------------------------------------------------------------ the set


def half(completions, **_columns):
    return [0.5] * len(completions)


def test_score_shapes_values_and_metrics():
    rewards = RewardSet(
        [
            {"name": "exact_match", "weight": 1.0},
            RewardSpec("length", weight=-0.5, kwargs={"max_length": 4}),
            RewardSpec("tests.data.test_rewards:half"),
        ]
    )
    out = rewards.score(["2", "3", "2 "], {"answer": ["2", "2", "5"], "completion_lengths": [1, 2, 4]})
    assert out.rewards.dtype == torch.float32
    assert out.rewards.shape == (3, 3)
    expected = [[1.0, 0.25, 0.5], [0.0, 0.5, 0.5], [0.0, 1.0, 0.5]]
    torch.testing.assert_close(out.rewards, torch.tensor(expected), rtol=0, atol=0)
    torch.testing.assert_close(out.weights, torch.tensor([1.0, -0.5, 1.0]), rtol=0, atol=0)
    assert out.names == ["exact_match", "length", "half"]
    metrics = out.metrics()
    assert metrics["reward/exact_match/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/exact_match/std"] == pytest.approx(math.sqrt(2) / 3)  # population std of [1, 0, 0]
    assert metrics["reward/length/mean"] == pytest.approx(7 / 12)
    assert metrics["reward/half/std"] == 0.0
    assert set(metrics) == {f"reward/{n}/{s}" for n in out.names for s in ("mean", "std")}


def test_scores_can_come_back_as_a_tensor():
    rewards = RewardSet([RewardSpec(__name__ + ":tensor_reward")])
    assert rewards.score(["a", "b"]).rewards.tolist() == [[1.0], [2.0]]


def tensor_reward(completions, **_columns):
    return torch.arange(1, len(completions) + 1)


def strict_signature(completions, answer, bonus=0.0):
    return [float(c == a) + bonus for c, a in zip(completions, answer)]


def test_a_function_without_columns_kwargs_gets_only_its_named_columns():
    rewards = RewardSet([RewardSpec(f"{__name__}:strict_signature", kwargs={"bonus": 0.5})])
    columns = {
        "answer": ["1", "2"],
        "completion_ids": [[6], [8]],
        "completion_lengths": [1, 1],
        "truncated": [False, True],
    }
    assert rewards.score(["1", "3"], columns).rewards.tolist() == [[1.5], [0.5]]


def test_empty_batch():
    out = RewardSet([RewardSpec("exact_match")]).score([], {"answer": []})
    assert out.rewards.shape == (0, 1)


def test_set_construction_errors():
    with pytest.raises(ValueError, match=r"RewardSet needs at least one reward function"):
        RewardSet([])
    with pytest.raises(
        ValueError,
        match=r"reward 'regex_format': unknown kwargs \['patern'\]; its named parameters are \['match', 'pattern'\]",
    ):
        RewardSet([RewardSpec("regex_format", kwargs={"patern": "a"})])
    with pytest.raises(
        ValueError, match=r"reward names must be unique; give an alias to the repeated \['regex_format'\]"
    ):
        RewardSet(
            [RewardSpec("regex_format", kwargs={"pattern": "a"}), RewardSpec("regex_format", kwargs={"pattern": "b"})]
        )
    two = RewardSet(
        [
            RewardSpec("regex_format", kwargs={"pattern": "a"}),
            RewardSpec("regex_format", kwargs={"pattern": "b"}, alias="has_b"),
        ]
    )
    assert two.score(["a", "b"]).rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_spec_errors():
    with pytest.raises(ValueError, match=r"reward 'x': timeout_s must be > 0 or null, got 0"):
        RewardSpec("x", timeout_s=0)
    with pytest.raises(ValueError, match=r"reward 'x': on_timeout must be 'raise' or 'zero', got 'skip'"):
        RewardSpec("x", on_timeout="skip")
    with pytest.raises(ValueError, match=r"reward 'x': weight must be a finite number, got nan"):
        RewardSpec("x", weight=float("nan"))


def test_column_errors_before_any_call():
    calls: list[int] = []
    rewards = RewardSet([RewardSpec(__name__ + ":recording"), RewardSpec("exact_match")])
    recording.calls = calls
    with pytest.raises(
        ValueError,
        match=r"reward 'exact_match' needs \['answer'\], found neither in its kwargs nor in the columns \['truncated'\]",
    ):
        rewards.score(["1", "2"], {"truncated": [False, True]})
    with pytest.raises(
        ValueError, match=r"column 'answer' has 1 entries for 2 completions; expected one per completion"
    ):
        rewards.score(["1", "2"], {"answer": ["1"]})
    shadow = RewardSet([RewardSpec("length", kwargs={"max_length": 3})])
    with pytest.raises(
        ValueError, match=r"reward 'length': kwargs \['max_length'\] shadow data columns of the same name"
    ):
        shadow.score(["1"], {"completion_lengths": [1], "max_length": [3]})
    assert calls == []  # nothing ran


def recording(completions, **_columns):
    recording.calls.append(len(completions))
    return [0.0] * len(completions)


def picky(completions, **_columns):
    return [1.0 / (c != "bad") for c in completions]


def batch_only(completions, **_columns):
    if len(completions) > 1:
        raise RuntimeError("needs one at a time")
    return [1.0]


def short(completions, **_columns):
    return [1.0] * (len(completions) - 1)


def wordy(completions, **_columns):
    return ["yes"] + [1.0] * (len(completions) - 1)


def nan_at_1(completions, **_columns):
    return [1.0, float("nan")]


def inf_at_0(completions, **_columns):
    return [float("-inf"), 1.0]


def a_dict(completions, **_columns):
    return {"a": 1.0}


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            "picky",
            r"reward function 'picky' raised ZeroDivisionError: float division by zero on sample 1 \(completion 'bad'\)",
        ),
        (
            "batch_only",
            r"reward function 'batch_only' raised RuntimeError: needs one at a time on a batch of 2 completions \(no single completion reproduces it\)",
        ),
        ("short", r"reward function 'short' returned the wrong number of scores: expected 2, got 1"),
        ("wordy", r"reward function 'wordy' returned a non-number 'yes' \(str\) at index 0 \(completion 'ok'\)"),
        ("nan_at_1", r"reward function 'nan_at_1' returned nan at index 1 \(completion 'bad'\); scores must be finite"),
        ("inf_at_0", r"reward function 'inf_at_0' returned -inf at index 0 \(completion 'ok'\); scores must be finite"),
        ("a_dict", r"reward function 'a_dict' returned a dict; expected a list of 2 numbers"),
    ],
)
def test_bad_reward_functions(fn, message):
    rewards = RewardSet([RewardSpec(f"{__name__}:{fn}")])
    with pytest.raises(RewardError, match=message):
        rewards.score(["ok", "bad"])


def test_long_completions_are_cut_in_messages():
    rewards = RewardSet([RewardSpec(f"{__name__}:picky")])
    with pytest.raises(RewardError, match=r"on sample 0 \(completion 'bad'\)"):
        rewards.score(["bad"])
    long_text = "x" * 100
    with pytest.raises(RewardError, match=r"returned nan at index 1 \(completion 'x{40}\.\.\.'\)"):
        RewardSet([RewardSpec(f"{__name__}:nan_at_1")]).score(["ok", long_text])


# ------------------------------------------------------------------------------------ timeouts

RELEASE = threading.Event()


def hang(completions, **_columns):
    RELEASE.wait(30)  # released at the end of each test, so no thread outlives the test for long
    return [1.0] * len(completions)


def raises_timeout_error(completions, **_columns):
    raise TimeoutError("socket timed out")


@pytest.fixture
def release_hung_threads():
    RELEASE.clear()
    yield
    RELEASE.set()


def test_timeout_raises(release_hung_threads):
    rewards = RewardSet([RewardSpec(f"{__name__}:hang", timeout_s=0.2)])
    with pytest.raises(
        RewardTimeoutError,
        match=r"reward function 'hang' did not finish within timeout_s=0.2 on a batch of 2 completions",
    ):
        rewards.score(["a", "b"])


def test_timeout_scores_zero_and_counts(release_hung_threads):
    rewards = RewardSet(
        [RewardSpec(f"{__name__}:hang", timeout_s=0.2, on_timeout="zero"), RewardSpec(f"{__name__}:half")]
    )
    out = rewards.score(["a", "b"])
    assert out.rewards.tolist() == [[0.0, 0.5], [0.0, 0.5]]
    assert out.timed_out == [True, False]
    assert out.metrics()["reward/hang/timeout"] == 1.0
    assert "reward/half/timeout" not in out.metrics()
    rewards.score(["c"])
    assert rewards.timeout_counts == {"hang": 2, "half": 0}


def test_a_function_that_finishes_in_time_is_scored_normally():
    rewards = RewardSet([RewardSpec(f"{__name__}:half", timeout_s=30.0)])
    out = rewards.score(["a", "b"])
    assert out.rewards.tolist() == [[0.5], [0.5]]
    assert out.timed_out == [False]


def test_a_timeout_error_raised_by_the_function_is_not_a_timeout():
    rewards = RewardSet([RewardSpec(f"{__name__}:raises_timeout_error", timeout_s=30.0, on_timeout="zero")])
    with pytest.raises(RewardError, match=r"'raises_timeout_error' raised TimeoutError: socket timed out on sample 0"):
        rewards.score(["a"])
