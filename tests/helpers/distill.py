"""A teacher for the distillation tests: the tiny model taught the digit task by supervised
steps (about 10 s on one core, held-out accuracy 1.0), so tests need no 1000-step GRPO run."""

from __future__ import annotations

from pathlib import Path

import torch


def train_digit_teacher(src: str | Path, out: str | Path, steps: int = 300, lr: float = 3e-3, seed: int = 0) -> Path:
    """Cross-entropy on "4821=" -> "2" + eos (the quickstart's rule) from the tiny model at ``src``;
    saves model and tokenizer to ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.data.tasks import digit_task

    tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src).train()
    train, _ = digit_task(seed=0, num_train=300, num_val=50)
    ids = torch.tensor(
        [tok(r["prompt"]).input_ids + tok(r["answer"]).input_ids + [tok.eos_token_id] for r in train]
    )  # [N, 7]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = ids[torch.randint(0, len(ids), (32,), generator=gen)]
        logits = model(input_ids=x).logits[:, 4:-1]  # [32, 2, V] predict the answer and eos
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 5:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return Path(out)
