"""Tests of the algorithm core. Shared helpers live here."""

import torch
from torch.testing import assert_close

EPS = 1e-6


def close(actual, expected):
    """float32 result equal to the hand-computed value within 1e-6 (O(1) values)."""
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert actual.dtype == torch.float32
    assert_close(actual, expected, atol=1e-6, rtol=0)


def t(values):
    return torch.tensor(values, dtype=torch.float32)
