"""The native stream runtime: trajectories → group operators → train samples, exactly once, on any log.

One loop per processor instance, in the policy's consumer group ``{run}.stream.{policy}``: a
policy may run several instances (``stream.instances``), which share the trajectories partitions
the group assigns them. What happens to a record on its way (steps 2-4) is shared with the faust
runtime (``streams.processing``). Each poll is one transaction of the processor's transactional
producer (``Log.transactional_producer``): the poll's outputs, the changes to the processor's
state and the input offsets become visible together, or not at all. Steps of one iteration:

1. Poll up to ``POLL_RECORDS`` trajectory records. Everything the processor remembers is kept
   per input partition (a ``PartitionState``), in that partition's part of the changelog
   (``streams.changelog``): a partition newly assigned gets back its half-filled groups, re-read
   from the records they point at (``streams.pending``), the ids of its recently closed groups,
   its own pipeline with the state of its stateful operators (reward statistics, replay buffer,
   ordering), and its offline sources' positions. Begin a transaction, and send the positions
   after the poll as the group's offsets in it. The offsets are the positions, not the first
   record of a half-filled group: its members are in the changelog, so no record is read twice,
   and a group split across a commit completes after a restart. They go first so that their
   round trips to the group coordinator come before the outputs are written, not between the
   outputs and the commit.
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
producer (id ``{run}.stream.{policy}``, and ``{run}.stream.{policy}.{k}`` for instance ``k`` > 0)
fences its predecessor and ends the transaction it left open; the processor loads the state of
the last commit and reads on from its offsets. So every input record's outputs are written
exactly once, and a restarted processor emits what an uninterrupted one would have (TrainSample
``created_ms`` aside). A commit the log aborts (``TransactionAbortedError``: the consumer lost
partitions to a rebalance, or the embedded log stayed locked) takes the processor back to its
last commit - state from the changelog, consumer at the committed offsets - and it goes on. A
fenced producer (a newer processor of the policy), a record the log refuses, or any other
failure ends the processor, for the launcher to restart it.

Several instances. The group gives each input partition to one instance; one that stops
(stopped, killed, or silent past the session timeout) has its partitions given to the others,
which restore their state from the changelog as last committed and read on from the committed
offsets. A commit carries the instance's consumer group generation, so an instance that lost a
partition without noticing cannot commit outputs for it: the log aborts that transaction and the
instance rewinds. On Kafka the taking instance reads a dead instance's partition once the
transaction it left open has ended, which the broker does after the producer's transaction
timeout (``STREAM_TRANSACTION_TIMEOUT_S``); the embedded log never leaves one open. State is per
partition also with one instance: each input partition has its own reward statistics, replay
buffer and offline share, so a run's results do not depend on how many instances run it.

Outside the transactions: metrics (the component's own producer); the ``duplicate`` filter's id
memory. Each offline source's position is journaled in its partition's changelog
(``offline␟{index}``) and its mixer's fed groups are mixer state, so offline groups are mixed in
exactly once too.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import ConfigError, TransactionAbortedError
from astraflow.core.metric_names import STREAM_REWINDS
from astraflow.log import Consumer, Message, TopicPartition
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import Trajectory
from astraflow.streams.operators.base import Group, GroupBuffer, StatefulOperator
from astraflow.streams.operators.pipeline import Pipeline, build_pipeline
from astraflow.streams.runtimes.changelog import CLOCK, Changelog, operator_key, pending_key
from astraflow.streams.runtimes.offline import OfflineSource, state_key
from astraflow.streams.runtimes.pending import read_records, read_trajectories, restore, snapshot, snapshot_offsets
from astraflow.streams.runtimes.processing import GroupProcessor
from astraflow.weights.follow import follow_weights

logger = logging.getLogger(__name__)

POLL_RECORDS = 512
"""The most trajectory records one poll, and so one transaction, handles."""
STREAM_TRANSACTION_TIMEOUT_S = 20.0
"""How long a processor's transaction may stay open before Kafka aborts it: a poll's transaction takes
well under a second, and an instance that died with one open holds its partitions' outputs (and the
instance that takes them over) up to this long. Kafka Streams uses 10 s; twice that for slow machines."""


def transactional_id(run: str, policy: str, instance: int = 0) -> str:
    """The transactional id of a policy's stream processor instance (the same across its restarts)."""
    return f"{run}.stream.{policy}" + (f".{instance}" if instance else "")


