"""``rollout.rewards`` on the command line and in a recipe: a reward function named alone
(``my_rewards.first_digit``) stands for ``{name: my_rewards.first_digit}``; text that is no name is refused in
one line that shows the forms that work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.bad_input import cli, write_config

MY_REWARDS = "def first_digit(completions, answer, **_columns):\n    return [float(c[:1] == a) for c, a in zip(completions, answer)]\n"


@pytest.fixture(scope="module")
def parser(tmp_path_factory, tiny_model_path):
    """The command line's parser (built once: building it takes seconds, a parse well under one) and a recipe."""
    tmp = tmp_path_factory.mktemp("reward-option")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
        recipe = write_config(tmp)
        return cli(["-c", str(recipe)], run=False).parser, tmp


@pytest.fixture
def my_rewards(tmp_path, monkeypatch):
    """``my_rewards.py`` in the current directory, importable as the command line imports it."""
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)


FORMS = {
    "alone": (["--rollout.rewards", "my_rewards.first_digit"], None, ["first_digit"]),
    "list": (["--rollout.rewards", "[my_rewards.first_digit]"], None, ["first_digit"]),
    "mixed": (
        ["--rollout.rewards", "[my_rewards.first_digit, {name: prefix_match, weight: 0.5}]"],
        None,
        ["first_digit", "prefix_match"],
    ),
    "append": (
        ["--rollout.rewards+=my_rewards.first_digit"],
        [{"name": "prefix_match"}],
        ["prefix_match", "first_digit"],
    ),
    "yaml": ([], ["my_rewards.first_digit"], ["first_digit"]),
}


@pytest.mark.parametrize(("args", "in_recipe", "names"), FORMS.values(), ids=FORMS)
def test_a_reward_named_alone_is_the_reward(parser, tmp_path, my_rewards, args, in_recipe, names):
    """Each form reaches the rollout callback as the function itself (it scores), and the saved config
    (``--print_config``, the run's config.yaml) writes it back as it was given."""
    parser, _ = parser
    recipe = write_config(tmp_path, **({"rollout.rewards": in_recipe} if in_recipe is not None else {}))
    config = parser.parse_args(["-c", str(recipe), *args])
    callback = parser.instantiate_classes(config).rollout
    assert callback.reward_set.names == names
    scores = callback.reward_set.score(["4", "5", "3"], {"answer": ["4", "3", "3"]})
    assert scores.rewards[:, names.index("first_digit")].tolist() == [1.0, 0.0, 1.0]
    saved = yaml.safe_load(parser.dump(config))["rollout"]["init_args"]["rewards"]
    given = [s if isinstance(s, str) else s["name"] for s in (saved if isinstance(saved, list) else [saved])]
    assert given == [n if n == "prefix_match" else "my_rewards.first_digit" for n in names]


def _last_error_line(parser, capsys, args: list[str]) -> str:
    parser, tmp = parser
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["-c", str(tmp / "recipe.yaml"), *args])
    assert exit_.value.code == 2
    return capsys.readouterr().err.rstrip("\n").splitlines()[-1]


@pytest.mark.parametrize(
    ("value", "shown"), [("my rewards", "my rewards"), ("[my_rewards.fn other]", "my_rewards.fn other")]
)
def test_text_that_is_no_reward_name_is_one_line_showing_the_working_forms(parser, capsys, value, shown):
    assert _last_error_line(parser, capsys, ["--rollout.rewards", value]) == (
        f"lightning-grpo: error: rollout.rewards: {shown!r} is not a reward function's name: name one alone "
        "(my_rewards.fn) or list them ([my_rewards.fn, {name: exact_match, weight: 0.5}])"
    )


def test_a_mistyped_spec_is_still_reported_as_a_spec(parser, capsys):
    """``{nme: ...}`` is not taken for a name: the error names the option it holds, as before."""
    assert _last_error_line(parser, capsys, ["--rollout.rewards", "[{nme: my_rewards.fn}]"]) == (
        "lightning-grpo: error: rollout.rewards.nme: not an option of lightning_grpo.RewardSpec (did you mean 'name'?)"
    )
