"""The combination matrix's dimensions: THE place a new feature adds its value (docs/evidence/combinations.md).

Every value is the recipe fragment a user would write for it, deep-merged into
``recipes/quickstart.yaml`` (dicts merge key by key, anything else replaces; ``rollout`` is first
rewritten in its ``class_path`` / ``init_args`` form). ``{server_url}`` is replaced by the test
session's vLLM server. The covering array (:func:`cells`) is built from this table by ``allpairspy``
at collection time: every pair of values of two dimensions meets in at least one cell, and the
cells come in a fixed order (the library is deterministic for a fixed table and :data:`ORDER`), so cell
ids are stable.

A combination the package does not support goes to :data:`REFUSED` with the words its one-line
error must contain; the array never pairs those two values, and ``test_refused_pair`` asserts the
refusal comes before any engine starts.
"""

from __future__ import annotations

from typing import Any

FSDP2 = {
    "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
    "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1},
}
LORA = {"r": 4, "alpha": 8, "target_modules": "all-linear", "extra": {"modules_to_save": ["lm_head"]}}
QUANTIZATION = {"quant_type": "nf4", "double_quant": True, "compute_dtype": "float32"}
VLLM_ARGS = {"dtype": "float32", "max_model_len": 128, "kv_cache_memory_bytes": 64 * 1024**2}
#: ``rollout.init_args.agent`` (`AgentSettings`), less the environment
EPISODES = {
    "max_turns": 2,
    # openings that differ per episode (the seams issue): each episode its own reset seed
    "reset_seed": "episode",
    "allow_mixed_task_groups": True,
}
AGENT = {"sampling": {"max_new_tokens": 1}, "rewards": [{"name": "env_reward"}]}


def _logger(class_path: str) -> dict[str, Any]:
    return {
        "trainer": {
            "logger": {
                "class_path": class_path,
                "init_args": {"save_dir": "{run_root}", "name": "run", "version": "{version}"},
            }
        }
    }


DIMENSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "layout": {
        "one": {"trainer": {"devices": 1}},
        "ddp2": {"trainer": {"devices": 2, "strategy": "ddp"}},
        "fsdp2": {"trainer": {"devices": 2, "strategy": FSDP2}},
    },
    "engine": {
        "hf": {"rollout": {"init_args": {"engine": "hf"}}},
        "vllm": {
            "rollout": {"init_args": {"engine": {"class_path": "lightning_grpo.VLLMArgs", "init_args": VLLM_ARGS}}}
        },
        "vllm_server": {
            "rollout": {
                "init_args": {
                    "engine": {
                        "class_path": "lightning_grpo.ServerSettings",
                        "init_args": {"urls": ["{server_url}"], "max_model_len": 128},
                    }
                }
            }
        },
    },
    "weights": {
        "full": {},
        "lora": {"model": {"policy": {"lora": LORA}}},
        "qlora": {"model": {"policy": {"lora": LORA, "quantization": QUANTIZATION}}},
    },
    "rollout": {
        "single": {"rollout": {"class_path": "lightning_grpo.RolloutCallback"}},
        "agent": {
            "rollout": {
                "class_path": "lightning_grpo.AgentRolloutCallback",
                "init_args": {**AGENT, "agent": {**EPISODES, "environment": "tests.e2e.matrix.envs.OpeningDigitsEnv"}},
            }
        },
        "openenv": {
            "rollout": {
                "class_path": "lightning_grpo.AgentRolloutCallback",
                "init_args": {
                    **AGENT,
                    "agent": {
                        **EPISODES,
                        "environment": "lightning_grpo.integrations.openenv.OpenEnvEnvironment",
                        "environment_args": {"env": "tests.e2e.matrix.openenv_env.OpeningDigitsOpenEnv"},
                    },
                },
            }
        },
    },
    "logging": {
        "csv": _logger("lightning.pytorch.loggers.CSVLogger"),
        "tensorboard": _logger("lightning.pytorch.loggers.TensorBoardLogger"),
    },
    "lm_head": {
        "recompute": {},
        "saved": {"model": {"forward": {"save_probs": True}}},
    },
    # Not a recipe value: whether the cell also resumes its run from the step-1 checkpoint (a second
    # ``fit --ckpt_path``) and compares it with the uninterrupted one. As a dimension, every value of every
    # other dimension meets a resumed cell, without a second run in each cell.
    "resume": {
        "resumed": {},
        "fresh": {},
    },
}

#: Pairs the package refuses: ((dimension, value), (dimension, value), words its one-line error must name).
REFUSED: list[tuple[tuple[str, str], tuple[str, str], tuple[str, ...]]] = [
    (("layout", "fsdp2"), ("weights", "qlora"), ("model.policy.quantization", "ModelParallelStrategy")),
    (("layout", "fsdp2"), ("engine", "hf"), ("rollout.engine 'hf'", "ModelParallelStrategy")),
]

#: The values a refused cell takes in the dimensions its pair does not set.
DEFAULTS = {
    "layout": "one",
    "engine": "hf",
    "weights": "full",
    "rollout": "single",
    "logging": "csv",
    "lm_head": "recompute",
    "resume": "fresh",
}


#: The order the dimensions are given to allpairspy in (cell ids keep the table's order). With its filter
#: the library can leave an allowed pair uncovered; this order (of the 5040 orders of today's table, the first
#: that covers every allowed pair with the fewest cells, 11, and the fewest resumed cells among those, 5)
#: does. After a change, pick an order for which every allowed pair still meets in a cell.
ORDER = ("engine", "layout", "rollout", "resume", "weights", "logging", "lm_head")


def _allowed(values: list[str]) -> bool:
    """allpairspy's filter: False for a partial row holding a refused pair."""
    row = dict(zip(ORDER, values))
    return not any(row.get(a) == va and row.get(b) == vb for (a, va), (b, vb), _ in REFUSED)


def cells() -> list[dict[str, str]]:
    """The covering array: one {dimension: value} dict per cell, in the library's (fixed) order."""
    from allpairspy import AllPairs

    assert sorted(ORDER) == sorted(DIMENSIONS), "ORDER must name every dimension once"
    rows = AllPairs([list(DIMENSIONS[n]) for n in ORDER], filter_func=_allowed)
    return [{n: dict(zip(ORDER, row))[n] for n in DIMENSIONS} for row in rows]


def cell_id(cell: dict[str, str]) -> str:
    return "-".join(cell[n] for n in DIMENSIONS)


def refused_cells() -> list[tuple[dict[str, str], tuple[str, ...]]]:
    """One cell per refused pair (the other dimensions at :data:`DEFAULTS`) with the words its error names."""
    return [({**DEFAULTS, a: va, b: vb}, words) for (a, va), (b, vb), words in REFUSED]
