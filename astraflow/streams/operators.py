"""Group operators of the stream pipeline: plain, typed, unit-tested classes.

A runtime collects the trajectories of one group (``GroupBuffer``) and passes the complete group
through the configured operators in order. Each operator either annotates the group (advantages)
and returns ``None``, or returns the reason to drop the whole group; the runtime records the
reason. Operators hold no I/O: the runtimes only move records and state.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from astraflow.config import StreamConfig
from astraflow.schemas.records import Trajectory
from astraflow.streams.advantage import grpo_advantages, is_zero_variance


@dataclass
class Group:
    """The responses sampled for one prompt, with what the operators computed for them."""

    group_id: str
    trajectories: list[Trajectory]
    advantages: np.ndarray | None = None  # [G] float32
    operators: list[str] = field(default_factory=list)

    @property
    def rewards(self) -> np.ndarray:
        return np.asarray([t.reward for t in self.trajectories], dtype=np.float64)

    @property
    def min_version(self) -> int:
        return min(t.min_version for t in self.trajectories)


class GroupOperator(Protocol):
    name: str

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        """Annotate ``group`` in place and return ``None``, or return why it is dropped."""


class StalenessFilter:
    """Drop a group when ``trainer_version − oldest token version > max_staleness`` (ALGORITHMS.md)."""

    name = "staleness"

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        lag = trainer_version - group.min_version
        return f"stale: {lag} versions behind (max {self.max_staleness})" if lag > self.max_staleness else None


class GrpoAdvantage:
    """GRPO: each response's advantage is its reward standardised within the group."""

    name = "grpo"

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        group.advantages = grpo_advantages(group.rewards).astype(np.float32)
        return None


class ZeroVarianceFilter:
    """Dynamic sampling (DAPO): a group whose rewards are all equal carries no gradient."""

    name = "zero_variance"

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        return "zero_variance: all rewards equal" if is_zero_variance(group.rewards) else None


def build_pipeline(config: StreamConfig) -> list[GroupOperator]:
    """The operators named by the stream config, in pipeline order."""
    operators: list[GroupOperator] = [StalenessFilter(config.max_staleness), GrpoAdvantage()]
    if config.drop_zero_variance:
        operators.append(ZeroVarianceFilter())
    return operators


def run_pipeline(operators: list[GroupOperator], group: Group, trainer_version: int) -> str | None:
    """Apply the operators in order; the first drop reason ends the pipeline."""
    for operator in operators:
        reason = operator(group, trainer_version)
        if reason is not None:
            return reason
        group.operators.append(operator.name)
    return None


def validate(trajectory: Trajectory) -> str | None:
    """Why a decoded trajectory cannot be trained on, or ``None`` when it is well formed."""
    if not math.isfinite(trajectory.reward):
        return f"non-finite reward {trajectory.reward!r}"
    n = len(trajectory.response_ids)
    for name in ("behaviour_logprobs", "token_versions", "loss_mask"):
        if len(getattr(trajectory, name)) != n:
            return f"{name} has {len(getattr(trajectory, name))} entries for {n} response tokens"
    if n == 0:
        return "empty response"
    if not np.isfinite(trajectory.behaviour_logprobs).all():
        return "non-finite behaviour log-probs"
    return None


class GroupBuffer:
    """Collects trajectories by group id until ``group_size`` distinct ones arrived.

    Duplicates (the same trajectory id delivered twice after a producer retry) are dropped here;
    ids of recently completed groups are remembered so a late duplicate does not start a new group.
    """

    def __init__(self, remember: int = 100_000) -> None:
        self.pending: dict[str, dict[str, tuple[Trajectory, int, int]]] = {}
        self._done: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self.duplicates = 0

    def add(self, trajectory: Trajectory, partition: int, offset: int) -> Group | None:
        """Add one trajectory; return its group once complete."""
        gid = trajectory.group_id
        members = self.pending.setdefault(gid, {}) if gid not in self._done else None
        if members is None or trajectory.trajectory_id in members:
            self.duplicates += 1
            return None
        members[trajectory.trajectory_id] = (trajectory, partition, offset)
        if len(members) < trajectory.group_size:
            return None
        del self.pending[gid]
        self._done[gid] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        ordered = sorted(members.values(), key=lambda item: item[0].trajectory_id)
        return Group(gid, [item[0] for item in ordered])

    def safe_offsets(self, positions: dict[int, int]) -> dict[int, int]:
        """Per partition, the offset up to which every record belongs to an emitted group."""
        safe = dict(positions)
        for members in self.pending.values():
            for _, partition, offset in members.values():
                safe[partition] = min(safe.get(partition, offset), offset)
        return safe
