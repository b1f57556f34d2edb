"""Tests of lightning_grpo/cli."""
