"""Fixtures of the end-to-end runs."""

from __future__ import annotations
