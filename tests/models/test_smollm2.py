"""The seams a real pretrained model crosses, on a real one: SmolLM2-135M-Instruct (Llama architecture, GPT-2-style
BPE, ChatML template), prepared from the pinned PyPI wheel (``smollm2_path`` / ``smollm2`` in conftest: one fetch
per machine, one loaded model per test session)."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sources import Rows
from lightning_grpo.rollout.base import SamplingConfig
from lightning_grpo.rollout.hf import HFEngine

IM_START, IM_END = 1, 2  # <|im_start|>, <|im_end|> in SmolLM2's vocabulary
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _data(**fields) -> PromptDataModule:
    format = PromptFormat(use_chat_template=True, **fields)
    return PromptDataModule(source=Rows([{"prompt": "What is 2 + 8?", "answer": 10}]), format=format, batch_size=1)


def test_the_policy_tokenizer_and_chat_template_are_the_default(smollm2_path):
    """No data.tokenizer_path: the prompts are read with the policy's own tokenizer and template (the bug: the
    built-in tiny tokenizer's, "What is 2 + 8?" became "hat is 2 + 8")."""
    dm = _data()
    dm.use_policy_tokenizer(str(smollm2_path))
    dm.setup("fit")
    record = dm.train_records[0]
    assert record["prompt"] == (
        f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 2 + 8?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert dm.tokenizer.decode(record["prompt_ids"]) == record["prompt"]  # nothing dropped, same vocabulary
    assert record["prompt_ids"][0] == IM_START and record["prompt_ids"].count(IM_END) == 2
    assert (len(dm.tokenizer), dm.tokenizer.eos_token_id, dm.tokenizer.pad_token_id) == (49152, IM_END, IM_END)
    assert dm.tokenizer_source == str(smollm2_path)


def test_a_tokenizer_of_another_model_is_refused_in_one_line(smollm2_path, tiny_cache):
    from lightning_grpo import GRPOModule
    from lightning_grpo.plan.run_plan import check_vocabulary

    module = GRPOModule(model=str(smollm2_path))
    dm = PromptDataModule(source=Rows([{"prompt": "12=", "answer": "3"}]), tokenizer_path="tiny:chars", batch_size=1)
    dm.setup("fit")
    with pytest.raises(ValueError) as err:
        check_vocabulary(dm, module)
    message = str(err.value)
    assert message.startswith(
        f"data.tokenizer_path ({dm.tokenizer_source}) does not belong to the policy ({smollm2_path})"
    )
    assert f"it has {len(dm.tokenizer)} tokens, the policy's embedding 49152 rows (another vocabulary)" in message
    assert "\n" not in message
    dm_own = PromptDataModule(
        source=Rows([{"prompt": "12=", "answer": "3"}]), tokenizer_path=str(smollm2_path), batch_size=1
    )
    dm_own.setup("fit")
    check_vocabulary(dm_own, module)  # the policy's own folder named explicitly passes


def test_the_eos_token_ends_a_greedy_chat_answer(smollm2):
    model, tokenizer = smollm2
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    engine = HFEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    rollout = engine.generate([ids], SamplingConfig(n=1, temperature=0.0, max_new_tokens=24), seed=0)
    completion = rollout.completion_ids[0]
    assert rollout.finished == [True] and completion[-1] == IM_END and IM_END not in completion[:-1]
    assert "Paris" in tokenizer.decode(completion)


def test_left_padded_prompts_answer_as_they_do_alone(smollm2):
    """Prompts of different lengths in one batch (left-padded, positions from the first real token) give the
    greedy answers each gives alone: RoPE positions and the padding mask hold on a real Llama."""
    model, tokenizer = smollm2
    questions = ["What is 3 + 4?", "Name a colour of the sky on a clear summer day, in one word."]
    prompts = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in questions]
    engine = HFEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=8)
    together = engine.generate(prompts, greedy, seed=0)
    alone = [engine.generate([p], greedy, seed=0) for p in prompts]
    assert together.completion_ids == [r.completion_ids[0] for r in alone]
    for batched, single in zip(together.logprobs, (r.logprobs[0] for r in alone)):
        torch.testing.assert_close(torch.tensor(batched), torch.tensor(single), atol=1e-4, rtol=0)


def test_lora_target_names_of_a_llama_model(smollm2):
    from lightning_grpo.models.lora import LoraSettings, check_target_modules

    model, _ = smollm2
    llama = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    check_target_modules(model, LoraSettings(target_modules=llama))
    with pytest.raises(ValueError) as err:
        check_target_modules(model, LoraSettings(target_modules=["q_proj", "c_attn"]))  # GPT-2's name: not in a Llama
    assert str(err.value).startswith("model.policy.lora.target_modules: 'c_attn' matches no module of the model")
    assert ", ".join(llama) in str(err.value)


def test_the_derived_context_length_holds_the_longest_chat_prompt(smollm2_path):
    from lightning_grpo import GRPOModule, RolloutCallback
    from lightning_grpo.plan.run_plan import context_length

    dm = _data(system_prompt="Solve the problem. End your reply with 'Answer: <number>'.")
    dm.use_policy_tokenizer(str(smollm2_path))
    dm.setup("fit")
    callback = RolloutCallback(engine="vllm", sampling=SamplingConfig(n=2, max_new_tokens=96))
    length = context_length(GRPOModule(model=str(smollm2_path)), dm, callback.plan_side())
    prompt = len(dm.train_records[0]["prompt_ids"])
    assert length == prompt + 96


def test_a_checkpoints_policy_exports_to_a_folder_that_answers_the_same_and_serves(smollm2, tmp_path):
    """The export path of a checkpoint (the stored config and tokenizer files, the policy rebuilt on meta, its tied
    head) gives a folder transformers loads with the same chat template and the same log-probs, and ``serve``
    serves it as it is: float32, its full context, a KV cache of 4 sequences of it (hand-computed)."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.cli.serve import serve_command
    from lightning_grpo.models.export import build_policy, export_info, write_model_folder

    model, tokenizer = smollm2
    module = SimpleNamespace(
        policy=model, lora=None, quantization=None, model_source=None, policy_settings=SimpleNamespace(dtype="float32")
    )
    info = export_info(module, tokenizer)
    rebuilt = build_policy({k: v.clone() for k, v in model.state_dict().items()}, info)
    out = write_model_folder(rebuilt, tokenizer, tmp_path / "model")
    loaded, loaded_tokenizer = AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": "What is 17 + 25?"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert loaded_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False).endswith(
        "<|im_start|>assistant\n"
    )
    with torch.no_grad():
        torch.testing.assert_close(loaded(**ids).logits, model(**ids).logits, atol=0, rtol=0)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # the head stays tied
    env, command = serve_command(out, "127.0.0.1", 8000, None, None, [])

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    per_token = 2 * 30 * 3 * 64 * 4  # K and V, 30 layers, 3 key-value heads of 64, float32
    assert value("--dtype") == "float32" and "--enforce-eager" in command and env == {"TORCHDYNAMO_DISABLE": "1"}
    assert int(value("--kv-cache-memory-bytes")) == 4 * 8192 * per_token  # 8192: SmolLM2's max_position_embeddings
