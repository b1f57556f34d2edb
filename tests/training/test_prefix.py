"""Shared-prefix forwards: the layout by hand, and shared == padded log-probs, entropies and gradients
(sdpa and eager, both log-prob paths, packed or not, LoRA, gradient checkpointing, reference / old /
teacher log-probs, multi-turn rows), and the auto rule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_grpo import AlgorithmSettings, ForwardSettings, GRPOLoss, GRPOModule, KLSettings
from lightning_grpo.core.batch import RolloutBatch
from lightning_grpo.training.prefix import SharedPrefixPlan, choose_layout

# ---------------------------------------------------------------------------------- the plan


def _batch(prompts: list[list[int]], completions: list[list[int]], group_size: int, **extra) -> RolloutBatch:
    """Row b: prompt ``prompts[b // group_size]`` left-padded, completion ``completions[b]`` right-padded."""
    Lp, Lc = max(map(len, prompts)), max(map(len, completions))
    ids = torch.zeros(len(completions), Lp + Lc, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, comp in enumerate(completions):
        p = prompts[b // group_size]
        ids[b, Lp - len(p) : Lp], attn[b, Lp - len(p) : Lp] = torch.tensor(p), 1
        ids[b, Lp : Lp + len(comp)], attn[b, Lp : Lp + len(comp)] = torch.tensor(comp, dtype=torch.long), 1
    gen = torch.Generator().manual_seed(1)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=attn[:, Lp:].float(),
        advantages=torch.randn(len(ids), generator=gen),
        rollout_logp=torch.zeros(len(ids), Lc),
        prompt_length=Lp,
        group_size=group_size,
        temperature=0.7,
        **extra,
    )


def test_plan_lays_each_prompt_once_before_its_completions():
    # prompt A = [7, 8] for rows 0, 1; prompt B = [9, 10, 11] for rows 2, 3 (row 0 left-padded by one)
    batch = _batch([[7, 8], [9, 10, 11]], [[20, 21, 22], [23], [24, 25], [26]], group_size=2)
    plan = SharedPrefixPlan.from_batch(batch, pack=True)
    # segments: A 2 + 3 + 1 = 6 tokens, B 3 + 2 + 1 = 6: width 6, no room to share a row
    assert (plan.rows, plan.width, plan.tokens, plan.shared_tokens) == (2, 6, 17, 5)
    # unique() orders the prompt keys: A's key starts with the pad mark -1, so A is segment 0 (row 0)
    expected_index = torch.tensor(
        [
            [-1, 0, 1, 2, 3, 4],
            [-1, 0, 1, 5, -1, -1],
            [6, 7, 8, 9, 10, -1],
            [6, 7, 8, 11, -1, -1],
        ]
    )
    assert torch.equal(plan.index, expected_index)
    assert torch.equal(plan.pack(batch.input_ids), torch.tensor([[7, 8, 20, 21, 22, 23], [9, 10, 11, 24, 25, 26]]))
    # each completion continues from its prompt's length
    assert torch.equal(plan.position_ids(), torch.tensor([[0, 1, 2, 3, 4, 2], [0, 1, 2, 3, 4, 3]]))
    assert torch.equal(plan.member, torch.tensor([[-1, -1, 0, 0, 0, 1], [-1, -1, -1, 2, 2, 3]]))
    # the first completion token of every row is predicted by its prompt's last slot
    assert plan.predictor_index().tolist() == [1, 2, 3, 1, 8, 9, 8]
    allowed = plan.attention_mask(_Config("sdpa"))[1, 0]  # [W, W] segment B
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],  # row 2's completion: the prompt and itself
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 0, 0, 1],  # row 3's completion: the prompt, not row 2's tokens
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)
    additive = plan.attention_mask(_Config("eager"))[1, 0]
    assert torch.equal(additive == 0, expected) and additive.min() == torch.finfo(torch.float32).min


