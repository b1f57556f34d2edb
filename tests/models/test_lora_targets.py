"""``model.policy.lora.target_modules``: a listed name that matches no module of the model fails in one line
before peft wraps anything (peft itself fails only when no name matches)."""

from __future__ import annotations

import pytest
from torch import nn

from lightning_grpo import LoraSettings
from lightning_grpo.models.lora import adaptable_module_names, check_target_modules


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(4, 4)
        self.v_proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)  # a weight vector: nothing to adapt


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([Block(), Block()])
        self.lm_head = nn.Linear(4, 10)

    def forward(self, x):
        return self.lm_head(self.embed_tokens(x))


def test_the_adaptable_names_are_the_weight_matrices_once_each_in_order():
    assert adaptable_module_names(Toy()) == ["embed_tokens", "q_proj", "v_proj", "lm_head"]


@pytest.mark.parametrize(
    "targets", [["q_proj", "v_proj"], ["layers.0.q_proj"], ["lm_head"], "all-linear", r".*\.q_proj"], ids=str
)
def test_names_that_match_as_peft_matches_pass(targets):
    check_target_modules(Toy(), LoraSettings(target_modules=targets))


@pytest.mark.parametrize(
    ("targets", "named"),
    [(["q_proj", "v_prj"], "'v_prj' matches"), (["q_prj", "proj", "v_proj"], "'q_prj', 'proj' match")],
    ids=["one", "two"],
)
def test_a_misspelled_name_among_right_ones_fails_naming_it_and_the_modules(targets, named):
    with pytest.raises(ValueError) as err:
        check_target_modules(Toy(), LoraSettings(target_modules=targets))
    assert str(err.value) == (
        f"model.policy.lora.target_modules: {named} no module of the model; its modules with weights to adapt: "
        "embed_tokens, q_proj, v_proj, lm_head (or 'all-linear')"
    )


def test_a_policy_given_as_a_module_is_checked_before_peft_wraps_it():
    """Drop-in use (``GRPOModule(model=my_module, ...)``): the same line, from `apply_lora`, before peft
    wraps the module."""
    from lightning_grpo.models.loading import apply_lora

    toy = Toy()
    with pytest.raises(ValueError, match=r"^model.policy.lora.target_modules: 'v_prj' matches no module"):
        apply_lora(toy, LoraSettings(r=2, target_modules=["q_proj", "v_prj"]))
    assert not any("lora" in name for name, _ in toy.named_modules())
