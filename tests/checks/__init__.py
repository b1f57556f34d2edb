"""Tests of lightning_grpo/checks."""
