"""Padding-free packing: the plan's layout by hand, and packed == padded log-probs and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_grpo import AlgorithmSettings, ForwardSettings, GRPOLoss, GRPOModule, KLSettings
from lightning_grpo.core.batch import RolloutBatch
from lightning_grpo.training.packing import PackPlan, choose_plan, sampled_positions

# ---------------------------------------------------------------------------------- the plan


def _mask(lengths_prompt: list[int], lengths_completion: list[int], Lp: int, Lc: int) -> torch.Tensor:
    rows = []
    for p, c in zip(lengths_prompt, lengths_completion):
        rows.append([0] * (Lp - p) + [1] * p + [1] * c + [0] * (Lc - c))
    return torch.tensor(rows)  # [B, Lp + Lc]


def test_plan_places_sequences_first_fit_decreasing_with_restarting_positions():
    # sequence lengths 6, 3, 2, 4 -> width 6; FFD: 6 -> row 0; 4 -> row 1; 3 -> no room in row 1 (4+3 > 6) -> row 2;
    # 2 -> row 1 (4 + 2 = 6)
    mask = _mask([2, 2, 1, 3], [4, 1, 1, 1], Lp=3, Lc=4)
    plan = PackPlan.from_mask(mask, prompt_length=3)
    assert (plan.rows, plan.width, plan.tokens) == (3, 6, 15)
    assert plan.share == pytest.approx(18 / 28)
    expected_index = torch.tensor(
        [
            [-1, 0, 1, 2, 3, 4, 5],
            [-1, 12, 13, 14, -1, -1, -1],
            [-1, -1, 10, 11, -1, -1, -1],
            [6, 7, 8, 9, -1, -1, -1],
        ]
    )
    assert torch.equal(plan.index, expected_index)
    expected_positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 0, 0]])
    assert torch.equal(plan.position_ids(), expected_positions)
    # completion tokens of rows 0..3 are predicted by the previous packed token of the same sequence
    assert plan.predictor_index().tolist() == [1, 2, 3, 4, 13, 10, 8]


def test_plan_carries_any_per_token_tensor_and_back():
    mask = _mask([2, 1, 3], [3, 1, 2], Lp=3, Lc=3)
    plan = PackPlan.from_mask(mask, prompt_length=3)
    turn_ids = torch.arange(mask.numel()).reshape(mask.shape) * mask  # [B, L] any per-token tensor
    features = torch.randn(*mask.shape, 2)  # [B, L, 2] trailing dims travel along
    for x in (turn_ids, features):
        packed = plan.pack(x, fill=-7)
        assert packed.shape[:2] == (plan.rows, plan.width)
        assert (packed == -7).sum() == (plan.rows * plan.width - plan.tokens) * x[0, 0].numel()
        back = plan.unpack(packed)
        keep = mask.bool() if x.dim() == 2 else mask.bool()[..., None].expand_as(x)
        assert torch.equal(back[keep], x[keep]) and (back[~keep] == 0).all()
    completion = torch.arange(9.0).reshape(3, 3)  # [B, Lc]
    tokens = plan.completion_tokens(completion)
    assert tokens.tolist() == [0.0, 1.0, 2.0, 3.0, 6.0, 7.0]
    assert torch.equal(plan.scatter_completion(tokens), completion * mask[:, 3:])


# ------------------------------------------------------------------------- packed == padded


def _ragged_batch(vocab: int, seed: int = 0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    prompts, completions = [3, 5, 2, 4, 5, 1, 3, 2], [11, 1, 4, 2, 7, 12, 3, 1]
    Lp, Lc = max(prompts), max(completions)
    attn = _mask(prompts, completions, Lp, Lc)
    ids = torch.randint(5, vocab, attn.shape, generator=gen) * attn
    cmask = attn[:, Lp:].float()
    cmask[2, 3] = 0  # a real token outside the loss (e.g. an overlong filter) stays in the forward
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=cmask,
        advantages=torch.randn(len(ids), generator=gen),
        rollout_logp=torch.zeros(cmask.shape),
        prompt_length=Lp,
        group_size=4,
        temperature=0.7,
    )


def _policy(path, attn: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn).train()


def _logprobs_and_grads(policy, batch, packing: str, path: str, save_probs: bool = False):
    module = GRPOModule(
        model=policy, forward=ForwardSettings(packing=packing, logprob_path=path, save_probs=save_probs)
    )
    policy.zero_grad()
    out = module.token_logprobs(policy, batch, compute_entropy=True)
    real = batch.attention_mask[:, batch.prompt_length :].float()
    (out.logp * real * batch.advantages[:, None] + 0.1 * out.entropy * real).sum().backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters()}
    return out.logp * real, out.entropy * real, grads


@pytest.mark.parametrize("path", ["chunked_hidden", "logits"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_and_gradients_equal_padded(tiny_model_path, path, attn):
    policy = _policy(tiny_model_path, attn)
    batch = _ragged_batch(policy.config.vocab_size)
    assert choose_plan(policy, batch, "auto") is not None  # this batch packs into fewer rows
    logp_pad, ent_pad, grads_pad = _logprobs_and_grads(policy, batch, "off", path)
    logp_pack, ent_pack, grads_pack = _logprobs_and_grads(policy, batch, "on", path)
    assert logp_pad.abs().max() > 1.0  # real numbers, not zeros
    torch.testing.assert_close(logp_pack, logp_pad, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_pack, ent_pad, atol=1e-5, rtol=0)
    for name, g in grads_pad.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads_pack[name], g, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("packing", ["off", "on"])
def test_saved_softmax_gives_the_recomputed_logprobs_and_gradients(tiny_model_path, packing):
    """logprob_save_probs=True (backward reuses the forward's softmax) = the recomputing path, entropy term included."""
    policy = _policy(tiny_model_path, "sdpa")
    batch = _ragged_batch(policy.config.vocab_size)
    results = {}
    for save in (False, True):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t.shape) or t, lambda t: t):
            results[save] = _logprobs_and_grads(policy, batch, packing, "chunked_hidden", save_probs=save)
        scored = int(sampled_positions(batch).sum())  # the tokens the LM head scores
        assert ((scored, policy.config.vocab_size) in saved) is save  # the softmax is kept only when asked
    (logp, ent, grads), (logp_s, ent_s, grads_s) = results[False], results[True]
    torch.testing.assert_close(logp_s, logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_s, ent, atol=1e-5, rtol=0)
    for name, g in grads.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads_s[name], g, atol=1e-5, rtol=1e-5, msg=name)


