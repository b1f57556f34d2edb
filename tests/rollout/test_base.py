"""Rollout containers, the padding layout for training, and seed derivation."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.rollout.base import (
    Rollout,
    SamplingConfig,
    check_fits,
    derive_seed,
    request_seed,
    rollout_to_tensors,
)


def test_rollout_to_tensors_layout_on_a_hand_example():
    # 2 prompts x G=2: prompts left-padded to Lp=3, completions right-padded to Lc=3, pad id 0.
    rollout = Rollout(
        prompt_ids=[[5, 6, 7], [8]],
        completion_ids=[[9, 1], [10], [11, 12, 1], [13, 14]],
        logprobs=[[-0.1, -0.2], [-0.3], [-0.4, -0.5, -0.6], [-0.7, -0.8]],
        finished=[True, False, True, False],
        group_size=2,
    )
    t = rollout_to_tensors(rollout, pad_id=0)
    assert t.input_ids.tolist() == [
        [5, 6, 7, 9, 1, 0],
        [5, 6, 7, 10, 0, 0],
        [0, 0, 8, 11, 12, 1],
        [0, 0, 8, 13, 14, 0],
    ]
    assert t.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 0],
    ]
    assert t.completion_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]
    expected_lp = torch.tensor([[-0.1, -0.2, 0], [-0.3, 0, 0], [-0.4, -0.5, -0.6], [-0.7, -0.8, 0]])
    torch.testing.assert_close(t.rollout_logprobs, expected_lp, rtol=0, atol=0)
    assert t.input_ids.dtype == torch.long and t.rollout_logprobs.dtype == torch.float32


def test_rollout_to_tensors_uses_the_given_pad_id():
    rollout = Rollout([[3], [4, 5]], [[6], [7, 8]], [[-1.0], [-1.0, -2.0]], [False, False], group_size=1)
    t = rollout_to_tensors(rollout, pad_id=42)
    assert t.input_ids.tolist() == [[42, 3, 6, 42], [4, 5, 7, 8]]


def test_rollout_rejects_inconsistent_rows():
    expected = r"Rollout.completion_ids has 3 rows; expected 4 \(= 2 prompts x group_size 2\)"
    with pytest.raises(ValueError, match=expected):
        Rollout([[1], [2]], [[3]] * 3, [[-1.0]] * 3, [True] * 3, group_size=2)
    with pytest.raises(ValueError, match=r"Rollout.logprobs\[1\] has 1 values for 2 completion tokens"):
        Rollout([[1]], [[3], [4, 5]], [[-1.0], [-1.0]], [True, False], group_size=2)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_sampling_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingConfig.{field} must be"):
        SamplingConfig(**kwargs)


def test_derive_seed_is_distinct_over_ranks_and_steps_and_fits_31_bits():
    seeds = [derive_seed(1234, rank, step) for rank in range(8) for step in range(20_000)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**31 for s in seeds)
    assert derive_seed(1234, 3, 17) == derive_seed(1234, 3, 17)  # deterministic
    pairs = [(rank, step) for rank in range(8) for step in range(100)]
    assert all(derive_seed(1235, r, s) != derive_seed(1234, r, s) for r, s in pairs)  # another run, other seeds


def test_derive_seed_rejects_out_of_range_rank_and_step():
    with pytest.raises(ValueError, match="rank must be in"):
        derive_seed(0, 1024, 0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        derive_seed(0, 0, -1)


def test_request_seeds_do_not_collide_within_or_across_neighbouring_rollouts():
    seeds = [request_seed(seed, p) + i for seed in range(50) for p in range(64) for i in range(16)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**62 + 16 for s in seeds)


def test_vllm_engine_from_a_hub_id_that_cannot_be_fetched_names_it(monkeypatch):
    """A hub id is downloaded to the local cache first (vLLM needs the files); offline, the error names it."""
    from types import SimpleNamespace

    import pytest

    from lightning_grpo.rollout.model_dir import engine_model_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = SimpleNamespace(model_source="lightning-grpo-test/no-such-model", policy=None)
    with pytest.raises(
        FileNotFoundError,
        match=r"model.model 'lightning-grpo-test/no-such-model' is not a local directory and could not be fetched",
    ):
        engine_model_dir(module, tokenizer=None)


def test_check_fits_names_the_lengths_the_engine_and_the_setting():
    check_fits(
        [[1, 2, 3], [4] * 10], max_new_tokens=6, max_model_len=16, whose="engine's", remedy="X"
    )  # 10 + 6 = 16 fits
    with pytest.raises(ValueError) as err:
        check_fits(
            [[1, 2, 3], [4] * 10],
            max_new_tokens=7,
            max_model_len=16,
            whose="servers'",
            remedy="rollout.engine.init_args.max_model_len",
        )
    assert str(err.value) == (
        "longest prompt (10 tokens) + max_new_tokens (7) exceeds the servers' max_model_len (16); "
        "raise rollout.engine.init_args.max_model_len"
    )
