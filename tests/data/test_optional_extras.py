"""reasoning-gym is an optional extra of the data layer. (That the data layer knows neither the rollout
engines nor the trainer's callbacks, not even lazily, is the ``data-no-engine`` import-linter contract
in pyproject.toml.)"""

from __future__ import annotations

import json
import subprocess
import sys

WITHOUT_REASONING_GYM = """
import json, sys
sys.modules["reasoning_gym"] = None  # as if the reasoning-gym extra were not installed: importing it fails
import lightning_grpo, lightning_grpo.data, lightning_grpo.data.rewards
from lightning_grpo import CurriculumCallback, PromptDataModule
from lightning_grpo.data.reasoning_gym import ReasoningGymSource
from lightning_grpo.data.reward_set import RewardSet, RewardSpec
errors = []
for build in (lambda: ReasoningGymSource(tasks=[{"name": "spell_backward"}]), lambda: RewardSet([RewardSpec("reasoning_gym")])):
    try:
        build()
    except ImportError as err:
        errors.append(str(err))
print(json.dumps(errors))
"""


def test_reasoning_gym_is_optional():
    """Without the extra the package, the data layer and the curriculum callback import; using a
    reasoning-gym source or reward stops with one ImportError naming the extra."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_REASONING_GYM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    hint = "reasoning-gym tasks need the reasoning-gym package: pip install 'lightning-grpo[reasoning-gym]'"
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [hint, hint]
