"""The native stream runtime: trajectories → group operators → train samples, exactly once, on any log.

One loop per policy, in the consumer group ``{run}.stream.{policy}``; what happens to a record
on its way (steps 2-4) is shared with the faust runtime (``streams.processing``). Each poll is
one transaction of the processor's transactional producer (``Log.transactional_producer``): the
poll's outputs, the changes to the processor's state and the input offsets become visible
together, or not at all. Steps of one iteration:

1. Poll up to ``POLL_RECORDS`` trajectory records. A partition newly assigned gets its
   ``GroupBuffer`` back from the changelog (``streams.changelog``): its half-filled groups,
   re-read from the records they point at (``streams.pending``), and the ids of its recently
   closed groups. Begin a transaction, and send the positions after the poll as the group's
   offsets in it. The offsets are the positions, not the first record of a half-filled group:
   its members are in the changelog, so no record is read twice, and a group split across a
   commit completes after a restart. They go first so that their round trips to the group
   coordinator come before the outputs are written, not between the outputs and the commit.
2. Admit each record into its partition's buffer: a record that does not decode or fails a check
   (``schemas.validation``) is dead-lettered and counts as a failed member of its group (the
   record key names the group when the bytes do not); a duplicate trajectory id, or a late copy
   of a closed group, is dropped and counted as ``redelivered``. Groups still missing members
   ``stream.group_timeout_s`` after their first one, in log time (the newest record timestamp
   seen), are given up: their members dead-lettered, the group dropped as ``incomplete``.
3. Run every completed group through the group operators; every group, accepted or dropped,
   yields a PromptStats record on the feedback topic; drops count by kind (``stream.dropped.*``).
4. The accepted groups, with the replayed copies and offline groups the mixers add (each offline
   source first reads what those groups earn it, ``streams.offline``), in the ordering's order,
   go to ``{run}.samples.{policy}`` as TrainSamples that list the operators they passed.
5. Journal what the poll changed to the changelog: each partition's half-filled groups, the ids
   of the groups closed, the ``state_dict`` of each stateful operator (reward-normalisation
   statistics, the REINFORCE++ window, the replay buffer with its credit and random generator),
   and the log time.
6. Commit, as soon as the poll's groups are emitted and journaled.

A crash leaves nothing of the open transaction visible. The restarted processor's transactional
producer (id ``{run}.stream.{policy}``: one processor per policy, as ``astraflow run`` starts it)
fences its predecessor and ends the transaction it left open; the processor loads the state of
the last commit and reads on from its offsets. So every input record's outputs are written
exactly once, and a restarted processor emits what an uninterrupted one would have (TrainSample
``created_ms`` aside). A commit the log aborts (``TransactionAbortedError``: the consumer lost
partitions to a rebalance, or the embedded log stayed locked) takes the processor back to its
last commit - state from the changelog, consumer at the committed offsets - and it goes on. A
fenced producer (a newer processor of the policy), a record the log refuses, or any other
failure ends the processor, for the launcher to restart it.

Outside the transactions: metrics (the component's own producer); the ``duplicate`` filter's id
memory. Each offline source's position is journaled in the changelog (``offline␟{index}``) and
its mixer's fed groups are mixer state, so offline groups are mixed in exactly once too.
"""

from __future__ import annotations

import logging
import threading

from astraflow.context import ComponentContext
from astraflow.errors import TransactionAbortedError
from astraflow.log import Consumer, Message, TopicPartition
from astraflow.metric_names import STREAM_REWINDS
from astraflow.schemas.records import Trajectory
from astraflow.streams.changelog import CLOCK, Changelog, operator_key, pending_key
from astraflow.streams.offline import OfflineSource, state_key
from astraflow.streams.operators import Group, GroupBuffer, StatefulOperator
from astraflow.streams.pending import read_records, read_trajectories, restore, snapshot, snapshot_offsets
from astraflow.streams.pipeline import build_pipeline
from astraflow.streams.processing import GroupProcessor
from astraflow.weights.follow import follow_weights

logger = logging.getLogger(__name__)

POLL_RECORDS = 512
"""The most trajectory records one poll, and so one transaction, handles."""


