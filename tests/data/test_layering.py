"""The data layer knows neither the rollout engines nor the trainer's callbacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "lightning_grpo" / "data"

PROBE = """
import importlib, json, pkgutil, sys
import lightning_grpo.data as data
names = [m.name for m in pkgutil.iter_modules(data.__path__, "lightning_grpo.data.")]
for name in names:
    importlib.import_module(name)
layers = ("lightning_grpo.rollout", "lightning_grpo.callbacks", "lightning_grpo.checks.validation", "lightning_grpo.training.module", "vllm")
print(json.dumps({"imported": names, "forbidden": sorted(m for m in sys.modules if m.startswith(layers))}))
"""


def test_importing_the_data_layer_loads_no_engine_and_no_callback():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out["imported"]) == {f"lightning_grpo.data.{p.stem}" for p in DATA.glob("*.py") if p.stem != "__init__"}
    assert out["forbidden"] == [], f"the data layer imported {out['forbidden']}"


def test_no_data_module_imports_them_lazily_either():
    """Also imports inside functions (the old prepare_data imported the callbacks and validation)."""
    import ast
    from importlib.util import resolve_name

    banned = ("lightning_grpo.rollout", "lightning_grpo.callbacks", "lightning_grpo.checks.validation", "lightning_grpo.training.module")
    found = []
    for path in sorted(DATA.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [resolve_name("." * node.level + (node.module or ""), "lightning_grpo.data")]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names if n.startswith(banned)]
    assert found == []


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
