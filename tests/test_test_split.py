"""The test split (docs/tuning.md): the rows it holds are none of the training or dev (validation) rows, adding it
changes neither of those, and ``lightning-grpo test --ckpt_path`` reports ``test/*`` on it."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from lightning_grpo.data.tasks import digit_splits, digit_task

from tests.bad_input_helpers import cli, tiny_cache  # noqa: F401
from tests.run_helpers import ROOT, train_recipe


def _prompts(rows) -> set[str]:
    return {r["prompt"] for r in rows}


#: sha256 of json.dumps(digit_task(seed, 300, 50, rule)) before the test split existed: adding it moved no prompt.
BEFORE = {
    ("last_plus_one", 0): "9647b28e1e65beb93f0fc8f414339b65107ecd15e5c99f9d067d139de58760f9",
    ("count_to_last", 4): "0c8cb49b8a7e1cddd413c15a874f275de7a705ae7b94452a842589e915791efb",
}


@pytest.mark.parametrize(("rule", "seed"), list(BEFORE))
def test_digit_test_split_is_new_prompts_and_moves_no_training_or_dev_prompt(rule, seed):
    for num_test in (0, 7, 50):  # whatever the test split's size
        train, val, _ = digit_splits(seed, 300, 50, num_test, rule)
        assert hashlib.sha256(json.dumps([train, val]).encode()).hexdigest() == BEFORE[(rule, seed)], num_test
    train, val, test = digit_splits(seed, 300, 50, 50, rule)
    assert [train, val] == list(digit_task(seed, 300, 50, rule))
    assert len(_prompts(test)) == 50
    assert _prompts(test) & _prompts(train) == set() and _prompts(test) & _prompts(val) == set()
    counts = sorted({a: sum(r["answer"] == a for r in test) for a in {r["answer"] for r in test}}.values())
    assert counts == [5] * 10  # balanced over the ten answers, as the other splits


pytestmark = pytest.mark.usefixtures("tiny_cache")


def _greedy_accuracy(model_dir, rows) -> float:
    """prefix_match of the model's greedy 2-token completions, computed here with transformers' generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([tok(r["prompt"]).input_ids for r in rows])  # [N, 5] (every prompt is 5 characters)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)
    texts = tok.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    return sum(t.lstrip().startswith(r["answer"]) for t, r in zip(texts, rows)) / len(rows)


def test_test_stage_reports_the_test_split_of_a_checkpoint(tmp_path, tiny_model_path):
    """Train the quickstart 3 steps, put a half-taught teacher's weights into its last.ckpt, then
    ``lightning-grpo test --ckpt_path`` it: ``test/greedy_accuracy`` is the teacher's accuracy on the 50 test
    prompts as transformers computes it, which differs from its accuracy on the dev prompts (so the number tells
    which split was read) and from the untrained model's (so it tells the checkpoint was loaded)."""
    from lightning_grpo.data.tasks import digit_splits
    from tests.distill_helpers import train_digit_teacher

    teacher = train_digit_teacher(tiny_model_path, tmp_path / "teacher", steps=15)  # part-way: about 0.2 accuracy
    _, run_dir = train_recipe(tmp_path, "quickstart.yaml", 3)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(teacher).state_dict()
    checkpoint["state_dict"].update({k: weights[k.removeprefix("policy.")].clone() for k in checkpoint["state_dict"] if k.startswith("policy.")})
    torch.save(checkpoint, tmp_path / "teacher.ckpt")

    logger = '{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "%s", "name": "test"}}' % (tmp_path / "runs")
    args = ["test", "-c", str(ROOT / "recipes" / "quickstart.yaml"), "--ckpt_path", str(tmp_path / "teacher.ckpt"),
            "--rollout.engine=hf", "--rollout.vllm_args=null", "--rollout.val_samples=0", "--data.val_batch_size=20",
            "--trainer.enable_progress_bar=false", f"--trainer.logger={logger}"]  # fmt: skip
    metrics = {k: float(v) for k, v in cli(args).trainer.callback_metrics.items()}
    _, dev, test = digit_splits(0, 300, 50, 50)
    expected, on_dev = _greedy_accuracy(teacher, test), _greedy_accuracy(teacher, dev)
    assert sorted(metrics) == ["test/greedy_accuracy"]
    assert metrics["test/greedy_accuracy"] == pytest.approx(expected, abs=1e-6)
    assert expected != on_dev and expected != _greedy_accuracy(tiny_model_path, test), (expected, on_dev)
