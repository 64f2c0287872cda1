"""What a stream runtime does with trajectory records, whatever moves them: shared by both runtimes.

The native runtime (``native.py``, any log) and the faust runtime (``faust_runtime.py``, Kafka)
differ only in how records and state move: how trajectories are read, where half-filled groups
are kept, when offsets are committed. Everything a record goes through on its way is here:

1. ``_admit``: decode and check one trajectory record (``schemas.validation``: reward bound,
   token ids and length against the model, loss mask, group size, token versions, and here its
   size against the samples topic and, with ``stream.verify_tasks``, its task: ``issued_tasks.py``).
   A record that does not decode, fails a check or belongs to another policy is dead-lettered with
   the reason, and becomes a failed member of its group (the
   record key names the group when the bytes do not), so the group still completes - and is
   dropped as ``incomplete``.
2. ``Arrival.join``: add the trajectory (or the failed member) to a ``GroupBuffer``, stamped with
   the record's timestamp; ``_expire`` gives up groups still missing members
   ``stream.group_timeout_s`` of log time after their first one (their members are dead-lettered).
3. ``_process``: run a completed group through the group operators and report it on the feedback
   topic (every group, accepted or dropped, with its trajectory ids); drops count by kind.
4. ``_emit``: write the emitted groups (``Pipeline.emit``: mixed, ordered) as TrainSamples to the
   samples topic.

No record can stop the processor: an exception raised while checking one record, or while an
operator, mixer or ordering handles one group, dead-letters that record or the group's members
with the exception's type and text (``error: <type>``), and the processor goes on. So does a group
whose advantages come out non-finite. Failures outside one record's handling (the log, the weight
follower) still end the processor, for the launcher to restart it.

Every record goes out through ``out``, a ``RecordSink``: for the native runtime its transactional
producer, in the transaction of the poll that read the input; for the faust runtime, an outbox it
writes inside the Kafka transaction of the input record. Metrics are not part of that: they go
through the component's own producer.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from astraflow.core.errors import AstraFlowError, WeightFollowerError, error_reason
from astraflow.core.metric_names import (
    STREAM_ACCEPTED_GROUPS,
    STREAM_GROUP_REWARD,
    STREAM_REPLAYED_GROUPS,
    STREAM_STALENESS,
    stream_dropped,
)
from astraflow.log import Message
from astraflow.runtime.base_checkpoint import base_checkpoint_dir, model_limits
from astraflow.runtime.context import SAMPLE_HEADROOM_BYTES, ComponentContext, now_ms
from astraflow.schemas.records import PromptStats, TrainSample, Trajectory
from astraflow.schemas.validation import Limits, clipped, id_problem, validate
from astraflow.streams.operators.advantage import mean_std
from astraflow.streams.operators.base import Group, GroupBuffer
from astraflow.streams.operators.pipeline import build_pipeline
from astraflow.streams.runtimes.issued_tasks import IssuedTasks, verifies_tasks
from astraflow.weights.follow import WeightFollower

logger = logging.getLogger(__name__)
VERSION_WAIT_S = 2.0
"""How long, in all, the trajectories of one poll (the native runtime) or of one
``VERSION_WAIT_WINDOW_S`` (faust) may wait for the weight follower to see a version their tokens
name: the producer and this processor read the manifests independently, so the producer may see a
new version a moment sooner. A record naming a version still unseen once the budget is spent is
dead-lettered without waiting. The bound is per poll, not per record: 11 records from the future
used to outlast Kafka's 20 s transaction timeout, and the same poll repeated for ever."""
VERSION_WAIT_WINDOW_S = 10.0
"""The faust runtime's window for ``VERSION_WAIT_S``: it handles one record at a time, not polls."""


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

    def join(self, buffer: GroupBuffer, message: Message) -> Group | None:
        """Add this member to ``buffer``; return its group once that completes it."""
        if self.trajectory is not None:
            return buffer.add(self.trajectory, message.partition, message.offset, message.timestamp_ms)
        if self.group_id is None:
            return None
        return buffer.fail(self.group_id, self.member, self.group_size, message.timestamp_ms)


