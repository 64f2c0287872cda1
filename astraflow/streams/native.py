"""The native stream runtime: trajectories → group operators → train samples, on any log backend.

One loop per policy, in a consumer group so several processors can share the partitions; what
happens to a record on its way (steps 1, 3, 4) is shared with the faust runtime
(``streams.processing``). Steps of one iteration (what makes it at-least-once with duplicates
dropped):

1. Poll trajectory records; a record that does not decode or fails a check (``schemas.validation``:
   reward bound, token ids and lengths, loss mask, group size, token versions, record size, or
   another policy's trajectory) goes to the dead-letter topic with the reason, and counts as a
   failed member of its group (the record key names the group when the bytes do not).
2. Add each trajectory to the ``GroupBuffer`` (duplicate trajectory ids are dropped there). Groups
   still missing members ``stream.group_timeout_s`` after their first one, in record timestamps,
   are given up: their members dead-lettered, the group dropped as ``incomplete``.
3. Run every completed group through the group operators (``Pipeline.process``); a group with a
   dead-lettered member is dropped as ``incomplete`` without them; an operator that raises drops
   the group as ``error`` and dead-letters its members. Every group, accepted or
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
   on the spot (embedded: ``settled`` flushes); else, after each poll, the loop commits the
   offsets of the latest earlier poll whose sends the broker has acknowledged meanwhile
   (``Producer.mark``: the broker acknowledges one batch while the loop reads the next), and
   flushes to commit everything when the log is idle or offsets have waited ``MAX_COMMIT_DELAY_S``.
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
        follower = self.follower = WeightFollower(ctx.log, ctx.topics.weights(self.policy), payload=False).start()
        offline_sources = [
            OfflineSource(ctx, self.policy, mixer, self.pipeline.operators, index, self.limits)
            for index, mixer in enumerate(self.pipeline.offline)
        ]
        pending: list[tuple[int, dict[TopicPartition, int], float]] = []
        """Per poll not committed yet: the producer's mark after its sends, its offsets, when it was read."""

        def commit(settled: int) -> None:
            """Commit the offsets of the first ``settled`` polls of ``pending`` (all of them: the
            offline sources' too), whose sends are acknowledged."""
            offsets: dict[TopicPartition, int] = {}
            for _, polled, _ in pending[:settled]:
                offsets.update(polled)
            try:
                if offsets:
                    consumer.commit(offsets)
            except LogError as exc:
                logger.warning("commit after a rebalance rejected (the new owner re-reads): %s", exc)
            all_settled = settled == len(pending)
            del pending[:settled]
            if all_settled:  # offline sources commit their positions, which every sent sample is below only now
                for offline in offline_sources:
                    offline.commit()

        def commit_settled() -> None:
            """Commit the polls whose sends are acknowledged, without waiting for any."""
            for index in range(
                len(pending), 0, -1
            ):  # marks increase: the last settled poll settles every one before it
                if ctx.producer.settled(pending[index - 1][0]):
                    commit(index)
                    return

        try:
            while not stop.is_set():
                version = max(follower.latest_version, 0)  # raises at once if the follower died
                messages = consumer.poll(max_records=512, timeout=0.5)
                if pending and (not messages or time.monotonic() - pending[0][2] > MAX_COMMIT_DELAY_S):
                    ctx.producer.flush()
                    commit(len(pending))
                elif pending:  # the samples of earlier polls may have been acknowledged while this one was read
                    commit_settled()
                if not messages:
                    continue
                read_at = time.monotonic()
                accepted = []
                for message in messages:
                    group = self._add(message)
                    if group is not None and self._process(group, version):
                        accepted.append(group)
                self._expire(self.buffer, version)
                for offline in offline_sources:
                    offline.fill(sum(len(group.trajectories) for group in accepted), version)
                self._emit(accepted, version)
                self._count_redeliveries(version)
                # the partitions this poll read from (asking for the others' positions costs a round trip each)
                polled = {message.partition for message in messages}
                positions = {p: consumer.position(TopicPartition(source, p)) for p in polled}
                safe = {TopicPartition(source, p): offset for p, offset in self.buffer.safe_offsets(positions).items()}
                pending.append((ctx.producer.mark(), safe, read_at))
                if ctx.producer.settled():  # the embedded log writes here, at once; Kafka acknowledges later
                    commit(len(pending))
            if pending:
                ctx.producer.flush()
                commit(len(pending))
        finally:
            for offline in offline_sources:
                offline.close()
            follower.close()
            consumer.close()

    def _add(self, message: Message) -> Group | None:
        return self._join(self._admit(message), self.buffer, message)

    def _count_redeliveries(self, version: int) -> None:
        """Trajectories the GroupBuffer dropped as redelivered duplicates count as drops too."""
        if self.buffer.duplicates > self.drops["redelivered"]:
            self._count_drop("redelivered", version, self.buffer.duplicates - self.drops["redelivered"])