def test_reference_and_old_logprobs_equal_padded(tiny_model_path):
    """prepare_rollout_batch with a frozen reference (beta > 0) and a reused batch (old log-probs)."""
    out = {}
    for packing in ("off", "on"):
        policy = _policy(tiny_model_path, "sdpa")
        module = GRPOModule(
            model=policy,
            loss=GRPOLoss(kl=KLSettings(beta=0.04)),
            algorithm=AlgorithmSettings(num_iterations=2),
            forward=ForwardSettings(packing=packing, rows_per_pass=3),
        )
        module.configure_model()
        batch = _ragged_batch(policy.config.vocab_size)
        rewards = torch.arange(8.0)[:, None]
        out[packing] = module.prepare_rollout_batch(batch, rewards, torch.ones(1))
    real = out["off"].attention_mask[:, out["off"].prompt_length :].float()
    for field in ("ref_logp", "old_logp"):
        padded, packed = getattr(out["off"], field), getattr(out["on"], field)
        assert padded.abs().max() > 1.0
        torch.testing.assert_close(packed * real, padded * real, atol=1e-5, rtol=0, msg=field)


def test_auto_packs_only_when_it_saves_tokens(tiny_model_path):
    policy = _policy(tiny_model_path, "sdpa")
    batch = _ragged_batch(policy.config.vocab_size)
    even = batch.select(torch.tensor([0, 5]))  # two long rows: packing cannot save a row
    assert choose_plan(policy, even, "auto") is None
    assert choose_plan(policy, even, "on").rows == 2
    assert choose_plan(policy, batch, "off") is None
    plan = choose_plan(policy, batch, "auto")
    assert plan.rows * plan.width < 0.75 * batch.input_ids.numel()


def test_packing_on_needs_a_packing_aware_model():
    class Plain(nn.Module):
        def forward(self, input_ids, attention_mask=None, position_ids=None):
            raise AssertionError("never called")

    batch = _ragged_batch(32)
    with pytest.raises(ValueError, match="packing='on' needs a Hugging Face causal LM"):
        choose_plan(Plain(), batch, "on")
    assert choose_plan(Plain(), batch, "auto") is None
    with pytest.raises(ValueError, match="model.forward.packing must be one of 'auto', 'on', 'off', got 'yes'"):
        GRPOModule(model="tiny:chars", forward=ForwardSettings(packing="yes"))


@pytest.mark.parametrize("packing", ["off", "on"])
@pytest.mark.parametrize("path", ["chunked_hidden", "logits"])
def test_environment_tokens_skip_the_lm_head(tiny_model_path, monkeypatch, packing, path):
    """Multi-turn rows: environment tokens (turn_ids -1) are context, so their log-probs are 0 and the chunked
    path runs the LM head on the sampled tokens only; the sampled tokens' log-probs are unchanged."""
    import lightning_grpo.training.forward as forward_module
    from lightning_grpo.core import LogProbSpec, logprobs_from_hidden, logprobs_from_logits
    from lightning_grpo.core.registry import Registry

    policy = _policy(tiny_model_path, "sdpa")
    batch = _ragged_batch(policy.config.vocab_size)
    real = batch.attention_mask[:, batch.prompt_length :] > 0  # [B, Lc]
    batch.turn_ids = torch.where(real, 0, -1)
    full = (
        GRPOModule(model=policy, forward=ForwardSettings(packing="off", logprob_path="logits"))
        .token_logprobs(policy, batch)
        .logp
    )
    batch.turn_ids[0, 2:6] = -1  # a tool response inside row 0's completion
    batch.turn_ids[4, 1] = -1
    rows, paths = (
        [],
        Registry("log-prob path", LogProbSpec),
    )  # the LOGPROBS entries, the chunked one counting the rows it scores
    paths.register("chunked_hidden", spec=LogProbSpec(reads="hidden"))(
        lambda hidden, *a, **k: rows.append(len(hidden)) or logprobs_from_hidden(hidden, *a, **k)
    )
    paths.register("logits", spec=LogProbSpec(reads="logits"))(logprobs_from_logits)
    monkeypatch.setattr(forward_module, "LOGPROBS", paths)
    out = GRPOModule(model=policy, forward=ForwardSettings(packing=packing, logprob_path=path)).token_logprobs(
        policy, batch, compute_entropy=True
    )
    sampled = batch.turn_ids >= 0
    assert (out.logp[~sampled] == 0).all() and (out.entropy[~sampled] == 0).all()
    torch.testing.assert_close(out.logp[sampled], full[sampled], atol=1e-5, rtol=0)
    assert rows == ([int(sampled.sum())] if path == "chunked_hidden" else [])  # not every real token