class NativeStreamProcessor(GroupProcessor):
    """Runs the configured pipeline for one policy on the run's log, one transaction per poll."""

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        transactions = ctx.log.transactional_producer(f"{ctx.config.run}.stream.{policy}")  # fences the predecessor
        super().__init__(ctx, policy, transactions)
        self.transactions = transactions
        self.source = ctx.topics.trajectories(policy)
        self.changelog = Changelog.load(ctx.log, ctx.topics.stream_changelog(policy))
        self.buffers: dict[int, GroupBuffer] = {}
        """Per assigned input partition, its half-filled groups and recently closed ids."""
        self.rewinds = 0
        self._redelivered = 0
        self._restored: list[Group] = []
        self._clock = 0
        self._restore()

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        consumer = ctx.log.consumer(group_id=f"{ctx.config.run}.stream.{self.policy}")
        try:
            consumer.subscribe([self.source])
            self.follower = follow_weights(ctx, self.policy, payload=False)
            while not stop.is_set():
                offline_sources = [
                    OfflineSource(
                        ctx,
                        self.policy,
                        mixer,
                        self.pipeline.operators,
                        index,
                        self.limits,
                        self.changelog.table.get(state_key(index)),
                        self._dead_letter,
                    )
                    for index, mixer in enumerate(self.pipeline.offline)
                ]
                try:
                    self._serve(consumer, offline_sources, stop)
                except TransactionAbortedError as exc:
                    logger.warning("the log aborted a transaction, back to the last commit: %s", exc)
                    self._rewind(consumer)
                finally:
                    for offline in offline_sources:
                        offline.close()
        finally:
            if self.follower is not None:
                self.follower.close()
            consumer.close()
            self.transactions.close()  # aborts a transaction left open by a failure

    def _serve(self, consumer: Consumer, offline_sources: list[OfflineSource], stop: threading.Event) -> None:
        while not stop.is_set():
            version = max(self.follower.latest_version, 0)  # raises at once if the follower died
            messages = consumer.poll(max_records=POLL_RECORDS, timeout=0.5)
            self._sync(consumer)
            if not messages and not self._restored:
                self.ctx.producer.flush()  # the metrics of the last poll, while the log is idle
                continue
            self.transactions.begin()
            polled = {TopicPartition(self.source, message.partition) for message in messages}
            self.transactions.send_offsets(consumer, {tp: consumer.position(tp) for tp in polled})
            self._handle(messages, version, offline_sources)
            self.transactions.commit()
            self.changelog.committed()

    def _handle(self, messages: list[Message], version: int, offline_sources: list[OfflineSource]) -> None:
        """Steps 2 to 5 of the module docstring for one poll, into the open transaction."""
        restored, self._restored = self._restored, []
        accepted = [group for group in restored if self._process(group, version)]
        for message in messages:
            group = self._add(message)
            if group is not None and self._process(group, version):
                accepted.append(group)
        self._clock = max([self._clock, *(buffer.clock for buffer in self.buffers.values())])
        for buffer in self.buffers.values():
            buffer.clock = self._clock  # the log's time: a quiet partition's groups time out too
            self._expire(buffer, version)
        for offline in offline_sources:
            offline.fill(sum(len(group.trajectories) for group in accepted), version)
            self.changelog.put(offline.key, offline.state())  # its position, journaled below
        self._emit(accepted, version)
        self._count_redeliveries(version)
        self._journal()

    def _add(self, message: Message) -> Group | None:
        buffer = self._buffer(message.partition)
        duplicates = buffer.duplicates
        group = self._join(self._admit(message), buffer, message)
        self._redelivered += buffer.duplicates - duplicates
        return group

    def _count_redeliveries(self, version: int) -> None:
        """Trajectories the buffers dropped as redelivered duplicates count as drops too."""
        if self._redelivered > self.drops["redelivered"]:
            self._count_drop("redelivered", version, self._redelivered - self.drops["redelivered"])

    def _journal(self) -> None:
        """Step 5: send what changed since the last commit to the changelog, in the open transaction."""
        closed = []
        for partition, buffer in self.buffers.items():
            self.changelog.put(pending_key(partition), snapshot(buffer))
            closed += [(partition, gid, expired) for gid, expired in buffer.closed or []]
            buffer.closed = []
        if closed:
            self.changelog.put_closed(closed)
        for index, operator in self._stateful():
            self.changelog.put(operator_key(index, operator.name), operator.state_dict())
        self.changelog.put(CLOCK, str(self._clock).encode())
        self.changelog.send(self.transactions)

    def _buffer(self, partition: int) -> GroupBuffer:
        """The partition's buffer; made from the changelog the first time the partition is assigned."""
        buffer = self.buffers.get(partition)
        if buffer is None:
            buffer = self.buffers[partition] = GroupBuffer(keep_closed=True)
            state = self.changelog.table.get(pending_key(partition))
            if state is not None:
                records = read_records(self.ctx.log, self.source, partition, snapshot_offsets(state))
                self._restored += restore(state, buffer, partition, records, self.ctx.codec)
            for gid, expired in self.changelog.closed(partition):
                buffer.mark_closed(gid, expired)
            buffer.clock = max(buffer.clock, self._clock)
        return buffer

    def _sync(self, consumer: Consumer) -> None:
        """Buffers for exactly the assigned partitions. A lost partition's state stays in the
        changelog as last committed, for whoever is assigned it next."""
        assigned = [tp.partition for tp in consumer.assignment() if tp.topic == self.source]
        for partition in set(self.buffers) - set(assigned):
            del self.buffers[partition]
        for partition in assigned:
            self._buffer(partition)

    def _stateful(self) -> list[tuple[int, StatefulOperator]]:
        """The pipeline's stateful operators, with their index among all its operators."""
        pipeline = self.pipeline
        operators = [*pipeline.operators, *pipeline.mixers, *([pipeline.ordering] if pipeline.ordering else [])]
        return [(index, operator) for index, operator in enumerate(operators) if isinstance(operator, StatefulOperator)]

    def _restore(self) -> None:
        """The state of the last commit: the operators' and the log time; buffers come with their partitions."""
        self.buffers = {}
        self._restored = []
        self._clock = int(self.changelog.table.get(CLOCK, b"0"))
        for index, operator in self._stateful():
            state = self.changelog.table.get(operator_key(index, operator.name))
            if state is not None:
                operator.load_state_dict(state, self._lookup)

    def _rewind(self, consumer: Consumer) -> None:
        """Back to the last commit after an aborted transaction: state and consumer positions."""
        self.rewinds += 1
        self.ctx.metric(STREAM_REWINDS, self.rewinds, max(self.follower.latest_version, 0), policy=self.policy)
        self.changelog.discard()
        self.pipeline = build_pipeline(self.ctx.config.stream)
        self._restore()
        assigned = [tp for tp in consumer.assignment() if tp.topic == self.source]
        for tp, offset in consumer.committed(assigned).items():
            if offset is None:
                consumer.seek_to_beginning([tp])
            else:
                consumer.seek(tp, offset)

    def _lookup(self, positions: list[tuple[int, int]]) -> list[Trajectory | None]:
        """The trajectories at these positions of the input topic (``operators.TrajectoryLookup``)."""
        return read_trajectories(self.ctx.log, self.source, self.ctx.codec, positions)
