"""The test split (docs/evidence/tuning.md): the rows it holds are none of the training or dev (validation) rows, adding it
changes neither of those, and ``lightning-grpo test --ckpt_path`` reports ``test/*`` on it."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from lightning_grpo.data.tasks import digit_splits, digit_task
from tests.helpers.bad_input import HF_ENGINE, cli
from tests.helpers.runs import ROOT, train_recipe


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
    texts = tok.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return sum(t.lstrip().startswith(r["answer"]) for t, r in zip(texts, rows)) / len(rows)


def test_test_stage_reports_the_test_split_of_a_checkpoint(tmp_path, tiny_model_path):
    """Train the quickstart 3 steps, put a half-taught teacher's weights into its last.ckpt, then
    ``lightning-grpo test --ckpt_path`` it: ``test/greedy_accuracy`` is the teacher's accuracy on the 50 test
    prompts as transformers computes it, which differs from its accuracy on the dev prompts (so the number tells
    which split was read) and from the untrained model's (so it tells the checkpoint was loaded)."""
    from lightning_grpo.data.tasks import digit_splits
    from tests.helpers.distill import train_digit_teacher

    teacher = train_digit_teacher(tiny_model_path, tmp_path / "teacher", steps=15)  # part-way: about 0.2 accuracy
    _, run_dir = train_recipe(tmp_path, "quickstart.yaml", 3)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(teacher).state_dict()
    checkpoint["state_dict"].update(
        {k: weights[k.removeprefix("policy.")].clone() for k in checkpoint["state_dict"] if k.startswith("policy.")}
    )
    torch.save(checkpoint, tmp_path / "teacher.ckpt")

    logger = (
        '{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "%s", "name": "test"}}'
        % (tmp_path / "runs")
    )
    args = [
        "test",
        "-c",
        str(ROOT / "recipes" / "quickstart.yaml"),
        "--ckpt_path",
        str(tmp_path / "teacher.ckpt"),
        *HF_ENGINE,
        "--rollout.evaluation.samples=0",
        "--data.val_batch_size=20",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger={logger}",
    ]
    metrics = {k: float(v) for k, v in cli(args).trainer.callback_metrics.items()}
    _, dev, test = digit_splits(0, 300, 50, 50)
    expected, on_dev = _greedy_accuracy(teacher, test), _greedy_accuracy(teacher, dev)
    assert sorted(metrics) == ["test/greedy_accuracy"]
    assert metrics["test/greedy_accuracy"] == pytest.approx(expected, abs=1e-6)
    assert expected != on_dev and expected != _greedy_accuracy(tiny_model_path, test), (expected, on_dev)
    # --ckpt_path last: the newest checkpoint of the logger's run folder, as fit resolves it
    newest = tmp_path / "runs" / "test" / "version_0" / "checkpoints" / "last.ckpt"
    newest.parent.mkdir(parents=True)
    shutil.copy(tmp_path / "teacher.ckpt", newest)
    args[args.index("--ckpt_path") + 1] = "last"
    again = cli(args)
    assert again.config["test"]["ckpt_path"] == str(newest)
    assert float(again.trainer.callback_metrics["test/greedy_accuracy"]) == pytest.approx(expected, abs=1e-6)


class _Recorder:
    """An environment that records the reset seed of every episode it opens."""

    seeds: list[int] = []

    def reset(self, record, seed):
        _Recorder.seeds.append(seed)
        return None  # the record's own prompt


def _reset_seeds(episode_seed: int, episodes: int) -> set[int]:
    """The reset seeds of ``episodes`` episodes started with ``episode_seed`` (one per episode)."""
    from lightning_grpo.agents.episodes import start_episodes

    _Recorder.seeds = []
    start_episodes(_Recorder, [{"prompt_ids": [1]}] * episodes, 1, episode_seed, None, None, reset_seed="episode")
    return set(_Recorder.seeds)


