"""The Qwen3 tool track's pieces (recipes/qwen3_tool_*.yaml): the built-in ``tiny:qwen3`` model on the real Qwen3
tokenizer, and SFT transcripts that teach exactly the tokens a secret-digit episode samples."""

from __future__ import annotations

import re

import pytest
from safetensors.torch import load_file

from lightning_grpo.agents.chat import ChatRenderer
from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
from lightning_grpo.agents.secret_digit import SecretDigitEnv, SecretDigitTranscripts
from lightning_grpo.data.sft_format import assistant_mask
from lightning_grpo.rollout.base import SamplingConfig
from tests.helpers.agents import ScriptedEngine

QUESTION = "What is the secret digit? Call the tool to find out, then reply with the digit only."
IM_END, TOOL_CALL_END = 151645, 151658


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory, qwen_tokenizer):
    from lightning_grpo.models.tiny_qwen3 import TinyQwen3Config, tiny_qwen3_dir

    root = tmp_path_factory.mktemp("qwen3")
    return [tiny_qwen3_dir(TinyQwen3Config(seed=s), cache_dir=root) for s in (0, 1)]


def test_tiny_qwen3_is_a_qwen3_on_the_real_tokenizer(qwen3_dirs, qwen_tokenizer, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    from lightning_grpo.models.tiny import builtin_model_path, builtin_tokenizer_path

    config = AutoConfig.from_pretrained(qwen3_dirs[0])
    assert config.model_type == "qwen3" and config.tie_word_embeddings and config.vocab_size >= len(qwen_tokenizer)
    tok = AutoTokenizer.from_pretrained(qwen3_dirs[0])
    assert len(tok) == 151669 and tok.chat_template == qwen_tokenizer.chat_template
    a, b = (load_file(f"{d}/model.safetensors") for d in qwen3_dirs)
    assert not a["model.embed_tokens.weight"].equal(b["model.embed_tokens.weight"])  # the seed sets the init
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(qwen3_dirs[0].parent))
    monkeypatch.setenv("PL_GLOBAL_SEED", "1")
    assert builtin_model_path("tiny:qwen3") == str(qwen3_dirs[1]) and builtin_model_path("tiny:qwen3@0") == str(
        qwen3_dirs[0]
    )
    assert builtin_tokenizer_path("tiny:qwen3") == str(qwen3_dirs[0])


def test_untied_variant_has_its_own_head_and_a_unit_embedding(tmp_path, qwen_tokenizer, monkeypatch):
    """``tiny:qwen3-untied`` (the tool track's model): the seed's body, an LM head of its own, and the input embedding
    the same draw as the tied model's, rescaled to std 1; the tied model keeps its folder."""
    from transformers import AutoConfig

    from lightning_grpo.models.tiny import builtin_model_path
    from lightning_grpo.models.tiny_qwen3 import TinyQwen3Config

    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path))
    tied, untied = builtin_model_path("tiny:qwen3@2"), builtin_model_path("tiny:qwen3-untied@2")
    assert tied != untied and tied.endswith(f"tiny-qwen3-{TinyQwen3Config(seed=2).key()}")
    assert TinyQwen3Config().key() == "7a444227003e"  # the seed-0 tied model's key (its cache folder) is pinned
    assert not AutoConfig.from_pretrained(untied).tie_word_embeddings
    a, b = load_file(f"{tied}/model.safetensors"), load_file(f"{untied}/model.safetensors")
    assert "lm_head.weight" in b and "lm_head.weight" not in a
    embed = b["model.embed_tokens.weight"]
    assert embed.std().item() == pytest.approx(1.0, abs=0.01) and b["lm_head.weight"].std().item() == pytest.approx(
        0.02, abs=1e-3
    )
    assert embed.allclose(a["model.embed_tokens.weight"] * 50, atol=1e-5)  # the tied draw, x 1.0 / 0.02
    assert a["model.layers.0.self_attn.q_proj.weight"].equal(b["model.layers.0.self_attn.q_proj.weight"])
    with pytest.raises(ValueError, match="embedding_std must be None or a number > 0 with tie_word_embeddings=False"):
        TinyQwen3Config(embedding_std=1.0)
    with pytest.raises(ValueError, match="got 0 with tie_word_embeddings=False"):
        TinyQwen3Config(tie_word_embeddings=False, embedding_std=0)