@dataclass
class PartitionState:
    """What a processor keeps for one assigned input partition, all of it journaled in that
    partition's changelog: its half-filled and recently closed groups, its own pipeline (the
    stateful operators' state), its offline sources, and the groups restored from the changelog
    that the next poll handles first."""

    partition: int
    changelog: Changelog
    pipeline: Pipeline
    buffer: GroupBuffer = field(default_factory=lambda: GroupBuffer(keep_closed=True))
    offline: list[OfflineSource] = field(default_factory=list)
    restored: list[Group] = field(default_factory=list)

    def stateful(self) -> list[tuple[int, StatefulOperator]]:
        """The pipeline's stateful operators, with their index among all its operators."""
        return self.pipeline.stateful()

    def close(self) -> None:
        for offline in self.offline:
            offline.close()


class NativeStreamProcessor(GroupProcessor):
    """Runs the configured pipeline for one policy on the run's log, one transaction per poll."""

    def __init__(self, ctx: ComponentContext, policy: str, instance: int = 0) -> None:
        transactions = ctx.log.transactional_producer(
            transactional_id(ctx.config.run, policy, instance), STREAM_TRANSACTION_TIMEOUT_S
        )
        super().__init__(ctx, policy, transactions)  # the producer above fenced this instance's predecessor
        self.transactions = transactions
        self.instance = instance
        self.source = ctx.topics.trajectories(policy)
        self.changelog_topic = ctx.topics.stream_changelog(policy)
        self.input_partitions = ctx.log.describe_topic(self.source).partitions
        changelog_partitions = ctx.log.describe_topic(self.changelog_topic).partitions
        if changelog_partitions != self.input_partitions:
            raise ConfigError(
                f"stream changelog {self.changelog_topic!r} has {changelog_partitions} partition(s), but "
                f"{self.source!r} has {self.input_partitions}: the processor keeps each input partition's state "
                "in the changelog partition of the same number (a run directory made by an older version; "
                "start a new run)"
            )
        self.states: dict[int, PartitionState] = {}
        """Per assigned input partition, everything the processor remembers of it."""
        self.rewinds = 0
        self._redelivered = 0
        self._clock = 0
        """The log's time: the newest record timestamp of any partition this instance holds or held."""

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        consumer = ctx.log.consumer(group_id=f"{ctx.config.run}.stream.{self.policy}")
        try:
            consumer.subscribe([self.source])
            self.follower = follow_weights(ctx, self.policy, payload=False)
            while not stop.is_set():
                try:
                    self._serve(consumer, stop)
                except TransactionAbortedError as exc:
                    logger.warning("the log aborted a transaction, back to the last commit: %s", exc)
                    self._rewind(consumer)
        finally:
            self._drop_states()
            self.close_followers()
            consumer.close()
            self.transactions.close()  # aborts a transaction left open by a failure

    def _serve(self, consumer: Consumer, stop: threading.Event) -> None:
        while not stop.is_set():
            version = max(self.follower.latest_version, 0)  # raises at once if the follower died
            messages = consumer.poll(max_records=POLL_RECORDS, timeout=0.5)
            self._sync(consumer)
            if not messages and not any(state.restored for state in self.states.values()):
                crash_point("stream.flush_metrics", version)
                self.ctx.producer.flush()  # the metrics of the last poll, while the log is idle
                continue
            self.transactions.begin()
            polled = {TopicPartition(self.source, message.partition) for message in messages}
            crash_point("stream.send_offsets", version)
            self.transactions.send_offsets(consumer, {tp: consumer.position(tp) for tp in polled})
            self._handle(messages, version)
            crash_point("stream.commit", version)  # the poll's samples, feedback, changelog and offsets
            self.transactions.commit()
            for state in self.states.values():
                state.changelog.committed()

    def _handle(self, messages: list[Message], version: int) -> None:
        """Steps 2 to 5 of the module docstring for one poll, into the open transaction."""
        self.refill_version_wait()  # the poll's records wait VERSION_WAIT_S in all for unseen versions
        arrived: dict[int, list[Message]] = defaultdict(list)
        for message in messages:
            arrived[message.partition].append(message)
        for partition in arrived:
            self._state(partition)  # a partition polled just as the group took it away: read, then aborted
        accepted: dict[int, list[Group]] = {}
        for partition, state in sorted(self.states.items()):
            self.pipeline = state.pipeline  # the pipeline ``GroupProcessor`` runs groups through
            restored, state.restored = state.restored, []
            accepted[partition] = [group for group in restored if self._process(group, version)]
            for message in arrived.get(partition, []):
                group = self._add(message)
                if group is not None and self._process(group, version):
                    accepted[partition].append(group)
        self._clock = max([self._clock, *(state.buffer.clock for state in self.states.values())])
        for partition, state in sorted(self.states.items()):
            self.pipeline = state.pipeline
            state.buffer.clock = self._clock  # the log's time: a quiet partition's groups time out too
            self._expire(state.buffer, version)
            fresh = sum(len(group.trajectories) for group in accepted[partition])
            for offline in state.offline:
                offline.fill(fresh, version)
                state.changelog.put(offline.key, offline.state())  # its position, journaled below
            self._emit(accepted[partition], version)
            self._journal(state)
        self._count_redeliveries(version)

    def _add(self, message: Message) -> Group | None:
        """Admit ``message`` into its partition's buffer; its group once that completes it."""
        buffer = self._state(message.partition).buffer
        duplicates = buffer.duplicates
        group = self._join(self._admit(message), buffer, message)
        self._redelivered += buffer.duplicates - duplicates
        return group

    def _count_redeliveries(self, version: int) -> None:
        """Trajectories the buffers dropped as redelivered duplicates count as drops too."""
        if self._redelivered > self.drops["redelivered"]:
            self._count_drop("redelivered", version, self._redelivered - self.drops["redelivered"])

    def _journal(self, state: PartitionState) -> None:
        """Step 5: send what changed in ``state`` since the last commit to its changelog, in the open transaction."""
        changelog, buffer = state.changelog, state.buffer
        changelog.put(pending_key(state.partition), snapshot(buffer))
        if buffer.closed:
            changelog.put_closed([(state.partition, gid, expired) for gid, expired in buffer.closed])
        buffer.closed = []
        for index, operator in state.stateful():
            changelog.put(operator_key(index, operator.name), operator.state_dict())
        changelog.put(CLOCK, str(self._clock).encode())
        changelog.send(self.transactions)

    def _state(self, partition: int) -> PartitionState:
        """The partition's state; restored from its changelog the first time the partition is assigned."""
        state = self.states.get(partition)
        if state is None:
            state = self.states[partition] = self._restore(partition)
        return state

    def _restore(self, partition: int) -> PartitionState:
        """The state of ``partition`` as of the last commit that journaled it (whichever instance made it)."""
        ctx = self.ctx
        changelog = Changelog.load(ctx.log, self.changelog_topic, partition)
        table = changelog.table
        state = PartitionState(partition, changelog, build_pipeline(ctx.config.stream))
        self._clock = max(self._clock, int(table.get(CLOCK, b"0")))
        for index, operator in state.stateful():
            saved = table.get(operator_key(index, operator.name))
            if saved is not None:
                operator.load_state_dict(saved, self._lookup)
        pending = table.get(pending_key(partition))
        if pending is not None:
            records = read_records(ctx.log, self.source, partition, snapshot_offsets(pending))
            state.restored = restore(pending, state.buffer, partition, records, ctx.codec)
        for gid, expired in changelog.closed(partition):
            state.buffer.mark_closed(gid, expired)
        state.buffer.clock = max(state.buffer.clock, self._clock)
        state.offline = [
            OfflineSource(
                ctx,
                self.policy,
                mixer,
                state.pipeline.operators,
                index,
                self.limits,
                table.get(state_key(index)),
                self._dead_letter,
                share=(partition, self.input_partitions),
            )
            for index, mixer in enumerate(state.pipeline.offline)
        ]
        logger.info("instance %d took input partition %d of %s", self.instance, partition, self.source)
        return state

    def _sync(self, consumer: Consumer) -> None:
        """States for exactly the assigned partitions. A lost partition's state stays in the
        changelog as last committed, for whichever instance is assigned it next."""
        assigned = [tp.partition for tp in consumer.assignment() if tp.topic == self.source]
        for partition in set(self.states) - set(assigned):
            self.states.pop(partition).close()
            logger.info("instance %d gave up input partition %d of %s", self.instance, partition, self.source)
        for partition in assigned:
            self._state(partition)

    def _drop_states(self) -> None:
        """Forget every partition's state (each is restored from its changelog when next needed)."""
        for partition, state in sorted(self.states.items()):
            state.close()
            logger.info("instance %d dropped its state of input partition %d", self.instance, partition)
        self.states = {}

    def _rewind(self, consumer: Consumer) -> None:
        """Back to the last commit after an aborted transaction: state and consumer positions."""
        self.rewinds += 1
        self.ctx.metric(STREAM_REWINDS, self.rewinds, max(self.follower.latest_version, 0), policy=self.policy)
        self._clock = 0  # what the aborted poll saw is read again; the restored states bring the committed time
        self._drop_states()  # restored again from the changelogs as the partitions come back in ``_sync``
        assigned = [tp for tp in consumer.assignment() if tp.topic == self.source]
        for tp, offset in consumer.committed(assigned).items():
            if offset is None:
                consumer.seek_to_beginning([tp])
            else:
                consumer.seek(tp, offset)

    def _lookup(self, positions: list[tuple[int, int]]) -> list[Trajectory | None]:
        """The trajectories at these positions of the input topic (``operators.TrajectoryLookup``)."""
        return read_trajectories(self.ctx.log, self.source, self.ctx.codec, positions)
