"""How near a push that leaves one linear group stale is to the previous weights: the weight push check's d_old /
d_new when each of vLLM's linear groups (qkv, o, gate_up, down per layer) in turn is left out of a push.

The built-in tiny model in the in-process vLLM engine (float32, CPU): the probe is taken at step 0; step 1 adds
N(0, scale^2) noise to every weight (a stand-in optimizer step) and is pushed with one group skipped. A push
passes the check's ratio rule when d_old >= CLOSER x d_new, so each ratio here must stay below CLOSER.

    python benchmarks/push_check_partial.py --scales 0.05 0.005 0.0005

Prints one JSON line (``RESULT {...}``): per scale, the ratio of each skipped group.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from types import SimpleNamespace

import torch


def nudged(policy, scale: float):
    """A copy of ``policy`` with every weight moved by N(0, scale^2) noise (seed 1)."""
    moved = copy.deepcopy(policy)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in moved.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale)
    return moved


def run(scales: list[float]) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    from transformers import AutoModelForCausalLM

    from lightning_grpo import GRPOModule
    from lightning_grpo.callbacks.push_check import PushCheck, mean_gap
    from lightning_grpo.models.tiny import tiny_model_dir
    from lightning_grpo.models.weights import policy_weights_for_engine
    from lightning_grpo.rollout.vllm import VLLMEngine
    from lightning_grpo.rollout.vllm_args import VLLMArgs
    from lightning_grpo.rollout.vllm_push import CpuInplacePush

    path = str(tiny_model_dir())
    engine = VLLMEngine(path, VLLMArgs(max_model_len=512, kv_cache_memory_bytes=64 * 1024**2))
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    load, groups = CpuInplacePush._load_linear, []

    def push(weights_of, skip=None) -> None:
        def loader(self, lin, weights):
            if skip is None:
                groups.append(tuple(lin.sources))
            if tuple(lin.sources) != skip:
                load(self, lin, weights)

        CpuInplacePush._load_linear = loader
        try:
            engine.load_weights(policy_weights_for_engine(weights_of))
        finally:
            CpuInplacePush._load_linear = load

    push(policy)
    module = GRPOModule(model=policy)
    module.configure_model()
    ids = torch.tensor([[5, 6, 7, 10, 11, 1], [0, 8, 9, 12, 0, 0]])
    check = PushCheck(every=1)
    check.take_probe(module, SimpleNamespace(input_ids=ids, attention_mask=(ids > 0).long()), engine, step=0)
    before, ratios = check.expect(module, 0), {}
    for scale in scales:
        step = GRPOModule(model=nudged(policy, scale))
        step.configure_model()
        after, rows = check.expect(step, 1), {}
        for skip in list(dict.fromkeys(groups)):
            push(policy)  # the engine back at step 0, then step 1 without one group
            push(step.policy, skip)
            scores = next(iter(engine.score(check.probe).values()))
            rows[skip[0]] = mean_gap(scores, before.logp) / mean_gap(scores, after.logp)
        ratios[str(scale)] = rows
        push(policy)
    engine.close()
    return {"noise": check.noise, "d_old_over_d_new": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", type=float, nargs="+", default=[0.05, 0.005, 0.0005])
    print("RESULT " + json.dumps(run(parser.parse_args().scales)))


if __name__ == "__main__":
    main()
