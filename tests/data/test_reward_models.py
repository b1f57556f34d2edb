"""The ``reward_model`` reward: scores equal a direct forward of the classifier (one sequence at a
time, no padding) to 1e-5, whatever the batch size and padding side; options checked up front."""

from __future__ import annotations

import pickle

import pytest
import torch

from lightning_grpo.data.reward_set import RewardError, RewardSet, RewardSpec
from lightning_grpo.models.tiny import build_char_tokenizer, save_tiny_reward_model

PROMPTS = ["1234=", "5678=", [{"role": "system", "content": "be short"}, {"role": "user", "content": "0="}], "99="]
COMPLETIONS = ["1", "3 abc de", "", "9 9 9 9 9 9 9 9 9 9 9"]


def chatml(prompt, completion: str) -> str:
    """The tiny tokenizer's ChatML rendering, written out by hand."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    turns = [*messages, {"role": "assistant", "content": completion}]
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)


def direct(path, texts: list[str], add_special_tokens: bool = False, keep: int | None = None) -> torch.Tensor:
    """``[B, num_labels]`` logits of each text on its own (batch of one, no padding)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = build_char_tokenizer()
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"][-keep if keep else 0 :]
            rows.append(model(input_ids=torch.tensor([ids])).logits[0])
    return torch.stack(rows)


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory):
    """The same random classifier saved twice: tokenizer padding on the right and on the left."""
    root = tmp_path_factory.mktemp("reward-models")
    return {side: str(save_tiny_reward_model(root / side, padding_side=side)) for side in ("right", "left")}


def _score(path, completions=COMPLETIONS, prompts=PROMPTS, **kwargs):
    rewards = RewardSet([RewardSpec("reward_model", kwargs={"model": path, **kwargs})])
    return rewards.score(completions, {"prompt": prompts}).rewards[:, 0]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_scores_equal_a_direct_forward(rm_dirs, side, batch_size):
    expected = direct(rm_dirs["right"], [chatml(p, c) for p, c in zip(PROMPTS, COMPLETIONS)])[:, 0]  # [B]
    assert expected.std() > 0.5  # the samples score differently, so a mix-up of rows would show
    scores = _score(rm_dirs[side], batch_size=batch_size)
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-5)


def test_rows_are_scored_independently_as_on_two_ranks(rm_dirs):
    """Under DDP every rank scores its own rows: half a batch scores as it does in the whole batch."""
    whole = _score(rm_dirs["right"], batch_size=4)
    halves = torch.cat(
        [_score(rm_dirs["right"], COMPLETIONS[:2], PROMPTS[:2]), _score(rm_dirs["right"], COMPLETIONS[2:], PROMPTS[2:])]
    )
    torch.testing.assert_close(halves, whole, rtol=0, atol=1e-5)


def test_device_auto_is_the_ranks_own_cuda_device(monkeypatch):
    """Lightning sets each DDP rank's CUDA device before training; ``auto`` follows it (CPU without CUDA)."""
    from lightning_grpo.data.reward_models import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert resolve_device("auto") == torch.device("cuda", 3)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


def test_weights_load_once_and_not_before_the_first_batch(rm_dirs, monkeypatch):
    from transformers import AutoModelForSequenceClassification

    loads = []
    original = AutoModelForSequenceClassification.from_pretrained

    def counting(*args, **kwargs):
        loads.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", counting)
    rewards = RewardSet([RewardSpec("reward_model", kwargs={"model": rm_dirs["right"], "batch_size": 2})])
    assert loads == []
    for _ in range(3):
        rewards.score(COMPLETIONS, {"prompt": PROMPTS})
    assert loads == [rm_dirs["right"]]
    rm = rewards.fns[0]
    assert rm.model.training is False and not any(p.requires_grad for p in rm.model.parameters())
    assert next(rm.model.parameters()).dtype == torch.float32  # dtype auto on CPU
    clone = pickle.loads(pickle.dumps(rm))  # ddp_spawn: the weights are not pickled, they reload
    assert clone._model is None and clone(["1"], prompt=["1234="]) == pytest.approx(
        rm(["1"], prompt=["1234="]), abs=1e-6
    )


