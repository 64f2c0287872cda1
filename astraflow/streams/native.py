"""The native stream runtime: trajectories → group operators → train samples, on any log backend.

One loop per policy, in a consumer group so several processors can share the partitions. Steps
of one iteration (what makes it at-least-once with duplicates dropped):

1. Poll trajectory records; a record that does not decode or fails validation (NaN reward,
   mismatched arrays, another policy's trajectory) goes to the dead-letter topic with the reason,
   and counts as a failed member of its group (the record key names the group when the bytes do not).
2. Add each trajectory to the ``GroupBuffer`` (duplicate trajectory ids are dropped there).
3. Run every completed group through the group operators (``Pipeline.process``); a group with a
   dead-lettered member is dropped as ``incomplete`` without them. Every group, accepted or
   dropped, yields a PromptStats record on the feedback topic, listing its trajectory ids (the
   feeder's back-pressure and curators read it, ``astraflow audit`` takes the drop reasons from
   it); a drop is counted by its kind in ``stream.dropped.<kind>``.
4. The poll's accepted groups, with the replayed copies the mixers add, in the ordering's order
   (``Pipeline.emit``), go to ``{run}.samples.{policy}`` as TrainSamples that list the operators
   they passed.
5. Flush, then commit per partition the offset below which every record belongs to an emitted
   group: half-filled groups are re-read after a crash, emitted groups are never lost. A crash
   between 5's flush and commit re-emits groups; sample ids are deterministic for the trainer
   (those of replayed copies are deterministic only within one processor's lifetime).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from astraflow.context import ComponentContext, now_ms
from astraflow.errors import AstraFlowError, LogError
from astraflow.log import TopicPartition
from astraflow.schemas.records import PromptStats, TrainSample, Trajectory
from astraflow.streams.operators import Group, GroupBuffer, validate
from astraflow.streams.pipeline import build_pipeline
from astraflow.weights.follow import WeightFollower

logger = logging.getLogger(__name__)


class NativeStreamProcessor:
    """Runs the configured pipeline for one policy on the run's log."""

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        self.ctx = ctx
        self.policy = policy
        self.pipeline = build_pipeline(ctx.config.stream)
        self.buffer = GroupBuffer()
        self.drops: Counter[str] = Counter()
        self.accepted = 0
        self.replayed = 0

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        source = ctx.topics.trajectories(self.policy)
        consumer = ctx.log.consumer(group_id=f"{ctx.config.run}.stream.{self.policy}")
        consumer.subscribe([source])
        follower = WeightFollower(ctx.log, ctx.topics.weights(self.policy), payload=False).start()
        try:
            while not stop.is_set():
                messages = consumer.poll(max_records=512, timeout=0.5)
                if not messages:
                    continue
                version = max(follower.latest_version, 0)
                accepted = []
                for message in messages:
                    group = self._add(message)
                    if group is not None and self._process(group, version):
                        accepted.append(group)
                for group in self.pipeline.emit(accepted):
                    self._send(group, version)
                self._count_redeliveries(version)
                ctx.producer.flush()
                positions = {tp.partition: consumer.position(tp) for tp in consumer.assignment() if tp.topic == source}
                safe = self.buffer.safe_offsets(positions)
                try:
                    consumer.commit({TopicPartition(source, p): offset for p, offset in safe.items()})
                except LogError as exc:
                    logger.warning("commit after a rebalance rejected (the new owner re-reads): %s", exc)
        finally:
            follower.close()
            consumer.close()

    def _add(self, message) -> Group | None:
        try:
            trajectory = self.ctx.codec.decode(message.value, expect=Trajectory)
        except AstraFlowError as exc:
            self.ctx.dead_letter(message, f"undecodable trajectory: {exc}", exc)
            group_id = message.key.decode("utf-8", "replace") if message.key else None
            return None if group_id is None else self.buffer.fail(group_id, f"{message.partition}@{message.offset}")
        problem = validate(trajectory)
        if problem is None and trajectory.policy != self.policy:
            problem = f"policy {trajectory.policy!r} is not {self.policy!r}, the policy of this trajectories topic"
        if problem is not None:
            self.ctx.dead_letter(message, f"invalid trajectory {trajectory.trajectory_id}: {problem}")
            return self.buffer.fail(trajectory.group_id, trajectory.trajectory_id, trajectory.group_size)
        return self.buffer.add(trajectory, message.partition, message.offset)

    def _process(self, group: Group, version: int) -> bool:
        """Run the group operators, report the group on the feedback topic; True when accepted."""
        ctx = self.ctx
        if group.failed:
            reason = f"incomplete: {len(group.failed)} member(s) dead-lettered ({', '.join(group.failed[:3])})"
        else:
            reason = self.pipeline.process(group, version)
        rewards = group.raw_rewards
        first = group.trajectories[0]
        stats = PromptStats(
            prompt_id=first.prompt_id,
            group_id=group.group_id,
            workflow=first.workflow,
            policy=self.policy,
            version=group.min_version,
            num_samples=len(group.trajectories),
            mean_reward=float(rewards.mean()),
            reward_std=float(rewards.std()),
            pass_rate=float((rewards > 0).mean()),
            accepted=reason is None,
            drop_reason=reason or "",
            created_ms=now_ms(),
            trajectory_ids=[t.trajectory_id for t in group.trajectories],
        )
        ctx.producer.send(ctx.topics.feedback(), ctx.codec.encode(stats), key=first.prompt_id.encode())
        ctx.metric("stream.group_reward", stats.mean_reward, version, policy=self.policy)
        ctx.metric("stream.staleness", version - group.min_version, version, policy=self.policy)
        if reason is not None:
            self._count_drop(reason.split(":", 1)[0], version)
            return False
        self.accepted += 1
        ctx.metric("stream.accepted_groups", self.accepted, version, policy=self.policy)
        return True

    def _count_drop(self, kind: str, version: int, count: int = 1) -> None:
        self.drops[kind] += count
        self.ctx.metric(f"stream.dropped.{kind}", self.drops[kind], version, policy=self.policy)

    def _count_redeliveries(self, version: int) -> None:
        """Trajectories the GroupBuffer dropped as redelivered duplicates count as drops too."""
        if self.buffer.duplicates > self.drops["redelivered"]:
            self._count_drop("redelivered", version, self.buffer.duplicates - self.drops["redelivered"])

    def _send(self, group: Group, version: int) -> None:
        ctx = self.ctx
        if group.replay:
            self.replayed += 1
            ctx.metric("stream.replayed_groups", self.replayed, version, policy=self.policy)
        deadline = group.min_version + self.pipeline.max_staleness
        for trajectory, advantage in zip(group.trajectories, group.advantages):
            sample = TrainSample(
                sample_id=group.sample_id(trajectory),
                trajectory=trajectory,
                advantage=float(advantage),
                deadline_version=deadline,
                operators=list(group.operators),
                replayed=group.replay > 0,
                created_ms=now_ms(),
            )
            ctx.producer.send(ctx.topics.samples(self.policy), ctx.codec.encode(sample), key=group.group_id.encode())
