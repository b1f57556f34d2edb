"""Tests of lightning_grpo/training."""
