"""Old module paths (before the layered folders) kept importable for one release, with a warning.

``import lightning_grpo.prefix`` and a recipe's ``class_path: lightning_grpo.module.GRPOModule``
still work: a ``sys.meta_path`` finder answers each old path in :data:`MOVED` with its new module
(the same module object, so classes and registries are shared) and warns once per old path with
:class:`LightningGRPODeprecationWarning`, naming the old and the new path. Removed in the next
release.

The warning subclasses ``DeprecationWarning`` (so ``-W error::DeprecationWarning`` and pytest's
handling catch it) and is shown by default, like Lightning's own deprecations: Python hides plain
``DeprecationWarning`` outside ``__main__``, and a recipe user would never see it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module path -> new module path. A module that was split by meaning points at its package,
#: which re-exports every public name of the parts.
MOVED: dict[str, str] = {
    "lightning_grpo.module": "lightning_grpo.training.module",
    "lightning_grpo.prefix": "lightning_grpo.training.prefix",
    "lightning_grpo.packing": "lightning_grpo.training.packing",
    "lightning_grpo.distill": "lightning_grpo.training.distill",
    "lightning_grpo.metrics": "lightning_grpo.training.metrics",
    "lightning_grpo.batch": "lightning_grpo.core.batch",
    "lightning_grpo.resolve": "lightning_grpo.core.resolve",
    "lightning_grpo.fsdp": "lightning_grpo.models.fsdp",
    "lightning_grpo.lora": "lightning_grpo.models.lora",
    "lightning_grpo.quantization": "lightning_grpo.models.quantization",
    "lightning_grpo.export": "lightning_grpo.models.export",
    "lightning_grpo.export_checkpoint": "lightning_grpo.models.checkpoints",
    "lightning_grpo.tiny": "lightning_grpo.models.tiny",
    "lightning_grpo.rollout.weights": "lightning_grpo.models.weights",
    "lightning_grpo.run_files": "lightning_grpo.cli.run_files",
    "lightning_grpo.report": "lightning_grpo.cli.report",
    "lightning_grpo.validation": "lightning_grpo.checks.validation",
    "lightning_grpo.model_checks": "lightning_grpo.checks.model_checks",
    "lightning_grpo.preflight": "lightning_grpo.checks.preflight",
    "lightning_grpo.vllm_plugin": "lightning_grpo.rollout.vllm_plugin",
    "lightning_grpo.distributed": "lightning_grpo.callbacks.distributed",
    "lightning_grpo.core.advantages_2026": "lightning_grpo.core",
    "lightning_grpo.core.policy_losses_2026": "lightning_grpo.core",
}


class LightningGRPODeprecationWarning(DeprecationWarning):
    """A lightning-grpo name or path that still works and is removed in the next release."""


warnings.filterwarnings("default", category=LightningGRPODeprecationWarning)


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):  # noqa: ANN001 - the default module, replaced in exec_module
        return None

    def exec_module(self, module) -> None:  # noqa: ANN001
        old = module.__name__
        warnings.warn(
            f"{old} moved to {self.new}; the old path is removed in the next release",
            LightningGRPODeprecationWarning,
            stacklevel=2,
        )
        sys.modules[old] = importlib.import_module(self.new)  # the import statement returns this one


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(MOVED[fullname]))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (before the file finders: no old file is left anyway)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
