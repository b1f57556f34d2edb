"""The public constructors stay small and every settings field says what it is.

The classes are enumerated, not listed: everything in ``lightning_grpo.__all__``, every class the docs, the
README or a recipe names by its import path, the public classes of the integration modules, and the classes
registered as rewards or environments. A new public class with 13 parameters, or one that passes ``**kwargs``
through, fails here."""

import ast
import dataclasses
import functools
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path

import pytest

import lightning_grpo as lg

ROOT = Path(__file__).resolve().parents[2]
MAX_PARAMETERS = 12


@functools.cache
def public_classes() -> dict[str, type]:
    """Import path -> class, for every public class (see the module docstring); a class reached by several paths
    is listed once, under its shortest (``lightning_grpo.X`` for the exported ones)."""
    from lightning_grpo.agents.environment import ENVIRONMENTS
    from lightning_grpo.data.registry import REWARDS

    found = {f"lightning_grpo.{n}": getattr(lg, n) for n in lg.__all__ if inspect.isclass(getattr(lg, n, None))}
    pages = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("recipes/*.yaml")]
    for path in set(re.findall(r"lightning_grpo(?:\.\w+)+\.[A-Z]\w*", "\n".join(p.read_text() for p in pages))):
        module, _, name = path.rpartition(".")
        found[path] = getattr(importlib.import_module(module), name)
    integrations = importlib.import_module("lightning_grpo.integrations")
    for info in pkgutil.iter_modules(integrations.__path__, "lightning_grpo.integrations."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and not name.startswith("_") and obj.__module__.startswith("lightning_grpo"):
                found[f"{info.name}.{name}"] = obj
    for registry in (REWARDS, ENVIRONMENTS):
        for name in registry.names():
            if inspect.isclass(obj := registry.get(name)):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    paths: dict[type, str] = {}
    for path, cls in sorted(found.items(), key=lambda item: (len(item[0]), item[0])):
        paths.setdefault(cls, path)
    return {
        path: cls for cls, path in sorted(paths.items(), key=lambda item: item[1]) if not issubclass(cls, BaseException)
    }


def test_the_enumeration_reaches_every_kind_of_public_class():
    paths = set(public_classes())
    assert len(paths) > 60
    assert {
        "lightning_grpo.SFTDataModule",
        "lightning_grpo.data.judge.LLMJudge",
        "lightning_grpo.integrations.openenv.OpenEnvClientEnvironment",
        "lightning_grpo.integrations.trl.TRLEnvironment",
        "lightning_grpo.data.reward_models.RewardModel",
    } <= paths


@pytest.mark.parametrize("path", sorted(public_classes()))
def test_public_constructors_take_twelve_parameters_at_most_and_no_kwargs(path):
    params = list(inspect.signature(public_classes()[path]).parameters.values())
    passed_through = [p.name for p in params if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert not passed_through, f"{path}: passes *{passed_through} through; group the options into typed settings"
    assert len(params) <= MAX_PARAMETERS, f"{path}: {len(params)} parameters {[p.name for p in params]}"


def _field_docstrings(cls) -> dict[str, str]:
    """field -> the string literal written under it in the class body (an attribute docstring), over the MRO."""
    docs: dict[str, str] = {}
    for klass in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                is_doc = isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant)
                docs[node.target.id] = after.value.value if is_doc and isinstance(after.value.value, str) else ""
    return docs


SETTINGS = sorted(n for n in lg.__all__ if dataclasses.is_dataclass(getattr(lg, n, None)))


@pytest.mark.parametrize("name", SETTINGS)
def test_every_settings_field_has_a_docstring(name):
    cls = getattr(lg, name)
    docs = _field_docstrings(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]
    assert missing == [], f"{name}: fields without a docstring: {missing}"


def test_the_settings_groups_are_exported_at_the_top_level():
    expected = {"PolicySettings", "ForwardSettings", "SFTPolicySettings", "SFTForwardSettings", "SFTFormatSettings"}
    assert expected | {"PromptFormat", "SamplingConfig", "LoraSettings", "KLSettings"} <= set(SETTINGS)


def test_sft_settings_offer_no_grpo_only_field():
    """SFT's settings types are GRPO's less the fields only GRPO reads."""
    names = {cls: {f.name for f in dataclasses.fields(getattr(lg, cls))} for cls in SETTINGS}
    assert names["PolicySettings"] - names["SFTPolicySettings"] == {"reference"}
    assert names["ForwardSettings"] - names["SFTForwardSettings"] == {"prefix_sharing", "rows_per_pass"}
    assert names["PromptFormat"] - names["SFTFormatSettings"] == {"max_prompt_length", "on_long_prompt"}
