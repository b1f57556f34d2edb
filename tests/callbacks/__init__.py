"""Tests of lightning_grpo/callbacks."""
