"""The source of offline replay: another run's logged trajectories, copied into this run's topic.

``astraflow replay`` (``infra/replay.py``) trains a new run from the trajectories an earlier, or
still running, run logged. This module only moves the records; the new run's stream processor,
trainer and evaluator then treat them like trajectories a rollout producer wrote.

What it guarantees, in the order the steps happen:

1. Nothing is written to the source: it is read by ``assign`` + ``seek`` with no consumer group,
   so the source run's groups (``{run}.stream.{policy}``, ``{run}.train.{policy}`` ...) keep their
   members and committed offsets, whether the run is finished or live.
2. What is copied is fixed before anything is read (``plan_span``): per partition, from the
   oldest retained record, ``from_offset`` or the first record at ``since_ms``, up to the end
   offset when the replay began or the first record at ``until_ms``. Records a live source
   appends later are not part of the replay.
3. Values are copied byte for byte (single-object Avro names its writer schema by fingerprint). A
   writer schema the target log does not know yet is first copied from the source's schema topic,
   so every reader of the new run resolves it. Keys are kept, so the members of a group share a
   partition again; each copy carries the header ``astraflow.replay.origin`` =
   ``topic/partition/offset`` of its original.
4. Each polled batch is flushed before the next poll. A copy cut short is not resumed: the
   launcher refuses a target topic that already holds records, so a replay starts from scratch.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from astraflow.core.errors import AstraFlowError, ConfigError, LogError, SchemaError
from astraflow.log import Log, TopicPartition
from astraflow.runtime.attach import offsets_at, read_snapshot
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.schemas.codec import HEADER_SIZE, MAGIC
from astraflow.schemas.store import SCHEMA_TOPIC, SchemaStore, writer_schema

logger = logging.getLogger(__name__)

ORIGIN_HEADER = "astraflow.replay.origin"
STALL_S = 30.0
"""The copy fails when the source returns nothing for this long while records of the span remain
(e.g. retention deleted them after the span was planned)."""


@dataclass(frozen=True)
class ReplaySpan:
    """The records of one source topic to copy: per partition, offsets ``[start, end)``."""

    topic: str
    start: dict[int, int]
    end: dict[int, int]

    @property
    def total(self) -> int:
        return sum(self.end[p] - self.start[p] for p in self.start)


def plan_span(
    log: Log, topic: str, from_offset: int | None = None, since_ms: int | None = None, until_ms: int | None = None
) -> ReplaySpan:
    """The span of ``topic`` to copy, found by seeking (nothing is read).

    ``from_offset`` applies to every partition (offsets are per partition) and is raised to the
    oldest retained record; ``since_ms`` starts at the first record appended at or after it;
    ``until_ms`` ends before the first record appended at or after it.
    """
    if from_offset is not None and since_ms is not None:
        raise ConfigError("--from-offset and --since: give at most one start")
    ends = log.end_offsets(topic)
    oldest = offsets_at(log, topic)
    if since_ms is not None:
        start = offsets_at(log, topic, since_ms)
    else:
        start = {p: max(oldest[p], from_offset or 0) for p in ends}
    end = dict(ends)
    if until_ms is not None:
        cut = offsets_at(log, topic, until_ms)
        end = {p: min(ends[p], cut[p]) for p in ends}
    return ReplaySpan(topic, {p: min(start[p], end[p]) for p in ends}, end)


class ReplaySource:
    """Copies a ``ReplaySpan`` of the source log into ``target_topic`` (``run`` is a thread's body)."""

    def __init__(self, source: Log, span: ReplaySpan, target: Log, target_topic: str) -> None:
        self.source = source
        self.span = span
        self.target = target
        self.target_topic = target_topic
        self.copied = 0
        self.finished = threading.Event()
        """Set once every record of the span is in the target topic (flushed)."""
        self.error: AstraFlowError | None = None
        self._known: set[bytes] = set()
        self._source_schemas: SchemaStore | None = None

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="replay-source", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        """Copy until the span is done or ``stop`` is set; a failure is kept in ``error``."""
        try:
            self._copy(stop)
        except AstraFlowError as exc:
            logger.error("replay source %s stopped after %d records: %s", self.span.topic, self.copied, exc)
            self.error = exc

    def _copy(self, stop: threading.Event) -> None:
        span = self.span
        pending = {TopicPartition(span.topic, p): span.start[p] for p in span.start if span.start[p] < span.end[p]}
        schemas = LogSchemaStore(self.target)
        consumer = self.source.consumer(group_id=None)
        producer = self.target.producer()
        try:
            self._assign(consumer, pending)
            last = time.monotonic()
            while pending and not stop.is_set():
                messages = consumer.poll(max_records=1000, timeout=0.5)
                if not messages and time.monotonic() - last > STALL_S:
                    raise LogError(
                        f"{span.topic}: nothing readable for {STALL_S:.0f} s at positions {pending} "
                        f"before the span's end {span.end}"
                    )
                copied = 0
                for message in messages:
                    if message.offset >= span.end[message.partition]:
                        continue
                    self._ensure_schema(message.value, schemas)
                    origin = (ORIGIN_HEADER, f"{message.topic}/{message.partition}/{message.offset}".encode())
                    producer.send(self.target_topic, message.value, key=message.key, headers=(*message.headers, origin))
                    copied += 1
                producer.flush()
                self.copied += copied
                if messages:
                    last = time.monotonic()
                    left = {
                        tp: consumer.position(tp) for tp in pending if consumer.position(tp) < span.end[tp.partition]
                    }
                    if len(left) < len(pending):
                        self._assign(consumer, left)
                    pending = left
            if not pending:
                self.finished.set()
                logger.info("replay source: copied %d records of %s", self.copied, span.topic)
        finally:
            producer.close()
            consumer.close()
            schemas.close()

    @staticmethod
    def _assign(consumer, positions: dict[TopicPartition, int]) -> None:
        """Read only the partitions with records left, each from its position (a finished
        partition of a live source would otherwise keep returning records past the span)."""
        consumer.assign(list(positions))
        for tp, offset in positions.items():
            consumer.seek(tp, offset)

    def _ensure_schema(self, value: bytes, target: LogSchemaStore) -> None:
        """Give the target log the writer schema of ``value`` when it does not know it."""
        if len(value) < HEADER_SIZE or value[:2] != MAGIC:
            return  # not single-object Avro: copied as it is, the stream processor dead-letters it
        fp = bytes(value[2:HEADER_SIZE])
        if fp in self._known:
            return
        self._known.add(fp)
        if fp in target:
            return
        if self._source_schemas is None:
            self._source_schemas = self._read_source_schemas()
        if fp in self._source_schemas:
            target.add(self._source_schemas.get(fp))
        else:
            logger.warning(
                "replay source: writer schema %s is in neither log; its records will be dead-lettered", fp.hex()
            )

    def _read_source_schemas(self) -> SchemaStore:
        found = SchemaStore()
        if SCHEMA_TOPIC not in self.source.list_topics():
            return found
        for message in read_snapshot(self.source, SCHEMA_TOPIC):
            try:
                found.add(writer_schema(message.value.decode()))
            except (SchemaError, UnicodeDecodeError) as exc:
                logger.warning("replay source: skipping an unreadable schema record: %s", exc)
        return found
