"""CurriculumCallback: raises a task's level when its accuracy reaches the threshold, logs, resumes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lightning_grpo.callbacks.curriculum import CurriculumCallback, CurriculumSource
from lightning_grpo.callbacks.rollout import RolloutCallback


class LevelSource:
    """A source with two curriculum tasks of levels 0..2 (what ReasoningGymSource exposes)."""

    def __init__(self) -> None:
        self.levels = {"add": 0, "spell": 0}

    def curriculum_tasks(self) -> list[str]:
        return list(self.levels)

    def level(self, name: str) -> int:
        return self.levels[name]

    def max_level(self, name: str) -> int:
        return 2

    def set_level(self, name: str, level: int) -> None:
        self.levels[name] = level

    def train_rows(self) -> list[dict]:
        return [{"task": t, "level": lv, "prompt": f"{t}{i}"} for t, lv in self.levels.items() for i in range(3)]


class DataModule:
    def __init__(self) -> None:
        self.source = LevelSource()
        self.refreshes = 0
        self.train_records = self.source.train_rows()

    def refresh_train(self) -> None:
        self.refreshes += 1
        self.train_records = self.source.train_rows()


class Module:
    """Greedy accuracy per task from ``accuracy``; records what the callback evaluates."""

    def __init__(self, accuracy: dict[str, float]) -> None:
        self.accuracy, self.evaluated = accuracy, []

    def evaluator(self, module, records):
        (task,) = {r["task"] for r in records}
        self.evaluated.append((task, len(records), {r["level"] for r in records}))
        return {"val/greedy_accuracy": self.accuracy[task], "val/reward_mean": 0.0}


class Logger:
    """What the callback writes to a logger: (step, metrics) per call."""

    def __init__(self) -> None:
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, metrics))


class Rollout(RolloutCallback):
    """The rollout callback's evaluator, answered by the stand-in module (no engine)."""

    def __init__(self) -> None:  # no engine, no settings
        pass

    def evaluate(self, module, records, split="val"):
        return module.evaluator(module, records)


def trainer(dm, step=0):
    broadcast = SimpleNamespace(broadcast=lambda obj, src=0: obj)
    return SimpleNamespace(
        datamodule=dm, global_step=step, global_rank=0, strategy=broadcast, loggers=[Logger()], callbacks=[Rollout()]
    )


def run_steps(callback, tr, module, steps):
    for step in steps:
        tr.global_step = step
        callback.on_train_batch_end(tr, module, None, None, step)


def test_raises_the_level_past_the_threshold_logs_and_refreshes():
    dm, module = DataModule(), Module({"add": 0.9, "spell": 0.5})
    tr = trainer(dm)
    callback = CurriculumCallback(threshold=0.8, check_every_n_steps=10, eval_prompts=2)
    callback.setup(tr, module, "fit")
    run_steps(callback, tr, module, range(10))  # no check before step 10 (and never at step 0)
    assert module.evaluated == [] and dm.refreshes == 0
    run_steps(callback, tr, module, [10, 10])  # two micro-batches ending at step 10: one check
    assert module.evaluated == [("add", 2, {0}), ("spell", 2, {0})]
    assert dm.source.levels == {"add": 1, "spell": 0} and dm.refreshes == 1
    assert {r["level"] for r in dm.train_records if r["task"] == "add"} == {1}  # the rows were re-read
    assert tr.loggers[0].rows == [
        (
            10,
            {
                "curriculum/add/accuracy": 0.9,
                "curriculum/add/level": 1.0,
                "curriculum/spell/accuracy": 0.5,
                "curriculum/spell/level": 0.0,
            },
        )
    ]
    assert callback.raises == [{"step": 10, "task": "add", "accuracy": 0.9, "level": 1}]
    module.accuracy["spell"] = 0.8  # exactly the threshold counts
    run_steps(callback, tr, module, range(11, 31))
    assert dm.source.levels == {"add": 2, "spell": 2} and dm.refreshes == 3  # steps 20 (both) and 30 (spell)
    assert module.evaluated[-2:] == [("add", 2, {2}), ("spell", 2, {1})]  # at step 30: the levels reached at step 20
    run_steps(callback, tr, module, [40])  # at the top level: no raise, no refresh
    assert dm.source.levels == {"add": 2, "spell": 2} and dm.refreshes == 3 and len(callback.raises) == 4


def test_state_round_trip_resumes_the_levels():
    dm, module = DataModule(), Module({"add": 1.0, "spell": 0.0})
    tr = trainer(dm)
    callback = CurriculumCallback(check_every_n_steps=5)
    callback.setup(tr, module, "fit")
    run_steps(callback, tr, module, [5])
    state = callback.state_dict()
    assert state == {
        "levels": {"add": 1, "spell": 0},
        "raises": [{"step": 5, "task": "add", "accuracy": 1.0, "level": 1}],
    }

    fresh_dm = DataModule()  # a resumed run: the data module was set up at the recipe's levels
    resumed = CurriculumCallback(check_every_n_steps=5)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # before setup too
    resumed.setup(trainer(fresh_dm), module, "fit")
    resumed.on_train_start(trainer(fresh_dm, step=5), module)
    assert fresh_dm.source.levels == {"add": 1, "spell": 0} and fresh_dm.refreshes == 1
    assert {r["level"] for r in fresh_dm.train_records if r["task"] == "add"} == {1}
    assert resumed.state_dict() == state
    resumed.on_train_start(trainer(fresh_dm, step=5), module)  # applied once
    assert fresh_dm.refreshes == 1


def test_needs_a_source_with_levels():
    assert isinstance(LevelSource(), CurriculumSource)
    dm = DataModule()
    dm.source = object()
    with pytest.raises(
        RuntimeError, match="CurriculumCallback needs a PromptDataModule whose data.source has curriculum levels"
    ):
        CurriculumCallback().setup(trainer(dm), Module({}), "fit")
    dm = DataModule()
    dm.source.levels = {}
    with pytest.raises(ValueError, match="no task of data.source follows a curriculum"):
        CurriculumCallback().setup(trainer(dm), Module({}), "fit")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"threshold": 0}, r"threshold must be a number in \(0, 1\], got 0"),
        ({"threshold": 1.5}, r"threshold must be a number in \(0, 1\], got 1.5"),
        ({"check_every_n_steps": 0}, r"check_every_n_steps must be an integer >= 1, got 0"),
        ({"eval_prompts": 2.5}, r"eval_prompts must be an integer >= 1, got 2.5"),
    ],
)
def test_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CurriculumCallback(**kwargs)