def test_plan_groups_rows_by_prompt_wherever_they_are_and_packs_segments():
    batch = _batch([[7, 8], [9, 10, 11]], [[20, 21, 22], [23], [24, 25], [26]], group_size=2)
    shuffled = batch.select(torch.tensor([2, 0, 3, 1]))  # a group's rows need not be adjacent
    plan = SharedPrefixPlan.from_batch(shuffled, pack=True)
    assert plan.shared_tokens == 5 and int(plan.owner.sum()) == 12
    # segments A (2 + 4 + 1 = 7), B (1 + 1 + 1 = 3), C (3): B and C share the second row of width 7
    batch = _batch([[7, 8], [9], [10]], [[20, 21, 22, 23], [24], [25], [26], [27], [28]], group_size=2)
    plan = SharedPrefixPlan.from_batch(batch, pack=True)
    assert (plan.rows, plan.width, plan.shared_tokens) == (2, 7, 4)
    assert plan.pack(batch.input_ids)[1].tolist() == [9, 25, 26, 10, 27, 28, 0]
    # keys sort B (-1, 9) = 0, C (-1, 10) = 1, A = 2; the empty slot is a segment of its own
    assert plan.segment[1, :6].tolist() == [0, 0, 0, 1, 1, 1] and plan.segment[1, 6] > 2
    assert plan.member[1].tolist() == [-1, 2, 3, -1, 4, 5, -1]
    mask = plan.attention_mask(_Config("sdpa"))[1, 0]  # [W, W]
    assert mask[4].tolist() == [
        False,
        False,
        False,
        True,
        True,
        False,
        False,
    ]  # C's first completion: C's prompt, itself
    assert mask[6].tolist() == [False] * 6 + [True]  # the empty slot sees itself only
    unpacked = SharedPrefixPlan.from_batch(batch, pack=False)
    assert (unpacked.rows, unpacked.width) == (3, 7)


class _Config(nn.Module):
    def __init__(self, attn: str) -> None:
        super().__init__()
        self.config = type("C", (), {"_attn_implementation": attn})()
        self.dtype = torch.float32


# ------------------------------------------------------------------------- shared == padded