class GroupProcessor:
    """The configured pipeline of one policy, between decoded records and records out."""

    def __init__(self, ctx: ComponentContext, policy: str, out: RecordSink) -> None:
        self.ctx = ctx
        self.policy = policy
        self.out = out
        self.pipeline = build_pipeline(ctx.config.stream)
        vocab_size, context_length = model_limits(base_checkpoint_dir(ctx.config, ctx.run_dir))
        self.limits = Limits(
            ctx.config.stream.max_abs_reward, ctx.config.rollout.group_size, vocab_size, context_length
        )
        self.timeout_ms = int(ctx.config.stream.group_timeout_s * 1000)
        self.check_versions = any(operator.name == "staleness" for operator in self.pipeline.operators)
        """Token versions count this run's versions only where staleness is judged by them (not in a replay)."""
        self.follower: WeightFollower | None = None
        """The trainer's published versions (set by the runtime; without one, token versions go unchecked)."""
        self.tasks = IssuedTasks(ctx, policy) if verifies_tasks(ctx) else None
        """The issued tasks each trajectory is checked against (``stream.verify_tasks``), or ``None``."""
        self.drops: Counter[str] = Counter()
        self.accepted = 0
        self.replayed = 0
        self.refill_version_wait()

    def refill_version_wait(self) -> None:
        """Start a new ``VERSION_WAIT_S`` budget: at each poll (native), each window (faust)."""
        self._wait_left = VERSION_WAIT_S
        self._wait_refilled = time.monotonic()

    def _admit(self, message: Message) -> Arrival:
        ctx = self.ctx
        try:
            trajectory = ctx.codec.decode(message.value, expect=Trajectory, keep=True)  # TrainSamples copy its bytes
        except AstraFlowError as exc:
            if message.value is None:  # a tombstone (Kafka): a dead letter's payload must still be bytes
                message = dataclasses.replace(message, value=b"")
            return self._undecodable(message, str(exc), exc)
        try:
            problem = self._problem(message, trajectory)
        except WeightFollowerError:  # not this record's fault: the processor ends, its restart reads it again
            raise
        except Exception as exc:  # a check that raises rejects this record, never the processor
            self._dead_letter(
                message, f"invalid trajectory {clipped(trajectory.trajectory_id)}: {error_reason(exc)}", exc
            )
            return self._rejected(message, trajectory)
        if problem is not None:
            self._dead_letter(message, f"invalid trajectory {clipped(trajectory.trajectory_id)}: {problem}")
            return self._rejected(message, trajectory)
        return Arrival(trajectory.group_id, trajectory.trajectory_id, trajectory.group_size, trajectory)

    def _undecodable(self, message: Message, reason: str, error: BaseException | None = None) -> Arrival:
        """Dead-letter bytes that are no trajectory: a failed member of the group the record key names."""
        self._dead_letter(message, f"undecodable trajectory: {reason}", error)
        group_id = message.key.decode("utf-8", "replace") if message.key else None
        return Arrival(group_id, f"{message.partition}@{message.offset}", 0)

    def _rejected(self, message: Message, rejected: Trajectory) -> Arrival:
        """The failed member a rejected trajectory makes, counted at the policy's group size, not the one it
        announced (which may be what is wrong with it). Where its group id or trajectory id is what is
        wrong, it is a member of the group its record key names, by its position: an empty or oversized
        group id would leave the siblings waiting for ``stream.group_timeout_s``, and empty trajectory
        ids would count as one member."""
        key = message.key.decode("utf-8", "replace") if message.key else None
        group_id = rejected.group_id if id_problem(rejected.group_id) is None else key
        member = rejected.trajectory_id
        if id_problem(member) is not None:
            member = f"{message.partition}@{message.offset}"
        return Arrival(group_id, member, self.limits.group_size or rejected.group_size)

    def _problem(self, message: Message, trajectory: Trajectory) -> str | None:
        """Why ``trajectory`` (decoded from ``message``) is rejected, or ``None``."""
        newest = None
        if self.check_versions and self.follower is not None and len(trajectory.token_versions):
            newest = self._newest_version(int(trajectory.token_versions.max()))
        problem = validate(trajectory, self.limits, newest)
        if problem is None and trajectory.policy != self.policy:
            problem = f"policy: {trajectory.policy!r} is not {self.policy!r}, the policy of this trajectories topic"
        if problem is None and self.tasks is not None:
            problem = self.tasks.problem(trajectory)
        if problem is None:
            too_large = self.ctx.oversize(self.ctx.topics.samples(self.policy), message.value, SAMPLE_HEADROOM_BYTES)
            problem = None if too_large is None else f"record size: {too_large} (as a train sample)"
        return problem

    def close_followers(self) -> None:
        """Close what the checks follow: the trainer's weights topic and the tasks topic."""
        if self.follower is not None:
            self.follower.close()
        if self.tasks is not None:
            self.tasks.close()

    def _newest_version(self, needed: int) -> int:
        """The newest published version, once it is ``needed`` or the poll's wait budget is spent
        (``VERSION_WAIT_S``); the base checkpoint (version 0) counts as published before the trainer's
        first manifest."""
        follower = self.follower
        if max(follower.latest_version, 0) < needed and self._wait_left > 0:  # version 0 needs no waiting
            started = time.monotonic()
            follower.wait_for(needed, timeout=self._wait_left)
            self._wait_left -= time.monotonic() - started
        return max(follower.latest_version, 0)

    def _dead_letter(self, message: Message, reason: str, error: BaseException | None = None) -> None:
        letter = self.ctx.dead_letter_record(message, reason, error)
        self.out.send(self.ctx.topics.deadletter(self.ctx.role), self.ctx.codec.encode(letter))

    def _dead_letter_members(self, group: Group, reason: str, error: BaseException | None = None) -> None:
        """Dead-letter every trajectory of ``group`` (re-encoded) at the position it was read from."""
        topic = self.ctx.topics.trajectories(self.policy)
        positions = group.positions or [(-1, -1)] * len(group.trajectories)
        for trajectory, (partition, offset) in zip(group.trajectories, positions):
            message = Message(topic, partition, offset, group.group_id.encode(), self.ctx.codec.encode(trajectory), 0)
            where = f"trajectory {trajectory.trajectory_id} of group {group.group_id}"
            self._dead_letter(message, f"{reason} ({where})", error)

    def _join(self, arrival: Arrival, buffer: GroupBuffer, message: Message) -> Group | None:
        """``arrival.join``, except that a member of a group already given up is dead-lettered."""
        if arrival.trajectory is not None and arrival.group_id in buffer.expired_ids:
            self._dead_letter(
                message,
                f"group_size: trajectory {arrival.member} came after its group {arrival.group_id} "
                f"was given up (stream.group_timeout_s)",
            )
            return None
        return arrival.join(buffer, message)

    def _expire(self, buffer: GroupBuffer, version: int) -> list[Group]:
        """Give up the groups of ``buffer`` past ``stream.group_timeout_s``: their members are
        dead-lettered, the group reported and counted as ``incomplete``. Returns them."""
        expired = buffer.expire(self.timeout_ms)
        for group in expired:
            self._process(group, version)
        return expired

    def _process(self, group: Group, version: int) -> bool:
        """Run the group operators, report the group on the feedback topic; True when accepted."""
        ctx = self.ctx
        reason = self._verdict(group, version)
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

    def _verdict(self, group: Group, version: int) -> str | None:
        """Why ``group`` is dropped (its members dead-lettered where nothing else keeps them), or ``None``."""
        if group.failed:
            return f"incomplete: {len(group.failed)} member(s) dead-lettered ({', '.join(group.failed[:3])})"
        if group.expired:
            reason = (
                f"incomplete: {len(group.trajectories)} of {group.trajectories[0].group_size} members "
                f"within stream.group_timeout_s ({self.timeout_ms / 1000:g} s)"
            )
            self._dead_letter_members(group, f"group_size: {reason}")
            return reason
        try:
            reason = self.pipeline.process(group, version)
        except Exception as exc:  # an operator that raises drops this group, never the processor
            logger.exception("stream operator failed on group %s", group.group_id)
            self._dead_letter_members(group, error_reason(exc), exc)
            return error_reason(exc)
        if reason is None and group.advantages is not None and not np.isfinite(group.advantages).all():
            reason = f"invalid: non-finite advantages {group.advantages.tolist()}"
            self._dead_letter_members(group, f"advantage: {reason}")
        if reason is None and group.token_advantages is not None:
            members = zip(group.trajectories, group.token_advantages, strict=True)
            broken = [trajectory.trajectory_id for trajectory, tokens in members if not np.isfinite(tokens).all()]
            if broken:
                reason = f"invalid: non-finite token advantages of {', '.join(broken[:3])}"
                self._dead_letter_members(group, f"advantage: {reason}")
        return reason

    def _count_drop(self, kind: str, version: int, count: int = 1) -> None:
        self.drops[kind] += count
        self.ctx.metric(stream_dropped(kind), self.drops[kind], version, policy=self.policy)

    def _emit(self, accepted: list[Group], version: int) -> None:
        """Send the groups the pipeline emits for ``accepted`` (mixed in, ordered) as TrainSamples.

        A mixer or ordering that raises dead-letters the members of ``accepted``; a group whose
        samples cannot be made, its own members. Either is counted as ``emit_error``.
        """
        try:
            emitted = self.pipeline.emit(accepted)
        except Exception as exc:
            logger.exception("stream mixer or ordering failed")
            for group in accepted:
                self._dead_letter_members(group, error_reason(exc), exc)
                self._count_drop("emit_error", version)
            return
        for group in emitted:
            try:
                samples = self._samples(group)
            except Exception as exc:
                logger.exception("could not make the samples of group %s", group.group_id)
                self._dead_letter_members(group, error_reason(exc), exc)
                self._count_drop("emit_error", version)
                continue
            self._send(group, samples, version)

    def _samples(self, group: Group) -> list[bytes]:
        """The encoded TrainSamples of ``group``'s members."""
        deadline = group.min_version + self.pipeline.max_staleness
        per_token = group.token_advantages or [np.zeros(0, dtype=np.float32)] * len(group.trajectories)
        return [
            self.ctx.codec.encode(
                TrainSample(
                    sample_id=group.sample_id(trajectory),
                    trajectory=trajectory,
                    advantage=float(advantage),
                    deadline_version=deadline,
                    operators=list(group.operators),
                    replayed=group.reused,
                    created_ms=now_ms(),
                    token_advantages=tokens,
                )
            )
            for trajectory, advantage, tokens in zip(group.trajectories, group.advantages, per_token, strict=True)
        ]

    def _send(self, group: Group, samples: list[bytes], version: int) -> None:
        ctx = self.ctx
        if group.replay:
            self.replayed += 1
            ctx.metric(STREAM_REPLAYED_GROUPS, self.replayed, version, policy=self.policy)
        for value in samples:
            self.out.send(ctx.topics.samples(self.policy), value, key=group.copy_id.encode())
