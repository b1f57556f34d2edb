"""What a rollout engine's settings are: the base class `EngineSettings`, the registry of short names, and
the context an engine is built in. Importable without vLLM.

``rollout.engine`` takes one settings object: `VLLMArgs` (vLLM in this process), `ServerSettings` (vLLM
servers) or `HFSettings` (transformers ``generate`` on the live policy), or the short name of one of them
(``vllm``, ``vllm_server``, ``hf``), which means that engine with its defaults. Each settings class
states what its engine can do (the class attributes below), checks its own fields, and builds its engine
(:meth:`EngineSettings.build`); the callback and the run plan read those and never branch on the name.

A new engine is its module (a `RolloutEngine`), its settings (a dataclass subclassing `EngineSettings`
with ``name``, the capabilities and ``build``) and one registration (:func:`register_engine`, for the
short name; the steps: docs/reference/rollout.md, "Adding an engine").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..core.registry import Registry

if TYPE_CHECKING:
    from .base import RolloutEngine

#: How error messages name an engine setting (``rollout.engine.init_args.max_model_len``).
ENGINE_ARGS = "rollout.engine.init_args"

#: Short name -> settings class (``rollout.engine: vllm`` is ``VLLMArgs()``).
ENGINES: Registry = Registry("rollout engine")

S = TypeVar("S", bound=type)


def _same(obj: Any) -> Any:
    return obj


@dataclass(frozen=True)
class EngineContext:
    """Where the engine runs: handed over by the caller (the RolloutCallback reads them from its Trainer)."""

    rank: int = 0
    """This process's global rank."""
    world_size: int = 1
    """Processes in the run."""
    log_dir: str | None = None
    """The run's log directory (started vLLM servers write their logs under it); None = a temporary one."""
    broadcast: Callable[[Any], Any] = _same
    """Rank 0's value on every rank (every rank calls it together); the identity for one process."""


class EngineSettings:
    """The settings of one rollout engine (``rollout.engine``). Subclasses are dataclasses with one
    docstring per field; the class attributes say what the engine can do, the methods check the settings
    against the rest of the run and build the engine."""

    #: The short name the engine is registered under (``rollout.engine: <name>``).
    name: ClassVar[str] = ""
    #: Generates with the policy being trained (no copy of the weights, nothing to push); its context
    #: limit is the policy's ``max_position_embeddings``.
    samples_live_policy: ClassVar[bool] = False
    #: Can sample the next batches while the trainer trains (``rollout.max_staleness >= 1``).
    async_capable: ClassVar[bool] = False
    #: Can take the LoRA adapter itself (``rollout.weight_sync.lora: adapter``).
    serves_lora_adapters: ClassVar[bool] = False
    #: Runs vLLM in this process (so vLLM must be importable here).
    runs_vllm_here: ClassVar[bool] = False

    def context_limit(self) -> tuple[int | None, str]:
        """(The longest prompt + completion the settings fix, None = derived from the data; the option that sets it)."""
        return None, ""

    def check(self, *, weight_sync_enabled: bool, max_model_len: int | None) -> None:
        """Raise on settings that cannot work with the run (the weight sync, the context length derived or set;
        on CPU the prefill budget): before any engine starts."""

    def check_lora_adapter(self) -> None:
        """Raise when an engine that serves adapters is not set up to (called with ``weight_sync.lora: adapter``)."""

    def server_urls(self) -> list[str]:
        """URLs of servers the run talks to that it does not start (checked for a connection before fit)."""
        return []

    def build(
        self,
        module: Any,
        tokenizer: Any,
        seed: int,
        context: EngineContext,
        *,
        max_model_len: int | None,
        sequences: int,
    ) -> RolloutEngine:
        """The engine for ``module``'s policy. ``max_model_len``: the context length derived from the data, used
        where the settings leave theirs unset; ``sequences``: how many sequences one generation holds at once
        (sizes a KV cache)."""
        raise NotImplementedError(f"{type(self).__name__}.build")


def register_engine(settings_class: S) -> S:
    """Register an `EngineSettings` subclass under its ``name`` (``rollout.engine: <name>``); usable as a decorator."""
    if not (isinstance(settings_class, type) and issubclass(settings_class, EngineSettings)):
        raise TypeError(f"register_engine takes an EngineSettings subclass, got {settings_class!r}")
    ENGINES.register(settings_class.name)(settings_class)
    return settings_class
