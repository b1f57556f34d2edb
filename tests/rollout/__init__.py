"""Tests of the rollout engines (lightning_grpo/rollout). Shared helpers: tests/helpers/rollout.py."""
