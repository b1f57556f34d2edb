"""The built-in rollout engines, and ``rollout.engine`` read as engine settings.

Importing this module registers the built-in engines' short names (each settings class registers itself
with :func:`~lightning_grpo.rollout.engine_settings.register_engine` where it is defined):

========================  ===============  ================================================================
settings                  short name       engine
========================  ===============  ================================================================
`HFSettings`              ``hf``           transformers ``generate`` on the live policy (`HFEngine`)
`VLLMArgs`                ``vllm``         vLLM in this process (`VLLMEngine`)
`ServerSettings`          ``vllm_server``  vLLM servers, started here or given as URLs (`ServerEngine`)
========================  ===============  ================================================================
"""

from __future__ import annotations

from dataclasses import is_dataclass, replace

from .engine_settings import ENGINES, EngineContext, EngineSettings
from .hf import HFSettings
from .vllm_args import VLLMArgs
from .vllm_server import ServerSettings

#: The settings classes of the engines that come with the package.
BUILT_IN_ENGINES = (HFSettings, VLLMArgs, ServerSettings)

__all__ = ["BUILT_IN_ENGINES", "ENGINES", "EngineContext", "EngineSettings", "resolve_engine"]


def resolve_engine(value: EngineSettings | str) -> EngineSettings:
    """``rollout.engine`` as settings: a copy of the settings given, or the defaults of the engine a short name
    registers; anything else is one error naming the option and what it takes."""
    if isinstance(value, EngineSettings):
        return replace(value) if is_dataclass(value) else value
    if isinstance(value, str) and value in ENGINES:
        return ENGINES.get(value)()
    given = repr(value) if isinstance(value, str) else type(value).__name__
    raise ValueError(
        f"rollout.engine: unknown rollout engine {given}; expected one of {', '.join(ENGINES.names())} or engine "
        "settings (class_path: lightning_grpo.VLLMArgs, lightning_grpo.ServerSettings or lightning_grpo.HFSettings)"
    )
