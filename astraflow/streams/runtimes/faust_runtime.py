"""The faust stream runtime: the configured pipeline as a faust agent on Kafka, exactly once.

One faust app per policy, with one agent on ``{run}.trajectories.{policy}``. Its app id, and so its consumer
group, is the native runtime's, ``{run}.stream.{policy}``: tools that read the stream processor's committed
offsets (``audit``, ``replay``) find them whichever runtime ran, and a run switched from one runtime to the other
resumes where the first committed. Each keeps its half-filled groups in its own changelog, which the other does
not read, so a group half full at a switch ends incomplete (its later members time out). The two cannot run in
one group at the same time (Kafka refuses a member whose assignment protocol differs). Records are read and
written as raw bytes, decoded and encoded by the project's Avro codec (``streams.processing``, shared with the
native runtime). Half-filled groups, and the state of the stateful operators of each input partition's own
pipeline (reward statistics, a replay buffer...), live in the faust table ``pending`` (``faust_table``), whose
changelog topic ``{app id}-pending-changelog`` lets a restarted or rebalanced worker resume them. A (re)started
worker waits about 10 s at the end of restoring it: how faust recognises the end of a transactional changelog.

Why transactions. A restarted worker must neither lose a group nor emit one twice. Faust's own
commit runs on a timer, concurrently with the agent, and faust's ``exactly_once`` mode only puts
changelog writes in the transaction, not records sent to other topics. So this runtime writes
every record of one input record - changelog entries, dead letters, PromptStats, TrainSamples -
through the transactional producer that faust keeps for the input's partition, and commits only
between two records. Steps, per input record:

1. Take the processing lock (faust's commits wait for it; see ``QuiescentConsumer``).
2. Decode, validate, group, run the operators and collect the output records (``_handle``, no
   I/O): dead letters, PromptStats and samples; the change to the group's table entries is
   applied and kept for the commit.
3. Send the records with the transactional id of the input partition, then ack the record.
4. Release the lock. Faust's next commit (every ``COMMIT_INTERVAL_S``) first writes the table's
   net changes since the last commit (``PendingTable.flush``: a group completed in between is
   never written; an operator's state when it changed), then adds the acked offsets to each
   partition's transaction and commits it: outputs, state and input offsets become visible
   together, or - after a crash - not at all, and the records are processed again.

Readers see the outputs once the transaction commits, if they read committed records: the Kafka
log's consumers do (librdkafka's default ``isolation.level``). Metrics go through the component's
own producer, outside the transactions. A record whose checks, operators or samples raise is
dead-lettered like any bad record (``streams.processing``). Any other failure while handling a
record (the log, the weight follower) keeps the lock, so nothing of it is committed, and ends the
worker with the error; the restarted worker reads the record again. Not supported here:
``offline`` mixers (they read another topic; use the native runtime). Each record's groups are
emitted as they complete, so an ordering operator sees the groups of one record at a time.

Two guards against faust-streaming itself. Around an assignment faust can leave records out of the agent's
stream; the agent knows the next offset of each partition it must handle (the group's committed offset when
assigned) and reads any records it skipped from the log, handling them in order before the record that revealed
the gap (``_recover_skipped``). Left out, they were lost, and faust never committed the partition again: the
broker aborted the open transaction after 60 s and the worker hung, fenced. And a worker whose acked records
stay uncommitted for ``STALL_LIMIT_S`` fails, so the launcher restarts it (``_watch_commits``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import faust
from faust.types import TP

from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import ConfigError, WeightFollowerError
from astraflow.core.metric_names import STREAM_FAUST_SKIPPED_RECORDS
from astraflow.log import Consumer, Message, TopicPartition
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import Trajectory
from astraflow.streams.operators.base import GroupBuffer
from astraflow.streams.operators.pipeline import Pipeline, build_pipeline
from astraflow.streams.runtimes.faust_consumer import (
    CommitStalled,
    Outbox,
    QuiescentTransport,
    broker_credentials,
    replication_factor,
)
from astraflow.streams.runtimes.faust_table import PendingTable
from astraflow.streams.runtimes.pending import read_records, read_trajectories, start_offset
from astraflow.streams.runtimes.processing import VERSION_WAIT_WINDOW_S, GroupProcessor
from astraflow.weights.follow import WeightFollower, follow_weights

logger = logging.getLogger(__name__)

COMMIT_INTERVAL_S = 0.5
"""How often faust's timer commits the transactions. The agent also commits as soon as it sent outputs and
no input waits, ``COMMIT_SETTLE_S`` after its channel emptied (a batch of trajectories handled): in a
latency-bound loop that is the commit that counts."""
COMMIT_SETTLE_S = 0.005
"""How long the agent waits for more input once its channel is empty before it commits its outputs: faust's
fetcher hands a producer's batch over in pieces, and without the wait the agent committed between them
(6.6 transactions a version on the math example, 2.1 with it), each a few round trips to the broker."""
SESSION_TIMEOUT_S = 10.0
"""A worker that stops heart-beating (killed) gives its partitions up after this long."""
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Largest record the worker's producer sends (a dead letter carries a whole trajectory)."""
BATCH_BYTES = 1024 * 1024
"""Records per produce request, in bytes (librdkafka's default; aiokafka's 16 KiB holds no trajectory)."""
STALL_LIMIT_S = 30.0
"""A worker whose acked records stay uncommitted this long fails (and is restarted): half the
transaction timeout (aiokafka's 60 s), after which the broker would abort the open transaction."""
LINGER_S = 0.1
"""How long the producer waits to fill a batch. Records are read only once their transaction
commits, which sends whatever waits, so fuller batches (fewer requests for the broker) cost no
latency; it stays below ``COMMIT_INTERVAL_S`` so batches go out while the transaction runs."""


