"""Data: prompts, tasks and rewards (what is asked and how answers are scored).

Sources and the datamodule (:mod:`.sources`, :mod:`.tasks`, :mod:`.datamodule`, :mod:`.records`,
:mod:`.schedule`), supervised examples with assistant-only loss masks (:mod:`.sft`,
:mod:`.sft_format`), the reward registry (:mod:`.registry`) and the built-in, model-backed
and reasoning-gym rewards registered in it, and the reward set that calls them (:mod:`.reward_set`).

May import: ``core``, ``models`` (the tiny tokenizer). Knows neither the rollout engines nor the
trainer's callbacks (tests/data/test_layering.py).
"""
