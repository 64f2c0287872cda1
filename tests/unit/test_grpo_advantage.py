"""GRPO advantages against hand-computed values (sample std, ddof = 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from astraflow.streams.operators.advantage import grpo_advantages, is_zero_variance

ROOT3_2 = math.sqrt(3) / 2


@pytest.mark.parametrize(
    ("rewards", "expected", "zero_variance"),
    [
        ([1, 0, 0, 0], [1.5, -0.5, -0.5, -0.5], False),  # mean 0.25, std 0.5
        ([1, 1, 0, 0], [ROOT3_2, ROOT3_2, -ROOT3_2, -ROOT3_2], False),  # mean 0.5, std 1/sqrt(3)
        ([0, 2], [-1 / math.sqrt(2), 1 / math.sqrt(2)], False),  # mean 1, std sqrt(2)
        ([1, 1, 1, 1], [0, 0, 0, 0], True),
        ([0, 0, 0], [0, 0, 0], True),
        ([3.0], [0.0], True),
    ],
)
def test_grpo_advantages(rewards: list[float], expected: list[float], zero_variance: bool) -> None:
    advantages = grpo_advantages(np.asarray(rewards, dtype=np.float32))
    assert advantages.dtype == np.float32
    np.testing.assert_allclose(advantages, expected, atol=1e-5)
    assert is_zero_variance(np.asarray(rewards)) is zero_variance


@pytest.mark.parametrize("rewards", [[1.0, float("nan")], [float("inf"), 0.0], []])
def test_grpo_rejects_bad_rewards(rewards: list[float]) -> None:
    with pytest.raises(ValueError):
        grpo_advantages(np.asarray(rewards))
