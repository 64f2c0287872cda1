"""Group-relative advantages (GRPO) and the zero-variance test of dynamic sampling.

GRPO (DeepSeekMath, Shao et al. 2024): A_i = (r_i - mean(r)) / (std(r) + eps) over the G responses to
one prompt. ``std`` is the sample standard deviation (ddof = 1), as in TRL and verl, which use
``torch.std``; a group of one has no spread and gets advantage 0. A group whose rewards are all equal
carries no signal: DAPO's dynamic sampling drops it (``is_zero_variance``) and counts the drop.
"""

from __future__ import annotations

import numpy as np


def grpo_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Advantages [G] float32 of one group's rewards [G]; raises ``ValueError`` on non-finite rewards."""
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"rewards must be a non-empty 1-D array, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"rewards must be finite, got {values.tolist()}")
    if values.size == 1:
        return np.zeros(1, dtype=np.float32)
    centred = values - values.mean()
    return (centred / (values.std(ddof=1) + eps)).astype(np.float32)


def is_zero_variance(rewards: np.ndarray, atol: float = 1e-9) -> bool:
    """True when every reward of the group is equal (within ``atol``): no learning signal."""
    values = np.asarray(rewards, dtype=np.float64)
    return bool(values.size == 0 or np.ptp(values) <= atol)
