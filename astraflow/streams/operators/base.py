"""The operator contracts of the stream pipeline, the registry, and the group buffer.

A runtime collects the trajectories of one group (``GroupBuffer``) and passes the complete group
through the configured operators (``pipeline.build_pipeline``). Three kinds, by dataflow stage:

- a ``GroupOperator`` annotates the group (rewards, advantages) and returns ``None``, or returns
  the reason to drop the whole group (``"<kind>: <detail>"``; the runtime counts drops by kind).
  Filters act on whole groups because group-relative advantages need every member and the
  trainer assembles batches of whole groups;
- a ``Mixer`` sees each accepted group and returns extra groups to emit with it (replayed
  copies), so the runtime stays a loop that only moves records;
- an ``Ordering`` orders the groups that are ready to be emitted together.

Operators hold no I/O. Each class is registered under its YAML name (``@register``) and built
from its spec's fields (``astraflow.config.pipeline``). An operator that remembers something
between groups (running statistics, a replay buffer) is a ``StatefulOperator``: the native
runtime writes its ``state_dict`` to the changelog in the transaction of each poll that changed
it, and loads it back when a processor starts, so a restarted processor goes on exactly as the
one that committed last would have.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from astraflow.schemas.records import Trajectory


@dataclass
class Group:
    """The responses sampled for one prompt, with what the operators computed for them."""

    group_id: str
    trajectories: list[Trajectory]
    advantages: np.ndarray | None = None  # [G] float32
    operators: list[str] = field(default_factory=list)
    replay: int = 0  # 0: fresh; n: the n-th replayed copy of this group
    origin: str = ""  # "": this run's; "#offline<pass>": mixed in from an offline topic (its ids are another run's)
    failed: list[str] = field(default_factory=list)  # members that were dead-lettered: the group is incomplete
    positions: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) of each trajectory's record
    expired: bool = False  # completed by ``stream.group_timeout_s``, not by its last member: incomplete
    token_advantages: list[np.ndarray] | None = None  # G x [R_i] float32 (step-level operators), else None
    rewards: np.ndarray = field(init=False)  # [G] float64, rewritten by reward normalisation

    def __post_init__(self) -> None:
        self.rewards = self.raw_rewards

    @property
    def raw_rewards(self) -> np.ndarray:
        """[G] float64, the rewards as the producers scored them."""
        return np.asarray([t.reward for t in self.trajectories], dtype=np.float64)

    @cached_property
    def min_version(self) -> int:
        """Oldest weight version among the members' tokens (computed once: the members never change)."""
        return min(t.min_version for t in self.trajectories)

    @property
    def reused(self) -> bool:
        """True for data this run already trained on (a replayed copy) or did not generate (offline)."""
        return self.replay > 0 or bool(self.origin)

    @property
    def copy_suffix(self) -> str:
        """What marks this copy of the group: ``""`` for the fresh group, ``#offline<pass>`` for offline
        data, ``#replay<n>`` for the n-th replayed copy."""
        return self.origin + (f"#replay{self.replay}" if self.replay else "")

    @property
    def copy_id(self) -> str:
        """The key of this copy's sample records: the group id with ``copy_suffix``. The trainer cuts
        batches at whole copies: a replayed copy is a group of its own, never stale with its original."""
        return self.group_id + self.copy_suffix

    def sample_id(self, trajectory: Trajectory) -> str:
        """The TrainSample id of one member: the trajectory id, suffixed for offline data and replayed copies."""
        return trajectory.trajectory_id + self.copy_suffix


class GroupOperator(Protocol):
    name: str

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        """Annotate ``group`` in place and return ``None``, or return why it is dropped."""


class Mixer(Protocol):
    name: str

    def mix(self, group: Group) -> list[Group]:
        """Groups to emit besides the accepted ``group`` (which the mixer may remember)."""


class Ordering(Protocol):
    name: str

    def order(self, groups: list[Group]) -> list[Group]:
        """The groups ready to be emitted, in emission order."""


TrajectoryLookup = Callable[[list[tuple[int, int]]], list[Trajectory | None]]
"""The trajectories at these (partition, offset) positions of the policy's trajectories topic, in
order (``None`` for a record that is gone): how a state that names trajectories by position
gets them back without the operator doing I/O."""


@runtime_checkable
class StatefulOperator(Protocol):
    """An operator (of any kind) whose memory outlives one group, saved and restored by the runtime."""

    name: str

    def state_dict(self) -> bytes:
        """Everything the operator remembers, such that ``load_state_dict`` of it on a new instance
        (same parameters) makes one that behaves exactly as this one from now on."""

    def load_state_dict(self, state: bytes, lookup: TrajectoryLookup) -> None:
        """Replace what the operator remembers by ``state`` (from ``state_dict``)."""


OPERATORS: dict[str, type] = {}
"""Operator classes by YAML name; filled by ``@register`` when their modules are imported."""

_T = TypeVar("_T", bound=type)


def register(cls: _T) -> _T:
    """Class decorator: make ``cls`` buildable from the spec whose ``op`` is ``cls.name``."""
    OPERATORS[cls.name] = cls
    return cls


