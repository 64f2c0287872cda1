"""Group filters: each returns ``None`` to pass a group or ``"<kind>: <detail>"`` to drop it.

A filter drops the whole group, never single responses: the advantage of a response is relative
to its group, and the trainer assembles batches of whole groups (``group_size`` members).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from astraflow.streams.operators.advantage import is_zero_variance
from astraflow.streams.operators.base import Group, register


@register
class StalenessFilter:
    """Drop a group when ``trainer_version − oldest token version > max_staleness`` (docs/algorithms.md)."""

    name = "staleness"

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        lag = trainer_version - group.min_version
        return f"stale: {lag} versions behind (max {self.max_staleness})" if lag > self.max_staleness else None


@register
class ZeroVarianceFilter:
    """Dynamic sampling (DAPO): a group whose rewards are all equal carries no gradient.

    Tests the rewards as the operators before it left them: after ``reward_terms``, the shaped ones
    (a group of equal scores whose invalid moves differ is kept); reward normalisation maps equal
    rewards to equal rewards, so it changes nothing here.
    """

    name = "zero_variance"

    def __init__(self, atol: float = 1e-9) -> None:
        self.atol = atol

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        return "zero_variance: all rewards equal" if is_zero_variance(group.rewards, self.atol) else None


@register
class ResponseLengthFilter:
    """Drop a group when any response is shorter than ``min_tokens`` or longer than ``max_tokens``."""

    name = "response_length"

    def __init__(self, min_tokens: int = 1, max_tokens: int | None = None) -> None:
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        lengths = [len(t.response_ids) for t in group.trajectories]
        if min(lengths) < self.min_tokens:
            return f"response_length: {min(lengths)} tokens < min {self.min_tokens}"
        if self.max_tokens is not None and max(lengths) > self.max_tokens:
            return f"response_length: {max(lengths)} tokens > max {self.max_tokens}"
        return None


@register
class RewardRangeFilter:
    """Keep a group only when its mean reward (``on="mean"``) or every reward (``"each"``) is in range.

    With ``on="mean"`` and bounds inside (0, 1) this is PRIME's online difficulty filter: drop
    prompts the policy already solves, or cannot solve at all, by their pass rate.
    """

    name = "reward_range"

    def __init__(self, low: float | None = None, high: float | None = None, on: str = "mean") -> None:
        self.low = -np.inf if low is None else low
        self.high = np.inf if high is None else high
        self.on = on

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        rewards = group.raw_rewards
        values = rewards.mean(keepdims=True) if self.on == "mean" else rewards
        outside = values[(values < self.low) | (values > self.high)]
        if outside.size:
            return f"reward_range: {self.on} reward {float(outside[0]):g} outside [{self.low:g}, {self.high:g}]"
        return None


@register
class DuplicateFilter:
    """Drop a group holding a trajectory id that an earlier group passed here.

    ``GroupBuffer`` already drops a redelivered trajectory while its group is open or recently
    done; this filter also catches the same trajectory arriving in another group (e.g. from a
    second source). Memory is bounded: the ``remember`` most recent ids, oldest forgotten first.
    """

    name = "duplicate"

    def __init__(self, remember: int = 100_000) -> None:
        self.remember = remember
        self._seen: OrderedDict[str, None] = OrderedDict()

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        for trajectory in group.trajectories:
            if trajectory.trajectory_id in self._seen:
                return f"duplicate: trajectory {trajectory.trajectory_id} already passed"
        for trajectory in group.trajectories:
            self._seen[trajectory.trajectory_id] = None
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        return None
