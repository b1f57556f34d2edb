"""The vLLM plugin entry (``lightning_grpo/vllm_entry.py``, the ``vllm.general_plugins`` entry point that
``engine: vllm_server`` declares in a generated dist-info): found by vLLM, and inert unless the launcher
switched it on."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from lightning_grpo.rollout.server_process import plugin_path


def test_generated_dist_info_declares_the_plugin_entry_point(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_path(tmp_path)))
    found = [
        ep for ep in entry_points(group="vllm.general_plugins") if ep.value == "lightning_grpo.vllm_entry:register"
    ]
    assert found and found[0].load().__module__ == "lightning_grpo.vllm_entry"


PLUGIN_PROBE = """
import sys
from lightning_grpo.vllm_entry import register
register()
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
print(sorted(k for k in WeightTransferEngineFactory._registry if k.startswith("lightning_grpo")),
      sorted(m for m in sys.modules if m.startswith("lightning_grpo.")))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("switch", [None, "1"])
def test_the_plugin_acts_only_where_the_launcher_switched_it_on(switch):
    """In a vLLM process this package did not start, the entry point registers nothing and imports
    nothing of the package; with LIGHTNING_GRPO_VLLM_PLUGIN=1 (set by the launcher) both backends."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_GRPO_VLLM_PLUGIN"}
    if switch:
        env["LIGHTNING_GRPO_VLLM_PLUGIN"] = switch
    done = subprocess.run([sys.executable, "-c", PLUGIN_PROBE], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    backends, modules = done.stdout.strip().splitlines()[-1].split("] [")
    if switch:
        assert "lightning_grpo_shm" in backends and "lightning_grpo_tcp" in backends
    else:
        assert backends == "[" and modules == "'lightning_grpo.vllm_entry']"