def run_pipeline(operators: list[GroupOperator], group: Group, trainer_version: int) -> str | None:
    """Apply the operators in order; the first drop reason ends the pipeline."""
    for operator in operators:
        reason = operator(group, trainer_version)
        if reason is not None:
            return reason
        group.operators.append(operator.name)
    return None


class GroupBuffer:
    """Collects trajectories by group id until ``group_size`` distinct ones arrived.

    Duplicates (the same trajectory id delivered twice after a producer retry) are dropped here;
    ids of recently completed groups are remembered so a late duplicate does not start a new group.
    A member that was dead-lettered counts towards its group's size (``fail``), so the group still
    completes - with ``Group.failed`` set, for the runtime to drop - instead of waiting forever. A
    group whose last members never come (a producer died part-way, or announced a larger group) is
    given up by ``expire`` once the log's time - the newest record timestamp seen - is ``timeout``
    past its first member's.

    With ``keep_closed`` the ids of the groups closed (completed or given up) are also kept in
    ``closed`` until the runtime takes them, for it to journal them; ``mark_closed`` puts such an
    id back into a new buffer.
    """

    def __init__(self, remember: int = 100_000, keep_closed: bool = False) -> None:
        self.pending: dict[str, dict[str, tuple[Trajectory, int, int]]] = {}
        self.failed: dict[str, dict[str, int]] = {}
        """Group id → dead-lettered member (trajectory id, or partition@offset) → its group_size (0: unknown)."""
        self.started: dict[str, int] = {}
        """Group id → timestamp (ms) of its first member's record, in arrival order."""
        self.clock = 0
        """The newest record timestamp (ms) seen: the log's time, which ``expire`` measures against."""
        self._done: OrderedDict[str, None] = OrderedDict()
        self.expired_ids: OrderedDict[str, None] = OrderedDict()
        """Recently expired groups (``expire``): a member arriving later is late, not a duplicate."""
        self._remember = remember
        self.duplicates = 0
        self.closed: list[tuple[str, bool]] | None = [] if keep_closed else None
        """With ``keep_closed``: (group id, given up) of each group closed since the runtime last emptied it."""

    def add(self, trajectory: Trajectory, partition: int, offset: int, timestamp: int = 0) -> Group | None:
        """Add one trajectory; return its group once complete."""
        gid = trajectory.group_id
        members = self.pending.setdefault(gid, {}) if gid not in self._done else None
        if members is None or trajectory.trajectory_id in members:
            self.duplicates += 1
            return None
        members[trajectory.trajectory_id] = (trajectory, partition, offset)
        self._tick(gid, timestamp)
        return self._complete(gid, trajectory.group_size)

    def fail(self, group_id: str, member: str, group_size: int = 0, timestamp: int = 0) -> Group | None:
        """Count a dead-lettered member of ``group_id``; return the group once that completes it."""
        if group_id in self._done:
            return None
        self.failed.setdefault(group_id, {})[member] = group_size
        self._tick(group_id, timestamp)
        return self._complete(group_id, group_size)

    def expire(self, timeout_ms: int) -> list[Group]:
        """Give up the groups whose first member is more than ``timeout_ms`` older than the log's time:
        each is returned with ``expired`` set (none for a group whose every member was dead-lettered)."""
        expired = []
        for gid in self.overdue(timeout_ms):
            group = self._close(gid, expired=True)
            if group is not None:
                group.expired = True
                expired.append(group)
        return expired

    def overdue(self, timeout_ms: int) -> list[str]:
        """The ids of the groups ``expire`` would give up now."""
        overdue = []
        for gid, started in self.started.items():
            if self.clock - started <= timeout_ms:
                break  # arrival order: the groups after this one started later (within clock skew)
            overdue.append(gid)
        return overdue

    def _tick(self, gid: str, timestamp: int) -> None:
        self.started.setdefault(gid, timestamp)
        self.clock = max(self.clock, timestamp)

    def _complete(self, gid: str, group_size: int) -> Group | None:
        members = self.pending.get(gid, {})
        failed = self.failed.get(gid, {})
        size = max([group_size, *failed.values()] + [t.group_size for t, _, _ in members.values()])
        if size == 0 or len(members) + len(failed) < size:
            return None
        return self._close(gid)

    def mark_closed(self, gid: str, expired: bool = False) -> None:
        """Remember ``gid`` as closed (``expired``: given up), as closing it would."""
        self._done[gid] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        if expired:
            self.expired_ids[gid] = None
            if len(self.expired_ids) > self._remember:
                self.expired_ids.popitem(last=False)

    def _close(self, gid: str, expired: bool = False) -> Group | None:
        """Remove ``gid`` from the pending groups and remember it as done; its group, if it has a trajectory."""
        members = self.pending.pop(gid, {})
        failed = self.failed.pop(gid, {})
        self.started.pop(gid, None)
        self.mark_closed(gid, expired)
        if self.closed is not None:
            self.closed.append((gid, expired))
        if not members:
            return None
        ordered = sorted(members.values(), key=lambda item: item[0].trajectory_id)
        return Group(
            gid,
            [item[0] for item in ordered],
            failed=sorted(failed),
            positions=[(partition, offset) for _, partition, offset in ordered],
        )
