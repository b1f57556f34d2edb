"""Held-out evaluation: the unbiased pass@k against hand-computed values and a loop over binomials,
``evaluate_prompts`` on scripted completions, and ``lightning-grpo validate`` on a quickstart checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo import RewardSpec, SamplingConfig
from lightning_grpo.callbacks.evaluation import evaluate_prompts, pass_at_k
from lightning_grpo.data.reward_set import RewardSet
from lightning_grpo.rollout.base import Rollout
from tests.helpers.bad_input import HF_ENGINE, cli
from tests.helpers.runs import ROOT, train_recipe


@pytest.mark.parametrize(
    ("c", "k", "expected"),
    [
        (2, 1, 2 / 5),
        (2, 2, 1 - 3 / 10),
        (2, 3, 1 - 1 / 10),
        (2, 4, 1.0),
        (0, 3, 0.0),
        (5, 5, 1.0),
        (1, 5, 1.0),
        (4, 1, 0.8),
    ],
)
def test_pass_at_k_hand_computed(c, k, expected):
    """n = 5: pass@k = 1 - C(5 - c, k) / C(5, k); e.g. c = 2, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3 / 10."""
    assert pass_at_k(torch.tensor([c]), 5, k).item() == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula():
    generator = torch.Generator().manual_seed(0)
    for n in (1, 4, 16, 64):
        correct = torch.randint(0, n + 1, (20,), generator=generator)
        for k in sorted({1, max(1, n // 2), n}):
            loop = [1.0 - math.comb(n - int(c), k) / math.comb(n, k) for c in correct]
            torch.testing.assert_close(
                pass_at_k(correct, n, k), torch.tensor(loop, dtype=torch.float64), atol=1e-12, rtol=0
            )
    with pytest.raises(ValueError, match=r"pass@k needs 1 <= k <= n \(samples per prompt\), got k=5, n=4"):
        pass_at_k(torch.tensor([1]), 4, 5)


pytestmark = pytest.mark.usefixtures("tiny_cache")


class ScriptedEngine:
    """Returns fixed completions: greedy (n = 1) ``greedy[p]``, sampled ``sampled[p]`` (n each)."""

    def __init__(self, tokenizer, greedy: list[str], sampled: list[list[str]]) -> None:
        self.tokenizer, self.greedy, self.sampled = tokenizer, greedy, sampled

    def generate(self, prompt_ids, sampling, seed):
        texts = self.greedy if sampling.n == 1 else [t for group in self.sampled for t in group]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id] for t in texts]
        return Rollout(
            prompt_ids=prompt_ids,
            completion_ids=ids,
            logprobs=[[0.0] * len(i) for i in ids],
            finished=[True] * len(ids),
            group_size=sampling.n,
        )


def test_evaluate_prompts_reports_pass_at_k_and_mean_at_n(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    records = [{"prompt_ids": [5, 6], "answer": "3"}, {"prompt_ids": [7, 8], "answer": "4"}]
    engine = ScriptedEngine(tokenizer, greedy=["3", "9"], sampled=[["3", "3", "x", "y"], ["1", "2", "5", "6"]])
    rewards = RewardSet([RewardSpec("prefix_match"), RewardSpec("exact_match", weight=0.5)])
    out = evaluate_prompts(
        engine, rewards, tokenizer, records, SamplingConfig(n=4, max_new_tokens=2), 4, 0, pass_k=[1, 2, 4]
    )
    assert out["val/greedy_accuracy"] == 0.5
    assert out["val/mean@4"] == pytest.approx((2 / 4 + 0) / 2)
    assert out["val/pass@1"] == pytest.approx(0.25)
    assert out["val/pass@2"] == pytest.approx((1 - 1 / 6 + 0) / 2)  # prompt 0: 1 - C(2, 2) / C(4, 2)
    assert out["val/pass@4"] == pytest.approx(0.5)
    assert out["val/reward_mean"] == pytest.approx((2 * 1.5 + 0) / 8)  # prefix + 0.5 exact on the two "3"
    # each function apart (two of them): greedy "3" / "9" for answers 3 / 4; sampled "3", "3" right of 8
    assert {k: v for k, v in out.items() if k.count("/") == 2} == {
        "val/greedy/prefix_match": 0.5,
        "val/greedy/exact_match": 0.5,
        "val/mean@4/prefix_match": 0.25,
        "val/mean@4/exact_match": 0.25,
    }


def _validate(tmp_path, *args: str) -> dict[str, float]:
    """``lightning-grpo validate`` of the quickstart recipe (HF engine, 50 held-out prompts, 8 samples each)."""
    logger = '{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "%s", "name": "val"}}' % (
        tmp_path / "runs"
    )
    args = [
        "validate",
        "-c",
        str(ROOT / "recipes" / "quickstart.yaml"),
        *args,
        *HF_ENGINE,
        "--rollout.evaluation.samples=8",
        "--rollout.evaluation.pass_k=[1,2,8]",
        "--data.val_batch_size=50",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger={logger}",
    ]
    return {k: float(v) for k, v in cli(args).trainer.callback_metrics.items()}


def test_validate_a_quickstart_checkpoint(tmp_path, digit_teacher_path):
    """Train 3 steps (validation at the last), put the digit teacher's weights into the run's
    last.ckpt, then ``lightning-grpo validate --ckpt_path`` it: the teacher's greedy accuracy (what
    validating the teacher's folder gives), far from the run's own (a validate that ignored the
    checkpoint would report the untrained policy's), and pass@k that rises with k up to 1."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.cli import report

    _, run_dir = train_recipe(tmp_path, "quickstart.yaml", 3)
    untrained = report.load_run(run_dir).series["val/greedy_accuracy"][-1][1]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    teacher = AutoModelForCausalLM.from_pretrained(digit_teacher_path).state_dict()
    state = checkpoint["state_dict"]
    policy_keys = [k for k in state if k.startswith("policy.")]
    assert sorted(k.removeprefix("policy.") for k in policy_keys) == sorted(teacher)
    state.update({k: teacher[k.removeprefix("policy.")].clone() for k in policy_keys})
    torch.save(checkpoint, tmp_path / "teacher.ckpt")

    metrics = _validate(tmp_path, "--ckpt_path", str(tmp_path / "teacher.ckpt"))
    taught = _validate(tmp_path, f"--model.model={digit_teacher_path}")["val/greedy_accuracy"]
    assert metrics["val/greedy_accuracy"] == taught
    assert taught - untrained > 0.5, (taught, untrained)  # the comparison tells the two policies apart
    assert metrics["val/pass@1"] == pytest.approx(metrics["val/mean@8"], abs=1e-6)  # pass / fail reward: pass@1 = mean
    assert metrics["val/pass@1"] <= metrics["val/pass@2"] <= metrics["val/pass@8"] <= 1.0
    assert metrics["val/pass@8"] > 0
