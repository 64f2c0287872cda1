"""What a stream runtime does with trajectory records, whatever moves them: shared by both runtimes.

The native runtime (``native.py``, any log) and the faust runtime (``faust_runtime.py``, Kafka)
differ only in how records and state move: how trajectories are read, where half-filled groups
are kept, when offsets are committed. Everything a record goes through on its way is here:

1. ``_admit``: decode and validate one trajectory record. A record that does not decode, fails
   validation (NaN reward, mismatched arrays, ...) or belongs to another policy is dead-lettered
   with the reason, and becomes a failed member of its group (the record key names the group when
   the bytes do not), so the group still completes - and is dropped as ``incomplete``.
2. ``Arrival.join``: add the trajectory (or the failed member) to a ``GroupBuffer``.
3. ``_process``: run a completed group through the group operators and report it on the feedback
   topic (every group, accepted or dropped, with its trajectory ids); drops count by kind.
4. ``_send``: write the emitted groups (``Pipeline.emit``) as TrainSamples to the samples topic.

Every record goes out through ``out``, a ``RecordSink``: the log's producer for the native
runtime; for the faust runtime, an outbox it writes inside the Kafka transaction of the input
record. Metrics are not part of that: they go through the component's own producer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from astraflow.context import ComponentContext, now_ms
from astraflow.errors import AstraFlowError
from astraflow.log import Message
from astraflow.metric_names import (
    STREAM_ACCEPTED_GROUPS,
    STREAM_GROUP_REWARD,
    STREAM_REPLAYED_GROUPS,
    STREAM_STALENESS,
    stream_dropped,
)
from astraflow.schemas.records import PromptStats, TrainSample, Trajectory
from astraflow.streams.advantage import mean_std
from astraflow.streams.operators import Group, GroupBuffer, validate
from astraflow.streams.pipeline import build_pipeline


class RecordSink(Protocol):
    """Where a runtime's records go (``Producer.send`` is one)."""

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None: ...


@dataclass(frozen=True)
class Arrival:
    """One trajectory record, admitted or dead-lettered, as a member of its group."""

    group_id: str | None  # None: undecodable bytes without a key, so no group to tell
    member: str  # the trajectory id, or partition@offset when the bytes do not decode
    group_size: int  # 0: unknown (undecodable bytes)
    trajectory: Trajectory | None = None  # None: dead-lettered

    def join(self, buffer: GroupBuffer, partition: int, offset: int) -> Group | None:
        """Add this member to ``buffer``; return its group once that completes it."""
        if self.trajectory is not None:
            return buffer.add(self.trajectory, partition, offset)
        if self.group_id is None:
            return None
        return buffer.fail(self.group_id, self.member, self.group_size)


class GroupProcessor:
    """The configured pipeline of one policy, between decoded records and records out."""

    def __init__(self, ctx: ComponentContext, policy: str, out: RecordSink) -> None:
        self.ctx = ctx
        self.policy = policy
        self.out = out
        self.pipeline = build_pipeline(ctx.config.stream)
        self.drops: Counter[str] = Counter()
        self.accepted = 0
        self.replayed = 0

    def _admit(self, message: Message) -> Arrival:
        ctx = self.ctx
        try:
            trajectory = ctx.codec.decode(message.value, expect=Trajectory, keep=True)  # TrainSamples copy its bytes
        except AstraFlowError as exc:
            self._dead_letter(message, f"undecodable trajectory: {exc}", exc)
            group_id = message.key.decode("utf-8", "replace") if message.key else None
            return Arrival(group_id, f"{message.partition}@{message.offset}", 0)
        problem = validate(trajectory)
        if problem is None and trajectory.policy != self.policy:
            problem = f"policy {trajectory.policy!r} is not {self.policy!r}, the policy of this trajectories topic"
        if problem is not None:
            self._dead_letter(message, f"invalid trajectory {trajectory.trajectory_id}: {problem}")
            return Arrival(trajectory.group_id, trajectory.trajectory_id, trajectory.group_size)
        return Arrival(trajectory.group_id, trajectory.trajectory_id, trajectory.group_size, trajectory)

    def _dead_letter(self, message: Message, reason: str, error: BaseException | None = None) -> None:
        letter = self.ctx.dead_letter_record(message, reason, error)
        self.out.send(self.ctx.topics.deadletter(), self.ctx.codec.encode(letter))

    def _process(self, group: Group, version: int) -> bool:
        """Run the group operators, report the group on the feedback topic; True when accepted."""
        ctx = self.ctx
        if group.failed:
            reason = f"incomplete: {len(group.failed)} member(s) dead-lettered ({', '.join(group.failed[:3])})"
        else:
            reason = self.pipeline.process(group, version)
        rewards = [t.reward for t in group.trajectories]
        mean, std = mean_std(rewards)
        first = group.trajectories[0]
        stats = PromptStats(
            prompt_id=first.prompt_id,
            group_id=group.group_id,
            workflow=first.workflow,
            policy=self.policy,
            version=group.min_version,
            num_samples=len(group.trajectories),
            mean_reward=mean,
            reward_std=std,
            pass_rate=sum(r > 0 for r in rewards) / len(rewards),
            accepted=reason is None,
            drop_reason=reason or "",
            created_ms=now_ms(),
            trajectory_ids=[t.trajectory_id for t in group.trajectories],
        )
        self.out.send(ctx.topics.feedback(), ctx.codec.encode(stats), key=first.prompt_id.encode())
        ctx.metric(STREAM_GROUP_REWARD, stats.mean_reward, version, policy=self.policy)
        ctx.metric(STREAM_STALENESS, version - group.min_version, version, policy=self.policy)
        if reason is not None:
            self._count_drop(reason.split(":", 1)[0], version)
            return False
        self.accepted += 1
        ctx.metric(STREAM_ACCEPTED_GROUPS, self.accepted, version, policy=self.policy)
        return True

    def _count_drop(self, kind: str, version: int, count: int = 1) -> None:
        self.drops[kind] += count
        self.ctx.metric(stream_dropped(kind), self.drops[kind], version, policy=self.policy)

    def _send(self, group: Group, version: int) -> None:
        ctx = self.ctx
        if group.replay:
            self.replayed += 1
            ctx.metric(STREAM_REPLAYED_GROUPS, self.replayed, version, policy=self.policy)
        deadline = group.min_version + self.pipeline.max_staleness
        for trajectory, advantage in zip(group.trajectories, group.advantages):
            sample = TrainSample(
                sample_id=group.sample_id(trajectory),
                trajectory=trajectory,
                advantage=float(advantage),
                deadline_version=deadline,
                operators=list(group.operators),
                replayed=group.reused,
                created_ms=now_ms(),
            )
            self.out.send(ctx.topics.samples(self.policy), ctx.codec.encode(sample), key=group.group_id.encode())