def test_the_prompt_before_the_policy_template_is_preferred(rm_dirs):
    """Records carry ``prompt`` (the policy's chat-templated text) and ``raw_prompt`` (as the data
    holds it): the reward model renders ``raw_prompt`` with its own template."""
    rendered = [f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n" for p in ("a", "b", "c", "d")]
    rewards = RewardSet([RewardSpec("reward_model", kwargs={"model": rm_dirs["right"]})])
    scores = rewards.score(COMPLETIONS, {"prompt": rendered, "raw_prompt": PROMPTS}).rewards[:, 0]
    torch.testing.assert_close(scores, _score(rm_dirs["right"]), rtol=0, atol=1e-6)
    chosen = RewardSet([RewardSpec("reward_model", kwargs={"model": rm_dirs["right"], "prompt_column": "question"})])
    named = chosen.score(COMPLETIONS, {"prompt": rendered, "question": PROMPTS}).rewards[:, 0]
    torch.testing.assert_close(named, scores, rtol=0, atol=1e-6)


def test_plain_text_and_truncation_keep_the_scored_end(rm_dirs):
    texts = [p + c for p, c in zip(PROMPTS[:2], COMPLETIONS[:2])]
    scores = _score(rm_dirs["right"], COMPLETIONS[:2], PROMPTS[:2], chat_template=False)
    torch.testing.assert_close(
        scores, direct(rm_dirs["right"], texts, add_special_tokens=True)[:, 0], rtol=0, atol=1e-5
    )
    long = [chatml(p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    cut = _score(rm_dirs["left"], max_length=20)
    torch.testing.assert_close(cut, direct(rm_dirs["right"], long, keep=20)[:, 0], rtol=0, atol=1e-5)


def test_a_classifier_scores_one_label_after_the_activation(tmp_path):
    path = str(save_tiny_reward_model(tmp_path / "rm3", num_labels=3, seed=1))
    logits = direct(path, [chatml(p, c) for p, c in zip(PROMPTS, COMPLETIONS)])  # [B, 3]
    torch.testing.assert_close(_score(path, label=2), logits[:, 2], rtol=0, atol=1e-5)
    torch.testing.assert_close(
        _score(path, label="LABEL_1", activation="softmax"), logits.softmax(-1)[:, 1], rtol=0, atol=1e-6
    )
    torch.testing.assert_close(_score(path, label=0, activation="sigmoid"), logits[:, 0].sigmoid(), rtol=0, atol=1e-6)


def test_logged_under_its_name_with_its_weight(rm_dirs):
    rewards = RewardSet(
        [RewardSpec("reward_model", weight=0.5, kwargs={"model": rm_dirs["right"]}), RewardSpec("exact_match")]
    )
    out = rewards.score(COMPLETIONS, {"prompt": PROMPTS, "answer": ["1", "2", "", "9"]})
    assert out.names == ["reward_model", "exact_match"] and out.weights.tolist() == [0.5, 1.0]
    assert out.metrics()["reward/reward_model/mean"] == pytest.approx(out.rewards[:, 0].mean().item())
    assert rewards.totals() == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"reward 'reward_model' needs kwargs \['model'\]"),
        ({"batchsize": 4}, r"reward 'reward_model': unknown kwargs \['batchsize'\]; its options are \[.*'batch_size'"),
        (
            {"model": "/no/such/dir"},
            r"reward 'reward_model': kwargs.model '/no/such/dir' is not a model directory with a config.json",
        ),
        ({"batch_size": 0}, r"reward 'reward_model': kwargs.batch_size must be an integer >= 1, got 0"),
        ({"dtype": "fp8"}, r"kwargs.dtype must be one of 'auto', 'float32', 'bfloat16', 'float16', got 'fp8'"),
        ({"device": "tpu:x"}, r"kwargs.device must be 'auto', 'cpu', 'cuda' or 'cuda:<index>', got 'tpu:x'"),
        ({"max_length": 0}, r"kwargs.max_length must be an integer >= 1 or null, got 0"),
        ({"chat_template": "yes"}, r"kwargs.chat_template must be true or false, got 'yes'"),
        ({"label": 1}, r"kwargs.label must be null or 0 for a model with num_labels 1, got 1"),
        ({"activation": "softmax"}, r"kwargs.activation 'softmax' over one label is always 1"),
        ({"activation": "tanh"}, r"kwargs.activation must be one of 'none', 'sigmoid', 'softmax', got 'tanh'"),
        ({"tokenizer": "/no/tok"}, r"kwargs.tokenizer: cannot load a tokenizer from '/no/tok'"),
    ],
)
def test_bad_options_name_the_option(rm_dirs, kwargs, message):
    if kwargs and "model" not in kwargs:
        kwargs = {"model": rm_dirs["right"], **kwargs}
    with pytest.raises(ValueError, match=message):
        RewardSet([RewardSpec("reward_model", kwargs=kwargs)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_asked_for_where_there_is_none(rm_dirs):
    with pytest.raises(
        ValueError, match=r"kwargs.device is 'cuda:0' but CUDA is not available here \(use 'auto' or 'cpu'\)"
    ):
        RewardSet([RewardSpec("reward_model", kwargs={"model": rm_dirs["right"], "device": "cuda:0"})])


def test_checkpoints_that_are_not_classifiers_are_refused(tiny_model_path, tmp_path):
    message = r"is a Qwen2ForCausalLM checkpoint, not a sequence classifier \(its score head would be random\)"
    with pytest.raises(ValueError, match=message):
        RewardSet([RewardSpec("reward_model", kwargs={"model": str(tiny_model_path)})])
    three = str(save_tiny_reward_model(tmp_path / "rm3", num_labels=3))
    with pytest.raises(ValueError, match=r"kwargs.label is needed: the model has num_labels 3 \(\{0: 'LABEL_0'"):
        RewardSet([RewardSpec("reward_model", kwargs={"model": three})])
    message = r"kwargs.label must be an index in \[0, 3\) or one of \['LABEL_0', 'LABEL_1', 'LABEL_2'\], got 'good'"
    with pytest.raises(ValueError, match=message):
        RewardSet([RewardSpec("reward_model", kwargs={"model": three, "label": "good"})])


def test_a_tokenizer_without_chat_template_needs_plain_text(rm_dirs, tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match=r"tokenizer '.*plain' has no chat template; set kwargs.chat_template: false"):
        RewardSet(
            [RewardSpec("reward_model", kwargs={"model": rm_dirs["right"], "tokenizer": str(tmp_path / "plain")})]
        )
    plain = {"model": rm_dirs["right"], "tokenizer": str(tmp_path / "plain"), "chat_template": False}
    assert RewardSet([RewardSpec("reward_model", kwargs=plain)]).score(["1"], {"prompt": ["1="]}).rewards.shape == (
        1,
        1,
    )


def test_missing_or_wrong_prompts_at_scoring_time(rm_dirs):
    rewards = RewardSet([RewardSpec("reward_model", kwargs={"model": rm_dirs["right"], "prompt_column": "question"})])
    message = r"reward function 'reward_model': prompt_column 'question' is not a column of the data; columns: \['answer', 'prompt'\]"
    with pytest.raises(RewardError, match=message):
        rewards.score(["1"], {"prompt": ["1="], "answer": ["1"]})
    plain = RewardSet([RewardSpec("reward_model", kwargs={"model": rm_dirs["right"], "chat_template": False})])
    with pytest.raises(RewardError, match=r"chat_template is false but prompt 0 is a list, not text"):
        plain.score(["1"], {"prompt": [[{"role": "user", "content": "1="}]]})


class CallCounter:
    """A user's stateful reward class: built once, it counts the batches it scored."""

    def __init__(self, bonus: float = 0.0):
        if bonus < 0:
            raise ValueError(f"kwargs.bonus must be >= 0, got {bonus}")
        self.bonus, self.batches = bonus, 0

    def __call__(self, completions, **columns):
        self.batches += 1
        return [self.batches + self.bonus] * len(completions)


def test_a_reward_class_is_built_once_with_its_kwargs():
    rewards = RewardSet(
        [RewardSpec(f"{__name__}:CallCounter", kwargs={"bonus": 0.5}), RewardSpec(CallCounter, alias="plain")]
    )
    assert rewards.names == ["CallCounter", "plain"]
    assert [rewards.score(["a"]).rewards[0].tolist() for _ in range(3)] == [[1.5, 1.0], [2.5, 2.0], [3.5, 3.0]]
    with pytest.raises(
        ValueError, match=r"reward 'CallCounter': unknown kwargs \['bonsu'\]; its options are \['bonus'\]"
    ):
        RewardSet([RewardSpec(f"{__name__}:CallCounter", kwargs={"bonsu": 1})])
    with pytest.raises(ValueError, match=r"reward 'CallCounter': kwargs.bonus must be >= 0, got -1"):
        RewardSet([RewardSpec(f"{__name__}:CallCounter", kwargs={"bonus": -1})])
