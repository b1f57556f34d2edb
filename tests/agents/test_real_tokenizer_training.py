"""The agent path end to end on a tiny random Qwen2 with the real Qwen3 vocabulary and chat template
(mechanics, not learning): HF engine, secret-digit tool environment, AgentRolloutCallback training steps."""

from __future__ import annotations

import math

import lightning as L
import torch

from lightning_grpo import AlgorithmSettings, GRPOModule, PromptDataModule, RewardSpec, SamplingConfig
from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
from lightning_grpo.agents.chat import ChatRenderer
from lightning_grpo.agents.secret_digit import SecretDigitEnv
from lightning_grpo.data.tasks import DigitTask, digit_task
from tests.helpers.agents import ids_of

CALL = '<tool_call>\n{"name": "secret_digit", "arguments": {}}\n</tool_call>'
NUM_TRAIN = 8  # digit-task prompts: the model is taught on exactly the openings the run samples from


def response(secret: str) -> str:
    return (
        f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{secret}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def taught_policy(tok):
    """A random Qwen2 (hidden 64, 2 layers, vocabulary = the tokenizer's 151,669 tokens) whose LM head
    is solved in closed form (least squares on the final hidden states) so that after each episode
    opening it samples the secret-digit call or the answer "7<|im_end|>", half and half: gradient
    steps over a 151K vocabulary would take minutes on a CPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    renderer = ChatRenderer(tok, SecretDigitEnv().tools)
    openings = [
        renderer.prompt_ids([{"role": "user", "content": r["prompt"]}]) for r in digit_task(num_train=NUM_TRAIN)[0]
    ]
    Lo, call, answer = len(openings[0]), ids_of(tok, CALL), ids_of(tok, "7<|im_end|>")
    assert all(len(o) == Lo for o in openings)
    targets = sorted(set(call) | set(answer))
    col = {t: i for i, t in enumerate(targets)}
    hidden, wanted = [], []  # rows: a final hidden state [H] and the logits wanted for `targets` there
    for cont in (call, answer):
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor([o + cont for o in openings])).last_hidden_state  # [P, L, H]
        for j in range(len(cont)):
            hidden.append(h[:, Lo - 1 + j])  # [P, H]: the position that predicts cont[j]
            row = torch.zeros(len(openings), len(targets))
            row[:, [col[call[0]], col[answer[0]]] if j == 0 else col[cont[j]]] = 25.0
            wanted.append(row)
    H, Y = torch.cat(hidden), torch.cat(wanted)  # [N, H], [N, |targets|]
    W = model.lm_head.weight.data  # [V, H]
    W[targets] += torch.linalg.lstsq(H, Y - H @ W[targets].T).solution.T
    return model.train()


def segments(ids: list[int], turn_ids: list[int]) -> list[tuple[list[int], list[int]]]:
    """(sampled ids of turn t, environment ids after it) for t = 0, 1, ..."""
    out: list[tuple[list[int], list[int]]] = []
    for i, t in zip(ids, turn_ids):
        if t >= 0 and len(out) == t:
            out.append(([], []))
        (out[-1][0] if t >= 0 else out[-1][1]).append(i)
    return out


class Recorder(L.Callback):
    """The training batches, the episodes, and every engine call of the run (prompts and outputs)."""

    def __init__(self, callback: AgentRolloutCallback):
        self.batches, self.rollouts, self.calls, self.steps = [], [], [], []
        run = callback.run

        def recording_run(engine, *args, **kwargs):
            generate, calls = engine.generate, []

            def recording_generate(prompts, sampling, seed):  # the prompts are the episodes' live lists: copied
                calls.append(([list(p) for p in prompts], generate(prompts, sampling, seed)))
                return calls[-1][1]

            engine.generate = recording_generate
            try:
                self.rollouts.append(run(engine, *args, **kwargs))
            finally:
                del engine.generate
            self.calls.append(calls)
            return self.rollouts[-1]

        callback.run = recording_run

    def on_rollout_end(self, trainer, module, batch):
        self.batches.append(batch)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.steps.append({k: float(trainer.callback_metrics[f"train/{k}"]) for k in ("loss", "grad_norm")})


def check_episode(tok, rollout, calls, batch, b: int) -> int:
    """Episode ``b``: the training row holds its ids; each turn's engine call got its context so far and
    returned exactly its sampled ids and log-probs; a call is followed by the template's tool response.
    Returns the number of such calls."""
    ids, tid, episodes, Lp = rollout.completion_ids[b], rollout.turn_ids[b], rollout.episodes, batch.prompt_length
    assert batch.completion_ids[b, : len(ids)].tolist() == ids and batch.turn_ids[b, : len(ids)].tolist() == tid
    context = list(rollout.prompt_ids[b // rollout.group_size])
    assert batch.input_ids[b, Lp - len(context) : Lp].tolist() == context
    calls_made = 0
    for t, (sampled, env) in enumerate(segments(ids, tid)):
        prompts, out = calls[t]
        k = sum(1 for e in episodes[:b] if e.turns > t)  # this episode's row among turn t's live ones
        assert prompts[k] == context  # the context grew by exactly the sampled and environment ids
        assert out.completion_ids[k] == sampled  # trained ids == sampled ids, with the engine's log-probs
        assert [lp for lp, j in zip(rollout.logprobs[b], tid) if j == t] == out.logprobs[k]
        if env and tok.decode(sampled) == CALL:  # a call: the template's tool-response framing follows
            assert env == ids_of(tok, response(episodes[b].env.secret))
            calls_made += 1
        context += sampled + env
    return calls_made


def test_agent_steps_on_the_real_vocabulary(qwen_tokenizer):
    tok = qwen_tokenizer
    policy = taught_policy(tok)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    callback = AgentRolloutCallback(
        agent=AgentSettings(environment="secret_digit", max_turns=3),
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=16),
        seed=1,
        rewards=[RewardSpec("env_reward"), RewardSpec("tool_call_made"), RewardSpec("length", weight=0.01)],
    )
    rec = Recorder(callback)
    dm = PromptDataModule(DigitTask(num_train=NUM_TRAIN, num_val=2), batch_size=2)
    dm.tokenizer = tok
    trainer = L.Trainer(
        max_steps=2,
        log_every_n_steps=1,  # rec reads each step's logged metrics
        callbacks=[callback, rec],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    # a small learning rate keeps the second pass over the batch inside the PPO clip range (a gradient there too)
    module = GRPOModule(
        model=policy,
        algorithm=AlgorithmSettings(num_iterations=2),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-5),
    )
    trainer.fit(module, datamodule=dm)
    assert callback.sampling.stop_token_ids == [tok.eos_token_id, tok.convert_tokens_to_ids("</tool_call>")]
    assert len(rec.rollouts) == 1 and len(rec.batches) == 1  # 2 steps = 1 generation batch x 2 iterations
    assert rec.batches[0].advantages.abs().max() > 0  # calls and answers differ in reward: a policy gradient
    rollout, batch = rec.rollouts[0], rec.batches[0]
    assert torch.equal(batch.completion_mask, (batch.turn_ids >= 0).float())  # environment tokens carry no loss
    calls_made = sum(check_episode(tok, rollout, rec.calls[0], batch, b) for b in range(len(rollout.episodes)))
    # one forward over each whole trajectory gives the engine's log-probs on every sampled token
    sampled = (
        batch.completion_mask.bool()
    )  # float32 round-off: off the taught contexts the solved head gives log-probs down to ~-140
    torch.testing.assert_close(batch.old_logp[sampled], batch.rollout_logp[sampled], atol=1e-3, rtol=1e-4)
    assert calls_made >= 2
    assert len(rec.steps) == 2
    assert all(math.isfinite(step["loss"]) and step["grad_norm"] > 0 for step in rec.steps), rec.steps
    after = policy.state_dict()
    assert all(
        not torch.equal(before[k], after[k]) for k in ("lm_head.weight", "model.layers.0.self_attn.q_proj.weight")
    )