@pytest.mark.parametrize("run_seed", [0, 1, 2])
def test_test_episodes_are_none_of_the_training_or_dev_episodes(run_seed):
    """recipes/tool_quickstart.yaml's schedule: 2000 training generations of 8 records x 8 episodes, a dev check
    of 50 episodes every 100 steps, 50 test episodes: the test episodes' reset seeds (which draw each secret)
    are none of the training or dev episodes' (the secret itself has 10 values), and stay the same whatever
    checkpoint (global step) is tested."""
    from types import SimpleNamespace

    from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
    from lightning_grpo.rollout.base import derive_seed

    callback = AgentRolloutCallback(
        agent=AgentSettings(reset_seed="episode", allow_mixed_task_groups=True), seed=run_seed
    )

    def module(step):
        return SimpleNamespace(trainer=SimpleNamespace(global_rank=0, global_step=step))

    rounds = callback.max_generation_rounds
    train = set().union(*(_reset_seeds(derive_seed(run_seed, 0, g * rounds), 64) for g in range(2000)))
    dev = set().union(*(_reset_seeds(callback.episode_seed(module(step), "val"), 50) for step in range(0, 2001, 100)))
    test = _reset_seeds(callback.episode_seed(module(2000), "test"), 50)
    assert (
        len(train) > 2000 * 64 - 20 and len(dev) == 21 * 50 and len(test) == 50
    )  # 31-bit seeds: a few training repeats
    assert test & train == set() and test & dev == set()
    assert _reset_seeds(callback.episode_seed(module(7), "test"), 50) == test  # the checkpoint's step has no say


def test_data_module_test_split_from_files_and_rows(tmp_path, tiny_model_path):
    """test_files / Rows(test=...) become test_records (the test dataloader's), the training and dev records stay;
    without a test split ``test_dataloader`` names the options that give one."""
    from lightning_grpo import PromptDataModule
    from lightning_grpo.data.sources import Rows
    from lightning_grpo.data.tasks import DigitTask

    train, val, test = digit_splits(0, 16, 4, 6)
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in test))
    train_path, val_path = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train_path.write_text("".join(json.dumps(r) + "\n" for r in train))
    val_path.write_text("".join(json.dumps(r) + "\n" for r in val))
    files = {"train_files": str(train_path), "val_files": str(val_path), "test_files": str(path)}
    for dm in (
        PromptDataModule(tokenizer_path=str(tiny_model_path), batch_size=4, **files),
        PromptDataModule(Rows(train, val=val, test=test), tokenizer_path=str(tiny_model_path), batch_size=4),
    ):
        dm.setup()
        assert [r["prompt"] for r in dm.test_records] == [r["prompt"] for r in test]
        assert [r["prompt"] for r in dm.val_records] == [r["prompt"] for r in val]
        assert [r["prompt"] for batch in dm.test_dataloader() for r in batch] == [r["prompt"] for r in test]
    dm = PromptDataModule(source=Rows(train), tokenizer_path=str(tiny_model_path), batch_size=4)
    dm.setup()
    with pytest.raises(
        ValueError,
        match=r"lightning-grpo test needs a test split, and \(no test split\) has none: give data.test_files",
    ):
        dm.test_dataloader()
    digits = PromptDataModule(DigitTask(num_test=0), tokenizer_path=str(tiny_model_path))
    digits.setup()
    with pytest.raises(ValueError, match=r"the digit task's test split has none"):
        digits.test_dataloader()


def test_sft_test_stage_is_validation_on_the_test_split(tiny_model_path):
    """``SFTModule`` on the test split logs ``test/*`` equal to what validating on those rows logs as ``val/*``."""
    import lightning as L

    from lightning_grpo import Rows, SFTDataModule, SFTModule

    train, val, test = digit_splits(0, 16, 8, 8)

    def run(stage, val, test=None):
        dm = SFTDataModule(source=Rows(train, val=val, test=test), tokenizer_path=str(tiny_model_path), batch_size=4)
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
        getattr(trainer, stage)(SFTModule(model=str(tiny_model_path)), datamodule=dm)
        return {k: float(v) for k, v in trainer.callback_metrics.items()}

    tested = run("test", val, test)
    on_test, on_dev = run("validate", test), run("validate", val)
    assert sorted(tested) == ["test/accuracy", "test/loss", "test/token_accuracy"]
    assert tested == {k.replace("val/", "test/"): v for k, v in on_test.items()}
    assert tested["test/loss"] != on_dev["val/loss"]  # the two splits give different numbers
