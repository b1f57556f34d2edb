"""BatchGeometry: the derived numbers of one generation batch (the docstring's worked example)."""

import pytest
import torch

from lightning_grpo.core.batch import BatchGeometry, micro_step


def test_the_worked_example():
    g = BatchGeometry(prompts=8, group_size=8, num_iterations=2, steps_per_generation=2, accumulate=2)
    assert (g.rows, g.optimizer_steps, g.training_steps) == (64, 4, 8)
    assert [g.generation(s) for s in (0, 3, 4, 7, 8)] == [0, 0, 1, 1, 2]
    step = g.micro_step(64, 5)  # second pass (5 // 4 = 1), mini-batch 0 (5 // 2 % 2), micro 1 (5 % 2)
    assert step.iteration == 1
    assert torch.equal(step.mini, torch.arange(32)) and torch.equal(step.micro, torch.arange(16, 32))


def test_micro_steps_match_the_function_for_every_step():
    g = BatchGeometry(prompts=3, group_size=4, num_iterations=3, steps_per_generation=2, accumulate=3)
    for s in range(g.training_steps):
        a, b = g.micro_step(g.rows, s), micro_step(g.rows, s, 2, 3)
        assert a.iteration == b.iteration and torch.equal(a.micro, b.micro) and torch.equal(a.mini, b.mini)


@pytest.mark.parametrize("field", ["prompts", "group_size", "num_iterations", "steps_per_generation", "accumulate"])
def test_non_positive_values_are_refused_by_name(field):
    with pytest.raises(ValueError, match=f"BatchGeometry.{field} must be an integer >= 1, got 0"):
        BatchGeometry(**{field: 0})