def test_eight_head_variant_is_the_untied_model_with_eight_heads(tmp_path, qwen_tokenizer, monkeypatch):
    """``tiny:qwen3-untied-8h`` (the tool track's model): the untied model with 8 attention heads (and 8 key-value
    heads) of 32 on the same hidden size 64, in a folder of its own, its initialisation from the seed."""
    from transformers import AutoConfig

    from lightning_grpo.models.tiny import builtin_model_path

    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path))
    two, eight, other = (
        builtin_model_path(f"tiny:{v}") for v in ("qwen3-untied@2", "qwen3-untied-8h@2", "qwen3-untied-8h@3")
    )
    assert len({two, eight, other}) == 3
    config = AutoConfig.from_pretrained(eight)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.hidden_size) == (
        8,
        8,
        32,
        64,
    )
    assert not config.tie_word_embeddings
    a, b = load_file(f"{eight}/model.safetensors"), load_file(f"{other}/model.safetensors")
    assert a["model.layers.0.self_attn.q_proj.weight"].shape == (8 * 32, 64)
    assert a["model.layers.0.self_attn.k_proj.weight"].shape == (8 * 32, 64)
    assert a["model.embed_tokens.weight"].std().item() == pytest.approx(1.0, abs=0.01) and "lm_head.weight" in a
    assert not a["model.layers.0.self_attn.q_proj.weight"].equal(b["model.layers.0.self_attn.q_proj.weight"])


def test_transcripts_teach_the_tokens_an_episode_samples(qwen_tokenizer):
    """An episode whose model says exactly what a transcript's assistant turns say reproduces that transcript's
    token ids; the SFT loss covers the sampled tokens (the call, the answer) and nothing the environment wrote."""
    tok = qwen_tokenizer

    def say(call, row, prompt):  # turn 0: the transcript's call; turn 1: the answer after Qwen3's empty think block
        if call == 0:
            return tok(
                '<tool_call>\n{"name": "secret_digit", "arguments": {}}\n</tool_call>', add_special_tokens=False
            )["input_ids"]
        digit = re.findall(r"<tool_response>\n(\d)\n</tool_response>", tok.decode(prompt))[-1]
        return tok(f"<think>\n\n</think>\n\n{digit}<|im_end|>", add_special_tokens=False)["input_ids"]

    env = SecretDigitEnv(question=QUESTION)
    sampling = SamplingConfig(n=1, max_new_tokens=32, stop_token_ids=[IM_END, TOOL_CALL_END])
    out = run_episodes(
        ScriptedEngine(say, eos_id=IM_END),
        lambda: SecretDigitEnv(question=QUESTION),
        tok,
        ChatRenderer(tok, env.tools),
        [{"prompt": "x"}] * 3,
        sampling,
        seed=5,
        limits=EpisodeLimits(max_turns=2),
        reset_seed="episode",
    )
    source = SecretDigitTranscripts(question=QUESTION, num_train=1)
    for row, episode in enumerate(out.episodes):
        assert episode.reward == 1.0
        secret = episode.messages[-2]["content"]
        transcript = source._rows(1, 0)[0]
        transcript["messages"][2]["content"] = transcript["messages"][3]["content"] = secret
        ids, mask = assistant_mask(transcript["messages"], tok, "row", transcript["tools"])
        sequence = out.prompt_ids[row] + out.completion_ids[row]
        assert ids[: len(sequence)] == sequence and tok.decode(ids[len(sequence) :]) == "\n"
        sampled = [0] * len(out.prompt_ids[row]) + [int(t >= 0) for t in out.turn_ids[row]]
        # the mask adds one token: the <|im_end|> that closes the call turn (the episode stops at </tool_call>)
        extra = [i for i, (m, s) in enumerate(zip(mask, sampled)) if m != s]
        assert len(extra) == 1 and sequence[extra[0]] == IM_END and sequence[extra[0] - 1] == TOOL_CALL_END


def test_transcripts_split_and_bad_input():
    source = SecretDigitTranscripts(question=QUESTION, num_train=50, num_val=20, seed=3)
    train, val = source.train_rows(), source.val_rows()
    assert (len(train), len(val)) == (50, 20) and train != source._rows(50, 4)
    assert {r["answer"] for r in train} == set("0123456789") and all(
        r["messages"][3]["content"] == r["answer"] for r in train
    )
    weak = SecretDigitTranscripts(num_train=2000, weak_digits="456789", slip=0.7).train_rows()
    said = [(r["answer"], r["messages"][3]["content"]) for r in weak]
    assert all(s == a for a, s in said if a in "0123")  # always right on the strong digits
    slips = [s != a for a, s in said if a in "456789"]
    assert all(s == str((int(a) + 1) % 10) for a, s in said if s != a)  # a slip says the next digit
    assert abs(sum(slips) / len(slips) - 0.7) < 0.04
    with pytest.raises(ValueError, match="SecretDigitTranscripts.slip must be a probability in"):
        SecretDigitTranscripts(slip=1.5)
    with pytest.raises(ValueError, match="SecretDigitTranscripts.weak_digits must be a string of digits"):
        SecretDigitTranscripts(weak_digits="4a")
    with pytest.raises(ValueError, match="SecretDigitTranscripts.num_train must be a positive integer, got 0"):
        SecretDigitTranscripts(num_train=0)
    with pytest.raises(ValueError, match="SecretDigitTranscripts.question must be a non-empty string"):
        SecretDigitTranscripts(question=" ")
