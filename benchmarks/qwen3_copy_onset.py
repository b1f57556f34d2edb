"""When does the Qwen3 tool track's SFT learn to copy the tool's digit into the answer, per initialisation?

A hand-written loop with the pieces of recipes/qwen3_tool_sft.yaml (the tiny Qwen3 on the real tokenizer, the weak
demonstrator's transcripts, the token-mean loss on assistant tokens, AdamW lr 1e-2, 32 transcripts a step), so that
model and optimizer variants can be compared a few minutes per seed, SFT only. Every ``--every`` steps it prints the
greedy answer's agreement with the demonstrator (``acc_demo``; the copy is learned when it leaves the format-only
plateau, 0.13-0.17) and with the true secret (``acc_truth``) on the 100 validation transcripts, and the mean pairwise
cosine of the ten digits' input embeddings (``cos``). docs/evidence/qwen3.md (the tool track) lists what it measured.

    python benchmarks/qwen3_copy_onset.py --seed 7 --steps 150 --untied --embedding-std 1.0 --beta2 0.95 --heads 8
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn.functional as F

from lightning_grpo.agents.secret_digit import SecretDigitTranscripts
from lightning_grpo.data.sft_format import INPUT_IDS, LOSS_MASK, SFTFormat
from lightning_grpo.models.tiny_qwen3 import TinyQwen3Config, build_tiny_qwen3, load_qwen3_tokenizer

QUESTION = "What is the secret digit? Call the tool to find out, then reply with the digit only."


def encode(rows: list[dict], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, L] token ids and loss weights (every transcript renders to the same length)."""
    examples = SFTFormat(use_chat_template=True).build(
        rows, "the transcripts", tokenizer
    )  # as SFTDataModule builds them
    return torch.tensor([e[INPUT_IDS] for e in examples]), torch.tensor(
        [e[LOSS_MASK] for e in examples], dtype=torch.float
    )


def check(
    model, ids: torch.Tensor, answers: list[str], demos: list[str], digit_ids: torch.Tensor
) -> tuple[float, float]:
    """(agreement with the demonstrator, with the secret) of the greedy answer token."""
    with torch.no_grad():
        hidden = model.model(input_ids=ids[:, :-3]).last_hidden_state[:, -1]  # [N, H] the position before the answer
        top = model.lm_head(hidden).argmax(-1)  # [N]
    said = [str(int((digit_ids == t).nonzero()[0])) if (digit_ids == t).any() else "" for t in top]
    return (
        sum(s == d for s, d in zip(said, demos)) / len(said),
        sum(s == a for s, a in zip(said, answers)) / len(said),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="the initialisation (as seed_everything sets tiny:qwen3)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--untied", action="store_true", help="an LM head of its own (tiny:qwen3-untied's)")
    parser.add_argument(
        "--heads",
        type=int,
        default=2,
        help="attention heads (= key-value heads) of head_dim 32 (8: tiny:qwen3-untied-8h's)",
    )
    parser.add_argument(
        "--weak-digits", default="3456789", help="the demonstrator's weak secrets (the recipe's; before: 456789)"
    )
    parser.add_argument(
        "--embedding-std", type=float, default=None, help="the input embedding's init std (needs --untied)"
    )
    args = parser.parse_args()

    tokenizer = load_qwen3_tokenizer()
    source = SecretDigitTranscripts(
        question=QUESTION, num_train=2000, num_val=100, weak_digits=args.weak_digits, slip=0.85
    )
    train_ids, train_mask = encode(source.train_rows(), tokenizer)  # [2000, L] each
    val_rows = source.val_rows()
    val_ids, _ = encode(val_rows, tokenizer)  # [100, L]
    answers, demos = [r["answer"] for r in val_rows], [r["messages"][-1]["content"] for r in val_rows]
    digit_ids = torch.tensor([tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
    config = TinyQwen3Config(
        tie_word_embeddings=not args.untied,
        embedding_std=args.embedding_std,
        seed=args.seed,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
    )
    model = build_tiny_qwen3(config, tokenizer)
    torch.manual_seed(1000 + args.seed)
    random.seed(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, args.beta2), fused=True)
    start, order, k = time.perf_counter(), torch.randperm(len(train_ids)), 0
    for step in range(args.steps + 1):
        if step % args.every == 0:
            model.eval()
            demo_acc, truth_acc = check(model, val_ids, answers, demos, digit_ids)
            model.train()
            embed = F.normalize(model.get_input_embeddings().weight[digit_ids].detach(), dim=-1)  # [10, H]
            cos = float((embed @ embed.T).sum() - 10) / 90
            print(
                f"step {step} cos {cos:.2f} acc_demo {demo_acc:.2f} acc_truth {truth_acc:.2f} t {time.perf_counter() - start:.0f}s",
                flush=True,
            )
        if step == args.steps:
            break
        if k + 32 > len(order):
            order, k = torch.randperm(len(train_ids)), 0
        batch, k = order[k : k + 32], k + 32
        ids, weights = train_ids[batch], train_mask[batch][:, 1:]  # [32, L], [32, L-1]
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]  # [32, L-1, H]
        trained = weights > 0
        logits = model.lm_head(hidden[trained])  # [n, V] the assistant positions only
        loss = (F.cross_entropy(logits, ids[:, 1:][trained], reduction="none") * weights[trained]).sum() / weights.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