class FaustStreamProcessor(GroupProcessor):
    """Runs the configured pipeline for one policy as a faust worker on Kafka."""

    out: Outbox
    table: PendingTable  # on the app's faust table, made with the app (``_build_app``)

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        if ctx.config.log.backend != "kafka":
            raise ConfigError(
                "stream.runtime: 'faust' runs on Kafka only (log.backend: kafka); use 'native' on the embedded log"
            )
        super().__init__(ctx, policy, Outbox())
        if self.pipeline.offline:
            raise ConfigError("stream.pipeline: op 'offline' needs the native runtime (stream.runtime: native)")
        self.source = ctx.topics.trajectories(policy)
        self.app_id = f"{ctx.config.run}.stream.{policy}"
        self.buffers: dict[int, GroupBuffer] = {}
        self.pipelines: dict[int, Pipeline] = {}
        """Each assigned input partition's own pipeline, whose stateful operators' state the table keeps."""
        self.next_offsets: dict[int, int] = {}
        """The next offset of each assigned input partition that the agent has to process."""
        self.recovered = 0
        """Records faust left out, handled from the log instead (``_recover_skipped``)."""
        self.gaps: Consumer | None = None
        """The reader of the gaps in the offsets faust delivers, kept open (``_recover_skipped``)."""
        self.failure: BaseException | None = None
        self.emitted = False
        """Outputs sent since the agent last committed them itself (when no input was waiting)."""

    def run(self, stop: threading.Event) -> None:
        if logging.getLogger().level > logging.DEBUG:  # faust logs every service start and stop at INFO
            for name in ("faust", "mode", "aiokafka"):
                logging.getLogger(name).setLevel(logging.WARNING)
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        follower = self.follower = follow_weights(self.ctx, self.policy, payload=False)
        try:
            loop.run_until_complete(self._serve(stop, follower))
        finally:
            self.close_followers()
            if self.gaps is not None:
                self.gaps.close()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self, stop: threading.Event, follower: WeightFollower) -> None:
        """Start the worker, wait for a stop signal or a failure, stop it (committing what is acked)."""
        app = self._build_app(follower, stop)
        await app.start()
        watchdog = asyncio.create_task(self._watch_commits(app, stop))
        await app.wait(asyncio.get_running_loop().run_in_executor(None, stop.wait))
        stop.set()  # frees the waiting thread when the worker ended first
        watchdog.cancel()
        if self.failure is not None:  # no app.stop(): it would commit. Drop the worker's tasks, as a crash would
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in others:
                task.cancel()
            if others:  # some of faust's tasks may not end when cancelled: give them a moment, no more
                await asyncio.wait(others, timeout=5)
            app.consumer.abandon()
            raise self.failure
        if app.crash_reason is not None:
            raise app.crash_reason
        await app.stop()

    async def _watch_commits(self, app: faust.App, stop: threading.Event) -> None:
        """Fail the worker when the first uncommitted acked offset of a partition stays the same for
        ``STALL_LIMIT_S``: its records are processed but will never be committed (a record before
        them was never acked), and the broker would soon abort the transaction holding their outputs.
        The restarted worker processes them again from the last commit."""
        since: dict[TP, tuple[int, float]] = {}  # partition -> (its first uncommitted offset, when first seen)
        while not stop.is_set():
            await asyncio.sleep(1.0)
            now = time.monotonic()
            seen = since
            since = {}
            for tp, offset in app.consumer.uncommitted().items():
                same = tp in seen and seen[tp][0] == offset
                since[tp] = seen[tp] if same else (offset, now)
            for tp, (offset, first_seen) in since.items():
                if now - first_seen > STALL_LIMIT_S:
                    self.failure = CommitStalled(
                        f"faust has committed nothing of partition {tp.partition} of {tp.topic} "
                        f"for {STALL_LIMIT_S:.0f} s: "
                        f"offset {offset} is acked, {self.next_offsets.get(tp.partition)} is the next to process"
                    )
                    logger.error("%s; stopping the worker", self.failure)
                    stop.set()
                    return

    def _build_app(self, follower: WeightFollower, stop: threading.Event) -> faust.App:
        ctx = self.ctx
        partitions = ctx.log.describe_topic(self.source).partitions
        datadir = ctx.run_dir / "faust" / self.policy
        datadir.mkdir(parents=True, exist_ok=True)
        app = faust.App(
            self.app_id,
            broker=[f"kafka://{host}" for host in (ctx.config.log.bootstrap or "").split(",")],
            processing_guarantee="exactly_once",
            store="memory://",
            web_enabled=False,
            autodiscover=False,
            datadir=str(datadir),
            topic_partitions=partitions,
            topic_replication_factor=replication_factor(
                ctx.config.log.bootstrap or "", self.source, ctx.config.log.client_config(ctx.component)
            ),
            broker_credentials=broker_credentials(ctx.config.log.security, ctx.component),
            consumer_auto_offset_reset="earliest",
            broker_commit_interval=COMMIT_INTERVAL_S,
            broker_session_timeout=SESSION_TIMEOUT_S,
            broker_heartbeat_interval=SESSION_TIMEOUT_S / 5,
            producer_max_request_size=MAX_RECORD_BYTES,
            producer_max_batch_size=BATCH_BYTES,
            producer_linger=LINGER_S,
            consumer_max_fetch_size=MAX_RECORD_BYTES,
        )
        app.in_worker = True  # what faust's Worker sets: transactions are only used inside a worker
        app.transport = QuiescentTransport(app.conf.broker_consumer, app)
        table = app.Table("pending", partitions=partitions, key_type=bytes, value_type=bytes)
        changelog = table.changelog_topic.get_topic_name()
        self.table = PendingTable(
            table.data, lambda key, value, partition: self.out.put(changelog, key, value, partition)
        )
        topic = app.topic(self.source, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

        async def flush_table() -> None:
            """Write the table's changes since the last commit, each in its partition's transaction:
            half-filled groups, and the state of each partition's stateful operators."""
            for partition, pipeline in self.pipelines.items():
                for index, operator in pipeline.stateful():
                    self.table.put_state(partition, index, operator.name, operator.state_dict())
            crash_point("faust.flush_table")
            self.table.flush()
            await self._send_outbox(app)

        async def process(stream: faust.StreamT) -> None:
            lock = app.consumer.processing
            app.consumer.before_commit = flush_table
            async for event in self._events(stream):
                await lock.acquire()
                try:
                    await self._on_event(app, event, max(follower.latest_version, 0))
                except Exception as exc:  # the lock stays taken: nothing of this record is committed
                    cause = "the weight follower failed" if isinstance(exc, WeightFollowerError) else "handling failed"
                    logger.exception(
                        "%s at record %s@%s; stopping the worker", cause, event.message.partition, event.message.offset
                    )
                    self.failure = exc
                    stop.set()
                    return
                await stream.ack(event)
                lock.release()
                if self.emitted and stream.channel.empty():
                    await asyncio.sleep(COMMIT_SETTLE_S)
                if self.emitted and stream.channel.empty():
                    # outputs wait for nothing more that has arrived: commit them now, not at the next timer
                    self.emitted = False
                    crash_point("faust.commit_settled")
                    await app.consumer.commit()
                await asyncio.sleep(0)  # sends rarely suspend: let faust's commit timer and fetcher run

        app.agent(topic, name=f"{self.app_id}.process")(process)

        async def on_revoked(sender: faust.App, revoked: set, **kwargs: Any) -> None:
            """Revoked partitions may change hands: rebuild their buffers from the table if they come back."""
            for tp in revoked:
                if tp.topic == self.source:
                    self.buffers.pop(tp.partition, None)
                    self.pipelines.pop(tp.partition, None)
                    self.next_offsets.pop(tp.partition, None)
                    self.table.forget(tp.partition)

        app.on_partitions_revoked.connect(on_revoked)
        return app

    def _events(self, stream: faust.StreamT) -> AsyncIterator[faust.EventT]:
        """The input records as faust delivers them (acked by the agent once handled)."""
        return stream.noack().events()

    async def _on_event(self, app: faust.App, event: faust.EventT, version: int) -> None:
        partition = event.message.partition
        message = Message(
            self.source, partition, event.message.offset, event.key, event.value, int(event.message.timestamp * 1000)
        )
        loop = asyncio.get_running_loop()
        buffer = self.buffers.get(partition)
        if buffer is None:  # the partition's first record since it was assigned: its groups are in the table
            offsets = self.table.offsets(partition)
            records = await loop.run_in_executor(None, read_records, self.ctx.log, self.source, partition, offsets)
            buffer = self.buffers[partition] = self.table.restore(partition, records, self.ctx.codec)
            self.pipelines[partition] = await loop.run_in_executor(None, self._restore_pipeline, partition)
            self.next_offsets[partition] = await loop.run_in_executor(
                None, start_offset, self.ctx.log, self.app_id, self.source, partition
            )
        expected = self.next_offsets[partition]
        if (
            message.offset < expected
        ):  # delivered again (faust re-read after a seek): handled in this assignment already
            return
        if message.offset > expected:
            await self._recover_skipped(app, event.message.tp, expected, message.offset, version, buffer)
        self._handle(message, version, buffer)
        self.next_offsets[partition] = message.offset + 1
        await self._send_outbox(app, partition)

    async def _send_outbox(self, app: faust.App, source_partition: int | None = None) -> None:
        """Send the outbox in the transaction of the input partition the records come from:
        ``source_partition``, or for a changelog write the partition it is written to (the same)."""
        records = self.out.drain()
        if not records:  # a commit before any record, or with no table change: the assignor may not know the topic yet
            return
        self.emitted = self.emitted or source_partition is not None
        group = app.assignor.group_for_topic(self.source)
        for topic, key, value, target in records:
            partition = target if source_partition is None else source_partition
            await app.producer.send(
                topic, key, value, target, None, None, transactional_id=f"{app.conf.id}-{group}-{partition}"
            )

    async def _recover_skipped(
        self, app: faust.App, tp: TP, start: int, end: int, version: int, buffer: GroupBuffer
    ) -> None:
        """Handle the records ``start`` to ``end`` (exclusive) that faust did not deliver, read from the log.

        faust-streaming (0.15) can leave records out around a partition's assignment. Its stream
        drops records fetched while its flow control is paused or under an older consumer
        generation, and its fetcher drops records below a read offset that a seek moved; which
        of these left out the 26 records of the failed CI run is not known. Left out, records are
        lost (their groups never complete), and they hold back every later commit of the
        partition until the broker aborts its transaction. So they are read here, handled in
        offset order like any record, and counted as acked.
        """
        missed = await asyncio.get_running_loop().run_in_executor(None, self._read_gap, tp.partition, start, end)
        if missed:  # none: the gap held only transaction markers (producers write in transactions)
            logger.warning(
                "faust left out records %d..%d of partition %d (%d still in the log); handling them from the log",
                start,
                end - 1,
                tp.partition,
                len(missed),
            )
            self.recovered += len(missed)
            self.ctx.metric(STREAM_FAUST_SKIPPED_RECORDS, self.recovered, version, policy=self.policy)
        for message in missed:
            self._handle(message, version, buffer)
        app.consumer.ack_offsets(tp, range(start, end))

    def _restore_pipeline(self, partition: int) -> Pipeline:
        """A pipeline for ``partition`` whose stateful operators hold the state the table kept for it."""
        pipeline = build_pipeline(self.ctx.config.stream)
        for index, operator in pipeline.stateful():
            saved = self.table.operator_state(partition, index, operator.name)
            if saved is not None:
                operator.load_state_dict(saved, self._lookup)
        return pipeline

    def _lookup(self, positions: list[tuple[int, int]]) -> list[Trajectory | None]:
        """The trajectories at these positions of the input topic (``operators.TrajectoryLookup``)."""
        return read_trajectories(self.ctx.log, self.source, self.ctx.codec, positions)

    def _read_gap(self, partition: int, start: int, end: int) -> list[Message]:
        """The records of a gap, through one reader kept open: the common gap is one transaction's commit
        marker (an offset no record stands for) after every producer transaction, a few a version, and a
        consumer made and closed for each cost ~30 ms of the agent's time each on the local broker."""
        if self.gaps is None:
            self.gaps = self.ctx.log.range_reader()
        return list(self.gaps.read_range(TopicPartition(self.source, partition), start, end))

    def _handle(self, message: Message, version: int, buffer: GroupBuffer) -> None:
        """Steps 1-4 of ``streams.processing`` for one record, into the outbox, with its table writes."""
        partition = message.partition
        self.pipeline = self.pipelines[partition]  # the pipeline ``GroupProcessor`` runs groups through
        if time.monotonic() - self._wait_refilled >= VERSION_WAIT_WINDOW_S:
            self.refill_version_wait()
        arrival = self._admit(message)
        before = self.table.entries(buffer, partition, arrival.group_id)
        duplicates = buffer.duplicates
        group = self._join(arrival, buffer, message)
        self.table.journal(
            before,
            self.table.entries(buffer, partition, arrival.group_id),
            partition,
            message.offset,
            arrival.group_size,
        )
        if buffer.duplicates > duplicates:
            self._count_drop("redelivered", version)
        accepted = [group] if group is not None and self._process(group, version) else []
        overdue = {gid: self.table.entries(buffer, partition, gid) for gid in buffer.overdue(self.timeout_ms)}
        self._expire(buffer, version)
        for entries in overdue.values():  # given up: their table entries go, in this record's transaction
            self.table.journal(entries, set(), partition, message.offset, 0)
        self._emit(accepted, version)
