"""The native stream runtime: trajectories → group operators → train samples, on any log backend.

One loop per policy, in a consumer group so several processors can share the partitions; what
happens to a record on its way (steps 1, 3, 4) is shared with the faust runtime
(``streams.processing``). Steps of one iteration (what makes it at-least-once with duplicates
dropped):

1. Poll trajectory records; a record that does not decode or fails validation (NaN reward,
   mismatched arrays, another policy's trajectory) goes to the dead-letter topic with the reason,
   and counts as a failed member of its group (the record key names the group when the bytes do not).
2. Add each trajectory to the ``GroupBuffer`` (duplicate trajectory ids are dropped there).
3. Run every completed group through the group operators (``Pipeline.process``); a group with a
   dead-lettered member is dropped as ``incomplete`` without them. Every group, accepted or
   dropped, yields a PromptStats record on the feedback topic, listing its trajectory ids (the
   feeder's back-pressure and curators read it, ``astraflow audit`` takes the drop reasons from
   it); a drop is counted by its kind in ``stream.dropped.<kind>``.
4. The poll's accepted groups, with the replayed copies and offline groups the mixers add (each
   offline source first reads what those groups earn it, ``streams.offline``), in the ordering's order
   (``Pipeline.emit``), go to ``{run}.samples.{policy}`` as TrainSamples that list the operators
   they passed.
5. Commit per partition the offset below which every record belongs to an emitted group
   (offline sources commit theirs likewise), once every record sent before is acknowledged:
   half-filled groups are re-read after a crash, emitted groups are never lost. The commit
   waits for the acknowledgements without blocking: it happens at once where the log writes
   on the spot (embedded: ``settled`` flushes), else after the next poll when they have arrived
   meanwhile (the broker acknowledges one batch while the loop reads the next), and after a
   flush when the log is idle or the offsets have waited ``MAX_COMMIT_DELAY_S``.
   A crash before the commit re-emits groups; sample ids are deterministic for the trainer
   (those of replayed copies are deterministic only within one processor's lifetime).
"""

from __future__ import annotations

import logging
import threading
import time

from astraflow.context import ComponentContext
from astraflow.errors import LogError
from astraflow.log import Message, TopicPartition
from astraflow.streams.offline import OfflineSource
from astraflow.streams.operators import Group, GroupBuffer
from astraflow.streams.processing import GroupProcessor
from astraflow.weights.follow import WeightFollower

logger = logging.getLogger(__name__)

MAX_COMMIT_DELAY_S = 1.0
"""The longest offsets wait for their samples' acknowledgements before the loop waits for them."""


class NativeStreamProcessor(GroupProcessor):
    """Runs the configured pipeline for one policy on the run's log."""

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        super().__init__(ctx, policy, ctx.producer)
        self.buffer = GroupBuffer()

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        source = ctx.topics.trajectories(self.policy)
        consumer = ctx.log.consumer(group_id=f"{ctx.config.run}.stream.{self.policy}")
        consumer.subscribe([source])
        follower = WeightFollower(ctx.log, ctx.topics.weights(self.policy), payload=False).start()
        offline_sources = [OfflineSource(ctx, self.policy, mixer, self.pipeline.operators, index) for index, mixer in enumerate(self.pipeline.offline)]
        pending: dict[TopicPartition, int] = {}  # offsets to commit once what was sent before them is acknowledged
        pending_since = 0.0

        def commit() -> None:
            try:
                consumer.commit(pending)
            except LogError as exc:
                logger.warning("commit after a rebalance rejected (the new owner re-reads): %s", exc)
            pending.clear()
            for offline in offline_sources:
                offline.commit()

        try:
            while not stop.is_set():
                messages = consumer.poll(max_records=512, timeout=0.5)
                if pending and (not messages or time.monotonic() - pending_since > MAX_COMMIT_DELAY_S):
                    ctx.producer.flush()
                    commit()
                elif pending and ctx.producer.settled():  # the previous poll's samples arrived while this one was read
                    commit()
                if not messages:
                    continue
                version = max(follower.latest_version, 0)
                accepted = []
                for message in messages:
                    group = self._add(message)
                    if group is not None and self._process(group, version):
                        accepted.append(group)
                for offline in offline_sources:
                    offline.fill(sum(len(group.trajectories) for group in accepted), version)
                for group in self.pipeline.emit(accepted):
                    self._send(group, version)
                self._count_redeliveries(version)
                # the partitions this poll read from (asking for the others' positions costs a round trip each)
                polled = {message.partition for message in messages}
                positions = {p: consumer.position(TopicPartition(source, p)) for p in polled}
                if not pending:
                    pending_since = time.monotonic()
                pending.update({TopicPartition(source, p): offset for p, offset in self.buffer.safe_offsets(positions).items()})
                if ctx.producer.settled():  # the embedded log writes here, at once; Kafka acknowledges later
                    commit()
            if pending:
                ctx.producer.flush()
                commit()
        finally:
            for offline in offline_sources:
                offline.close()
            follower.close()
            consumer.close()

    def _add(self, message: Message) -> Group | None:
        return self._admit(message).join(self.buffer, message.partition, message.offset)

    def _count_redeliveries(self, version: int) -> None:
        """Trajectories the GroupBuffer dropped as redelivered duplicates count as drops too."""
        if self.buffer.duplicates > self.drops["redelivered"]:
            self._count_drop("redelivered", version, self.buffer.duplicates - self.drops["redelivered"])
