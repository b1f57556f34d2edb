"""The public constructors stay small and every settings field says what it is (issue 39)."""

import ast
import dataclasses
import inspect
import textwrap

import pytest

import lightning_grpo as lg

CONSTRUCTORS = ["GRPOModule", "GRPOLoss", "RolloutCallback", "PromptDataModule"]
SETTINGS = [
    "KLSettings",
    "OffPolicySettings",
    "LossTerms",
    "AlgorithmSettings",
    "KLInRewardSettings",
    "PolicySettings",
    "ForwardSettings",
    "VLLMArgs",
    "ServerSettings",
    "HFSettings",
    "SelectionSettings",
    "EvaluationSettings",
    "WeightSyncSettings",
    "PromptFormat",
    "SamplingConfig",
    "LoraSettings",
]


@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_constructors_take_twelve_parameters_at_most(name):
    params = inspect.signature(getattr(lg, name)).parameters
    assert len(params) <= 12, f"{name}: {len(params)} parameters {list(params)}"


def _field_docstrings(cls) -> dict[str, str]:
    """field -> the string literal written under it in the class body (an attribute docstring)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            is_doc = isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant)
            docs[node.target.id] = after.value.value if is_doc and isinstance(after.value.value, str) else ""
    return docs


@pytest.mark.parametrize("name", SETTINGS)
def test_every_settings_field_has_a_docstring(name):
    cls = getattr(lg, name)
    assert dataclasses.is_dataclass(cls), name
    docs = _field_docstrings(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]
    assert missing == [], f"{name}: fields without a docstring: {missing}"


def test_the_settings_groups_are_exported_at_the_top_level():
    assert set(SETTINGS) <= set(lg.__all__)
