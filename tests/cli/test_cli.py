"""The command line: the rollout section (``--rollout.*``), ``--print_config`` without a recipe, ``--help``,
and configuration errors printed as one line (the last of the output) before anything is written."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from lightning_grpo.cli.errors import condense
from tests.helpers.bad_input import HF_ENGINE, cli, write_config

ROOT = Path(__file__).resolve().parents[2]
HF = HF_ENGINE
pytestmark = pytest.mark.usefixtures("tiny_cache")


def _rollout(trainer):
    from lightning_grpo import RolloutCallback

    (callback,) = [c for c in trainer.callbacks if isinstance(c, RolloutCallback)]
    assert trainer.callbacks.index(callback) == 0, "the rollout callback runs before the guards"
    return callback


def _logger_args(tmp_path: Path) -> list[str]:
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path / "logs")}}
    return [
        f"--trainer.logger={yaml.safe_dump(logger, default_flow_style=True).strip()}",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]


# ------------------------------------------------------------------------------ the section
def test_rollout_sampling_n_changes_the_group_size(tmp_path):
    """``--rollout.sampling.n 16`` reaches the rollout callback (not the last guard): one step trains on
    8 prompts x 16 completions."""
    args = [
        "-c",
        str(ROOT / "recipes" / "quickstart.yaml"),
        *HF,
        "--rollout.sampling.n",
        "16",
        "--trainer.max_steps",
        "1",
        "--trainer.limit_val_batches",
        "0",
        *_logger_args(tmp_path),
    ]
    built = cli(args, run=False)
    callback = _rollout(built.trainer)
    assert callback.engine_settings.name == "hf" and callback.sampling.n == 16 and callback.sampling.max_new_tokens == 2
    assert not [c for c in built.trainer.callbacks if type(c).__name__.endswith("Guard")]  # the recipe names none
    built.trainer.fit(built.model, datamodule=built.datamodule)
    assert [type(c).__name__ for c in built.trainer.callbacks if type(c).__name__.endswith("Guard")] == [
        "NonFiniteGuard",
        "LogProbGuard",
        "EntropyGuard",
        "IdenticalSamplesGuard",
        "MismatchGuard",
        "ZeroRewardGuard",
        "ZeroStdGuard",
        "TruncationGuard",
    ]
    assert built.trainer.callbacks.index(callback) == 0, "the rollout callback runs before the module's guards"
    batch = built.model.rollout_batch
    assert batch.group_size == 16 and len(batch) == 8 * 16


def test_rollout_section_takes_another_class(tmp_path):
    from lightning_grpo import AgentRolloutCallback

    built = cli(
        [
            "-c",
            str(ROOT / "recipes" / "tool_quickstart.yaml"),
            "--rollout.agent.max_turns",
            "3",
            "--rollout.sampling.n",
            "4",
            *_logger_args(tmp_path),
        ],
        run=False,
    )
    callback = _rollout(built.trainer)
    assert isinstance(callback, AgentRolloutCallback)
    assert (
        callback.limits.max_turns == 3
        and callback.sampling.n == 4
        and callback.agent.environment_args["tools_enabled"] is True
    )


def test_rollout_callback_left_in_trainer_callbacks_is_refused(tmp_path):
    path = write_config(tmp_path, **{"trainer.callbacks": [{"class_path": "lightning_grpo.RolloutCallback"}]})
    with pytest.raises(
        ValueError,
        match=r"2 rollout callbacks \(RolloutCallback, RolloutCallback\): .*move it from trainer.callbacks to 'rollout:'",
    ):
        cli(["-c", str(path)], run=False)


def test_help_lists_the_rollout_options_not_every_torch_module(capsys):
    from lightning_grpo.cli import main

    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(["fit", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--rollout.engine",
        "--rollout.sampling.n N",
        "--rollout.rewards",
        "--rollout.engine.help",
        "--model.model MODEL",
    ):
        assert option in out, option
    assert "torch.nn.Linear" not in out and "--model.model.help" not in out
    assert "--rollout.vllm" not in out and "--rollout.server" not in out  # the engine's fields: its own help
    # --model.model listed about 450 torch.nn classes (some 500 lines more); every option is one to a few lines
    assert len(out.splitlines()) < 1100


def test_an_engines_help_lists_its_fields_with_their_docstrings(capsys):
    from lightning_grpo.cli import main

    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(["fit", "--rollout.engine.help", "VLLMArgs"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for option in ("--engine.max_model_len MAX_MODEL_LEN", "--engine.kv_cache_memory_bytes", "--engine.sleep_level"):
        assert option in out, option
    # a settings field's own docstring (read only when help is shown: the other commands skip it)
    assert "Longest prompt + completion in tokens." in out


@pytest.mark.vllm
def test_print_config_without_a_recipe_is_a_recipe_that_trains(tmp_path, monkeypatch, capsys, vllm_engine):
    """``fit --model.model tiny:chars --data.source lightning_grpo.DigitTask --print_config > x.yaml`` then
    ``fit -c x.yaml --trainer.max_steps 2`` (the printed engine is vLLM, the short name: the rollout callback gets
    the session's engine instead of building a second one)."""
    from lightning_grpo import RolloutCallback
    from lightning_grpo.cli import main

    monkeypatch.chdir(tmp_path)
    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(["fit", "--model.model", "tiny:chars", "--data.source", "lightning_grpo.DigitTask", "--print_config"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    config = yaml.safe_load(printed)
    assert config["rollout"]["class_path"] == "lightning_grpo.RolloutCallback"
    assert config["rollout"]["init_args"]["engine"] == "vllm" and config["rollout"]["init_args"]["sampling"]["n"] == 8
    (tmp_path / "x.yaml").write_text(printed)

    def session_engine(self, trainer, module):
        if self.engine is None:
            self.use_engine(vllm_engine)
        return self.engine

    monkeypatch.setattr(RolloutCallback, "ensure_engine", session_engine)
    built = cli(["fit", "-c", "x.yaml", "--trainer.max_steps", "2"])
    assert built.trainer.global_step == 2 and _rollout(built.trainer).engine_settings.name == "vllm"
    loss = float(built.trainer.callback_metrics["train/loss"])
    assert math.isfinite(loss)  # the run trained


def test_a_reward_module_next_to_the_recipe_is_importable(tmp_path, monkeypatch):
    """A recipe names ``my_rewards.always_half`` from a module in the current directory: the command
    line finds it without PYTHONPATH (the console script puts its own bin folder on sys.path, not
    the current directory), and the run's rewards are that function's."""
    (tmp_path / "my_rewards.py").write_text(
        "def always_half(completions, **_columns):\n    return [0.5 for _ in completions]\n"
    )
    path = write_config(tmp_path, **{"rollout.rewards": [{"name": "my_rewards.always_half"}]})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    from lightning_grpo.cli import main

    with mock.patch.object(sys, "argv", ["lightning-grpo"]):
        main(["fit", "-c", str(path)])
    assert sys.modules["my_rewards"].__file__ == str(tmp_path / "my_rewards.py")
    (log,) = (tmp_path / "logs" / "run").glob("version_*/completions.jsonl")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows and {(r["step"], json.dumps(r["rewards"])) for r in rows} == {(0, '{"always_half": 0.5}')}


# ------------------------------------------------------------------------------ errors
BAD = [
    (
        ["--rollout.sampling.temprature=0.5"],
        "rollout.sampling.temprature: not an option of lightning_grpo.RolloutCallback "
        "(did you mean 'sampling.temperature'?)",
    ),
    (["--rollout.sampling.n=-4"], "rollout: SamplingConfig.n must be an integer >= 1 (completions per prompt), got -4"),
    (["--model.loss.init_args.policy_loss=ppoo"], "model.loss: unknown policy loss 'ppoo'; valid names: "),
    (
        ["--rollout.rewards=[{name: nope.fn}]"],
        "rollout: reward function 'nope.fn' could not be imported: No module named 'nope'",
    ),
    (
        ["--model.loss.init_args.policy_loss_args={eps_high: -0.1}"],
        "model.loss.init_args.policy_loss_args: eps_low and eps_high must be >= 0, got 0.2, -0.1",
    ),
    (["--model.policy.lora={r: 0}"], "model.policy.lora.r must be an integer >= 1 (the adapter's rank), got 0"),
    (
        ["--model.policy.lora={r: 4, target_modules: [q_proj, v_projx]}"],
        "model.policy.lora.target_modules: 'v_projx' matches no module of the model; its modules with weights to "
        "adapt: embed_tokens, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head (or 'all-linear')",
    ),
    (
        ["--model.loss.init_args.aggregation_args={max_len: 3}"],
        "model.loss.init_args.aggregation_args: token_mean() got an unexpected keyword argument 'max_len'",
    ),
    (
        ["--rollout.sampling.n=1"],
        "rollout.sampling.n=1 leaves 1 completion per prompt, but model.algorithm.advantage='grpo'",
    ),
]


@pytest.mark.parametrize(
    ("args", "message"),
    BAD,
    ids=[
        "nested_key",
        "sampling_n",
        "loss_name",
        "reward_path",
        "eps_high",
        "lora_rank",
        "lora_targets",
        "aggregation_args",
        "group_of_one",
    ],
)
def test_bad_input_ends_with_its_one_line_message_and_writes_nothing(tmp_path, capsys, args, message):
    from lightning_grpo.cli import main

    path = write_config(tmp_path)
    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(["fit", "-c", str(path), *args])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    last = captured.err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"lightning-grpo: error: {message}"), captured.err[-800:]
    assert "Given value" not in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "logs").exists() and not (tmp_path / "root").exists()


def test_condense_keeps_the_key_the_innermost_error_and_the_class():
    message = """Parser key "rollout":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning_grpo.callbacks.rollout.RolloutCallback'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'lightning_grpo.RolloutCallback':
        Parser key "sampling":
          Does not validate against any of the Union subtypes
          Errors:
            - Problem with given class_path 'lightning_grpo.SamplingConfig':
                Option 'tempreature' is not accepted
            - Expected a <class 'NoneType'>
          Given value type: <class 'dict'>
          Given value: {'tempreature': 4}
    - Expected a <class 'NoneType'>
  Given value type: <class 'dict'>
  Given value: {'sampling': {'tempreature': 4}}"""
    assert condense(message) == (
        "rollout.sampling.tempreature: not an option of lightning_grpo.SamplingConfig (did you mean 'temperature'?)"
    )
    typed = (
        "Parser key \"model.algorithm.advantage_args\":\n  Subtypes: [dict]\n  Errors:\n    - Expected a <class 'dict'>\n"
        "    - Expected a <class 'NoneType'>\n  Given value type: <class 'str'>\n  Given value: 3"
    )
    assert condense(typed) == "model.algorithm.advantage_args: expected a dict, got 3"


def test_the_command_line_silences_expected_library_messages_and_keeps_the_rest():
    """The first screen of a fit: the known library lines (by text) go, anything else stays, and the
    engine's own filter context leaves the command line's process-wide filter in place."""
    import logging
    import warnings

    from lightning_grpo.cli.quiet import EXPECTED_LOGS, quiet_expected_messages
    from lightning_grpo.rollout.vllm_env import KNOWN_HARMLESS, quiet_known_harmless

    seen_logs = []

    class Recorder(logging.Handler):
        def emit(self, record):
            seen_logs.append(record.getMessage())

    names = (
        "vllm.config.vllm",
        "vllm.v1.worker.cpu_worker",
        "lightning.pytorch.utilities.rank_zero",
        "vllm.model_executor.models.utils",
    )
    config, worker, tips, loader = (logging.getLogger(n) for n in names)
    recorder = Recorder(level=logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_expected_messages()
            warnings.warn(
                "Your `IterableDataset` has `__len__` defined. In combination with ...", UserWarning, stacklevel=2
            )
            warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ...", FutureWarning, stacklevel=2)
            warnings.warn("a warning of the user's own", UserWarning, stacklevel=2)
        assert [str(w.message) for w in seen] == ["a warning of the user's own"]
        for log in (config, worker, tips, loader):
            log.addHandler(recorder)
        with quiet_known_harmless():
            pass
        config.warning("Enforce eager set, disabling torch.compile, CUDAGraphs")
        worker.warning("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
        worker.warning("libtcmalloc is not found in LD_PRELOAD. For best performance, ...")
        worker.warning("libiomp is not found in LD_PRELOAD. For best performance, ...")
        worker.warning("Node 1 is not in available memory nodes [0].")
        tips.warning("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
        tips.warning("--ckpt_path last: resuming from last.ckpt")
        loader.warning(
            "Attempted to load weight norm.weight with dtype torch.float32 into parameter with dtype torch.bfloat16"
        )
        loader.warning("Attempted to load nested weight 'a.b' into a single parameter 'a'")
        assert seen_logs == [
            "Node 1 is not in available memory nodes [0].",
            "--ckpt_path last: resuming from last.ckpt",
            "Attempted to load nested weight 'a.b' into a single parameter 'a'",
        ]
    finally:
        for name in [*KNOWN_HARMLESS, *EXPECTED_LOGS]:
            log = logging.getLogger(name)
            log.removeHandler(recorder)
            log.filters.clear()
