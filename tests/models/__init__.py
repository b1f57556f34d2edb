"""Tests of lightning_grpo/models."""
