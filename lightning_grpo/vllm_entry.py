"""vLLM plugin entry point (``vllm.general_plugins`` in ``pyproject.toml``).

vLLM loads every installed plugin in each of its processes. This one registers the weight transfer
backends ``lightning_grpo_shm`` and ``lightning_grpo_tcp`` (:mod:`lightning_grpo.rollout.vllm_plugin`)
only where :data:`ENV` is ``1``: the servers lightning-grpo starts set it, and a server you start
yourself for ``engine: vllm_server`` needs it in its environment. In any other vLLM process it
returns at once and imports nothing of this package.
"""

from __future__ import annotations

import os

#: The variable that switches the plugin on in a vLLM process.
ENV = "LIGHTNING_GRPO_VLLM_PLUGIN"


def register() -> None:
    """Register the backends when :data:`ENV` is ``1``; otherwise do nothing."""
    if os.environ.get(ENV) != "1":
        return
    from .rollout.vllm_plugin import register as register_backends

    register_backends()