def _grouped_batch(vocab: int, seed: int = 0, turn_ids: bool = False) -> RolloutBatch:
    """3 prompts (lengths 5, 2, 4: left padding) x G = 4, ragged completions, one of them empty."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in (5, 2, 4)]
    lengths = [9, 1, 4, 2, 6, 0, 3, 11, 2, 5, 1, 7]
    completions = [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in lengths]
    batch = _batch(prompts, completions, group_size=4)
    batch.completion_mask[3, 1] = (
        0  # a real token outside the loss (an overlong filter, an env token) stays in the forward
    )
    if turn_ids:  # multi-turn: the environment's reply (tokens 2-3 of row 0) is context, not loss
        batch.turn_ids = torch.where(batch.completion_mask.bool(), 0, -1)
        batch.turn_ids[0, 2:4], batch.turn_ids[0, 4:9] = -1, 1  # row 0 has 9 real tokens
        batch.completion_mask = (batch.turn_ids >= 0).float()
    return batch


def _policy(path, attn: str, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, **kwargs).train()


def _logprobs_and_grads(policy, batch, path: str, packing: str, sharing: str):
    module = GRPOModule(
        model=policy, forward=ForwardSettings(packing=packing, prefix_sharing=sharing, logprob_path=path, chunk_size=7)
    )
    plan = choose_layout(policy, batch, packing, sharing)
    assert isinstance(plan, SharedPrefixPlan) == (sharing == "on")
    policy.zero_grad()
    out = module.token_logprobs(policy, batch, compute_entropy=True)
    real = batch.attention_mask[:, batch.prompt_length :].float()
    (out.logp * batch.completion_mask * batch.advantages[:, None] + 0.1 * out.entropy * real).sum().backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return out.logp * real, out.entropy * real, grads


def _assert_equal(policy, batch, path="chunked_hidden", packing="off"):
    logp_pad, ent_pad, grads_pad = _logprobs_and_grads(policy, batch, path, "off", "off")
    logp_sh, ent_sh, grads_sh = _logprobs_and_grads(policy, batch, path, packing, "on")
    assert logp_pad.abs().max() > 1.0  # real numbers, not zeros
    torch.testing.assert_close(logp_sh, logp_pad, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_sh, ent_pad, atol=1e-5, rtol=0)
    assert grads_pad and grads_sh.keys() == grads_pad.keys()
    for name, g in grads_pad.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads_sh[name], g, atol=1e-5, rtol=1e-5, msg=name)
    return grads_pad


@pytest.mark.parametrize("packing", ["off", "on"])
@pytest.mark.parametrize("path", ["chunked_hidden", "logits"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prefix_logprobs_and_gradients_equal_padded(tiny_model_path, attn, path, packing):
    policy = _policy(tiny_model_path, attn)
    grads = _assert_equal(policy, _grouped_batch(policy.config.vocab_size), path, packing)
    # the prompts' embedding rows get the gradient their G completions send back through shared keys / values
    assert grads["model.embed_tokens.weight"].abs().sum(-1).gt(0).sum() > 10


def test_shared_prefix_equals_padded_on_multi_turn_rows(tiny_model_path):
    policy = _policy(tiny_model_path, "sdpa")
    _assert_equal(policy, _grouped_batch(policy.config.vocab_size, seed=3, turn_ids=True), packing="on")


def test_shared_prefix_equals_padded_with_lora(tiny_model_path):
    from peft import get_peft_model

    from lightning_grpo import LoraSettings

    policy = get_peft_model(_policy(tiny_model_path, "sdpa"), LoraSettings(r=4).to_peft())
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B = 0 at init would leave A without gradient: a small trained-looking B
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    grads = _assert_equal(policy, _grouped_batch(policy.config.vocab_size, seed=1), packing="on")
    assert all("lora_" in name for name in grads) and len(grads) > 4  # only the adapter trains


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prefix_equals_padded_with_gradient_checkpointing(tiny_model_path, attn):
    policy = _policy(tiny_model_path, attn)
    policy.gradient_checkpointing_enable()
    _assert_equal(policy, _grouped_batch(policy.config.vocab_size, seed=2), packing="on")


def test_reference_old_and_teacher_logprobs_equal_padded(tiny_model_path):
    """prepare_rollout_batch with a frozen reference (beta > 0), a reused batch (old log-probs) and a
    distillation teacher (another model), rows_per_pass splitting a group."""
    from lightning_grpo import DistillSettings

    teacher = _policy(tiny_model_path, "sdpa")
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = {}
    for sharing in ("off", "on"):
        policy = _policy(tiny_model_path, "sdpa")
        module = GRPOModule(
            model=policy,
            loss=GRPOLoss(kl=KLSettings(beta=0.04)),
            algorithm=AlgorithmSettings(num_iterations=2),
            forward=ForwardSettings(prefix_sharing=sharing, rows_per_pass=6),
            distillation=DistillSettings(teacher=teacher, use_task_rewards=True),
        )
        module.configure_model()
        batch = _grouped_batch(policy.config.vocab_size)
        out[sharing] = module.prepare_rollout_batch(batch, torch.arange(12.0)[:, None], torch.ones(1))
    real = out["off"].attention_mask[:, out["off"].prompt_length :].float()
    for field in ("ref_logp", "old_logp", "teacher_logp"):
        padded, shared = getattr(out["off"], field), getattr(out["on"], field)
        assert padded.abs().max() > 1.0
        torch.testing.assert_close(shared * real, padded * real, atol=1e-5, rtol=0, msg=field)


# --------------------------------------------------------------------------------- the choice


def test_auto_shares_long_prompts_only(tiny_model_path):
    policy = _policy(tiny_model_path, "sdpa")
    gen = torch.Generator().manual_seed(0)
    vocab = policy.config.vocab_size
    even = [torch.randint(5, vocab, (10,), generator=gen).tolist() for _ in range(8)]
    short = _batch([[7, 8], [9, 10]], even, group_size=4)  # 2-token prompts, no padding: 4 of 96 slots to save
    assert choose_layout(policy, short, "auto", "auto") is None
    completions = [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in (3, 5, 2, 4) * 2]
    long_prompts = [torch.randint(5, vocab, (40,), generator=gen).tolist() for _ in range(2)]
    long = _batch(long_prompts, completions, group_size=4)  # 40-token prompts: 7 of 8 copies saved
    assert isinstance(choose_layout(policy, long, "auto", "auto"), SharedPrefixPlan)
    assert not isinstance(choose_layout(policy, long, "auto", "off"), SharedPrefixPlan)
    plan = choose_layout(policy, long, "off", "on")
    assert plan.rows == 2 and plan.shared_tokens == 6 * 40


def test_prefix_sharing_on_needs_a_mask_aware_model(tiny_model_path):
    batch = _grouped_batch(32)
    flex = _policy(tiny_model_path, "sdpa")
    flex.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="prefix_sharing='on' needs a Hugging Face causal LM with sdpa or eager"):
        choose_layout(flex, batch, "auto", "on")
    assert not isinstance(choose_layout(flex, batch, "auto", "auto"), SharedPrefixPlan)
    windowed = _policy(tiny_model_path, "sdpa")
    windowed.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="no sliding-window layers"):
        choose_layout(windowed, batch, "auto", "on")
    with pytest.raises(ValueError, match="model.forward.prefix_sharing must be one of 'auto', 'on', 'off', got 'yes'"):
        GRPOModule(model="tiny:chars", forward=ForwardSettings(prefix_sharing="yes"))
