"""RankWatch leaves the user's signal handlers alone unless asked, and restores them when asked."""

import signal
from types import SimpleNamespace

import pytest

from lightning_grpo.callbacks.distributed import RankWatch


def _trainer():
    strategy = SimpleNamespace(launcher=SimpleNamespace(procs=[]))
    return SimpleNamespace(
        world_size=2, global_rank=0, node_rank=0, num_devices=2, local_rank=0, global_step=0, strategy=strategy
    )


def _mine(signum, frame):  # a user's handler
    pass


@pytest.fixture
def user_handler():
    before = signal.signal(signal.SIGTERM, _mine)
    yield
    signal.signal(signal.SIGTERM, before)


def test_without_handle_signals_the_users_handler_stays(user_handler):
    watch, trainer = RankWatch(), _trainer()
    watch.on_train_start(trainer, None)
    try:
        assert signal.getsignal(signal.SIGTERM) is _mine
        assert signal.set_wakeup_fd(-1) == -1  # no wake-up fd was set either
    finally:
        watch.teardown(trainer, None, "fit")


def test_handle_signals_replaces_the_handler_for_the_fit_and_restores_it(user_handler):
    watch, trainer = RankWatch(handle_signals=True), _trainer()
    watch.on_train_start(trainer, None)
    try:
        assert signal.getsignal(signal.SIGTERM) is not _mine
    finally:
        watch.teardown(trainer, None, "fit")
    assert signal.getsignal(signal.SIGTERM) is _mine
    assert signal.set_wakeup_fd(-1) == -1  # the wake-up fd is released


def test_one_process_runs_are_not_watched(user_handler):
    watch, trainer = RankWatch(handle_signals=True), _trainer()
    trainer.world_size = 1
    watch.on_train_start(trainer, None)
    assert signal.getsignal(signal.SIGTERM) is _mine


def test_the_command_line_attaches_one_rank_watch_that_handles_signals(tmp_path, tiny_model_path, monkeypatch):
    """``lightning-grpo fit`` adds RankWatch(handle_signals=True); a recipe that lists its own keeps only that one."""
    from pathlib import Path

    from tests.helpers.bad_input import cli

    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml")
    common = ["-c", recipe, "--rollout.engine=hf", "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    watches = [c for c in cli(common, run=False).trainer.callbacks if isinstance(c, RankWatch)]
    assert len(watches) == 1 and watches[0].handle_signals
    own = '--trainer.callbacks+={"class_path": "lightning_grpo.callbacks.distributed.RankWatch", "init_args": {"grace": 7.0}}'
    watches = [c for c in cli([*common, own], run=False).trainer.callbacks if isinstance(c, RankWatch)]
    assert [(w.grace, w.handle_signals) for w in watches] == [(7.0, False)]
