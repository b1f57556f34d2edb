"""Callbacks find each other by class (:func:`~lightning_grpo.callbacks.lookup.find_callback`), not by
sniffing attributes: a look-alike callback is never taken for the rollout callback, a subclass is."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest

from lightning_grpo import RolloutCallback, SamplingConfig, ZeroStdGuard
from lightning_grpo.callbacks.guards import _log_completions
from lightning_grpo.callbacks.lookup import find_callback


class MyRollout(RolloutCallback):
    """A user's subclass: still the rollout callback."""


class LookAlike(L.Callback):
    """Has the rollout callback's attributes, is not one."""

    def __init__(self):
        self.dynamic_sampling, self.switched = False, []
        self.selector = SimpleNamespace(dynamic_sampling=True)
        self.completion_log = SimpleNamespace(log_for_alarm=lambda trainer, module: "look-alike's table")

    def set_dynamic_sampling(self, on):
        self.switched.append(on)


def _rollout(cls=RolloutCallback):
    return cls(engine="hf", sampling=SamplingConfig(n=4, temperature=1.0))


def test_find_callback_by_class_subclasses_included():
    rollout, other = _rollout(MyRollout), LookAlike()
    trainer = SimpleNamespace(callbacks=[other, rollout])
    assert find_callback(trainer, RolloutCallback) is rollout
    assert find_callback(SimpleNamespace(callbacks=[other]), RolloutCallback, required=False) is None


def test_a_missing_required_callback_is_one_error_naming_it_and_who_needs_it():
    with pytest.raises(
        ValueError, match=r"ZeroStdGuard needs a RolloutCallback among Trainer\(callbacks=\.\.\.\): add one"
    ):
        find_callback(SimpleNamespace(callbacks=[LookAlike()]), RolloutCallback, needed_by=ZeroStdGuard())


def test_zero_std_remedy_and_message_ignore_a_look_alike():
    guard, other = ZeroStdGuard(), LookAlike()
    trainer = SimpleNamespace(callbacks=[other])
    assert guard.remedy(trainer, None) is None and other.switched == []
    assert "enable dynamic sampling" in guard._message(
        trainer, 0.9, 0.5, False
    )  # the look-alike's selector is not ours
    rollout = _rollout(MyRollout)
    trainer.callbacks.append(rollout)
    assert guard.remedy(trainer, None).startswith("dynamic sampling switched on") and rollout.dynamic_sampling
    assert "dynamic sampling is on" in guard._message(trainer, 0.9, 0.5, False)


def test_guards_have_only_the_rollout_callback_log_completions():
    other = LookAlike()
    assert _log_completions(SimpleNamespace(callbacks=[other]), None) is None
    rollout = _rollout()
    rollout.completion_log = SimpleNamespace(log_for_alarm=lambda trainer, module: "rollout's table")
    assert _log_completions(SimpleNamespace(callbacks=[other, rollout]), None) == "rollout's table"
