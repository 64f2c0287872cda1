"""The Log API: the only way AstraFlow components talk to each other.

A ``Log`` is a set of named, partitioned, append-only topics of ``bytes`` records with keys,
headers and timestamps, plus consumer groups with committed offsets. Two backends implement it
(``embedded``: SQLite in WAL mode; ``kafka``: confluent-kafka against Apache Kafka); components
only ever see these abstract classes, chosen by ``LogConfig.backend``.

Delivery contract shared by both backends:

1. ``Producer.send`` queues a record; ``Producer.flush`` returns only when every queued record is
   durably acknowledged, and raises ``DeliveryError`` naming the failures otherwise.
2. Records with the same key go to the same partition and keep their order there.
3. A consumer in a group owns a disjoint subset of partitions; when a member joins, leaves or
   stops heart-beating, partitions are reassigned and the new owner resumes from the group's
   committed offset (or ``auto_offset_reset`` when there is none).
4. ``Consumer.commit`` stores, per partition, the offset of the *next* record to read. Records
   read but not committed are read again after a crash: delivery is at-least-once, and the
   components drop duplicates by deterministic record ids.

A ``TransactionalProducer`` adds exactly-once hops on top: a stage writes its outputs and the
offsets of the input they came from in one transaction (its own numbered guarantees below).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterator, Literal, Sequence

OffsetReset = Literal["earliest", "latest"]
ASSIGN_GROUP_PREFIX = "astraflow-assign-"
"""Prefix of the throwaway group of a Kafka consumer opened without one (it only assigns, never commits)."""


@dataclass(frozen=True)
class TopicSpec:
    """A topic's name and settings, as created or as described."""

    name: str
    partitions: int = 1
    retention_ms: int | None = None
    """Records older than this may be deleted; ``None`` keeps them forever."""
    compacted: bool = False
    """Keep only the newest record per key (the schema topic, changelogs, episode journals). A record
    with an empty value is the key's tombstone: compaction removes the key's older records at once
    and the tombstone itself after a day (Kafka, which gets it as a null value: ``delete.retention.ms``;
    the embedded log: ``compaction.TOMBSTONE_RETENTION_MS``). Readers see a tombstone as an empty value."""
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest record the topic accepts."""
    segment_ms: int | None = None
    """Kafka: roll the topic's active segment at least this often (``None``: the broker's default,
    7 days). Kafka never compacts the active segment, so a compacted topic written all the time
    (a changelog) needs it short for its old values to go; the embedded log compacts at once."""


@dataclass(frozen=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True)
class Message:
    """One record as read from the log."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = field(default=())


class Producer(ABC):
    """Writes records; see the delivery contract in the module docstring."""

    @abstractmethod
    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue one record; with no partition, the key's hash picks it (round robin if no key)."""

    @abstractmethod
    def flush(self, timeout: float = 30.0) -> None:
        """Block until every queued record is acknowledged; raise ``DeliveryError`` otherwise."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release resources."""

    def mark(self) -> int:
        """A mark after every record sent so far, for ``settled`` to tell when those are acknowledged."""
        return 0

    def settled(self, mark: int | None = None) -> bool:
        """Whether every record sent before ``mark`` (``None``: every record sent so far) is
        acknowledged, without waiting where the backend can tell; raises like ``flush`` for records
        that failed. This one flushes: always True."""
        self.flush()
        return True

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer(ABC):
    """Reads records, either as a member of a group (``subscribe``) or by ``assign``."""

    @abstractmethod
    def subscribe(self, topics: Sequence[str]) -> None:
        """Join the consumer group for these topics; partitions are assigned by the group."""

    @abstractmethod
    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Read exactly these partitions, outside any group rebalancing."""

    @abstractmethod
    def assignment(self) -> list[TopicPartition]:
        """Partitions this consumer owns right now."""

    @abstractmethod
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        """Return up to ``max_records`` records, waiting at most ``timeout`` seconds for the first."""

    @abstractmethod
    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Store next-offsets for the group; ``None`` commits the current positions."""

    def read_range(self, partition: TopicPartition, start: int, end: int) -> Iterator[Message]:
        """The records of ``partition`` from ``start`` up to ``end`` (exclusive) that are still there, in
        order, as they are read. The consumer reads that partition alone meanwhile and holds no
        assignment once the range is read (or the iterator closed), so one consumer can serve many
        ranges (a reader kept open costs a client's start and close once)."""
        self._assign_at(partition, start)
        try:
            while self.position(partition) < end:
                yield from (m for m in self.poll(max_records=1000, timeout=1.0) if start <= m.offset < end)
        finally:
            self.assign([])

    def _assign_at(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` alone, from ``offset``."""
        self.assign([partition])
        self.seek(partition, offset)

    @abstractmethod
    def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed next-offset per partition (``None`` if never committed)."""

    @abstractmethod
    def position(self, partition: TopicPartition) -> int:
        """Offset of the next record this consumer will return for the partition."""

    @abstractmethod
    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read the partition from ``offset`` next."""

    @abstractmethod
    def seek_to_beginning(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        """Read from the oldest retained record (all assigned partitions when ``None``)."""

    @abstractmethod
    def seek_to_end(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        """Read only records appended from now on."""

    @abstractmethod
    def seek_to_timestamp(self, timestamp_ms: int, partitions: Sequence[TopicPartition] | None = None) -> None:
        """Read from the first record whose timestamp is >= ``timestamp_ms``."""

    @abstractmethod
    def lag(self) -> dict[TopicPartition, int]:
        """Records between this consumer's position and the end, per assigned partition."""

    @abstractmethod
    def close(self) -> None:
        """Leave the group (its partitions go to other members) and release resources."""

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TransactionalProducer(ABC):
    """Writes records and a consumer group's offsets in transactions: all of one become visible, or none.

    Made by ``Log.transactional_producer(transactional_id)``, one transaction at a time: ``begin``,
    any number of ``send`` and ``send_offsets``, then ``commit`` or ``abort``. Guaranteed on both
    backends:

    1. Nothing sent in a transaction is readable, and none of its offsets is committed, before
       ``commit`` returns; then all of them are, together. Readers never see records of an aborted
       or unfinished transaction (Kafka consumers read ``read_committed``; the embedded log holds
       the transaction in memory and writes it only at ``commit``).
    2. ``abort``, ``close`` with a transaction open, and the crash of the process leave nothing of
       the open transaction visible.
    3. Creating a producer fences every older producer with the same transactional id: the older
       one's open transaction can never commit, and from the moment it learns of the newer one
       (``commit`` at the latest, ``begin`` on the embedded log) every call of it but ``close``
       raises ``FencedError``. Of two instances of a stage, only the newest writes.
    4. ``send_offsets(consumer, offsets)`` commits next-offsets for ``consumer``'s group, as
       ``Consumer.commit`` does, but with the transaction. A group member's offsets count only for
       partitions it still owns at the group generation its assignment came from (both backends
       check the generation: Kafka's coordinator, the embedded log in the committing SQLite
       transaction); otherwise the transaction is aborted.
    5. ``commit`` makes everything visible, or raises and makes nothing visible: ``FencedError``
       (this producer is finished: close it); ``DeliveryError`` / ``RecordTooLargeError`` (a record
       could not be written) or ``TransactionAbortedError`` (the log aborted it, e.g. the consumer
       lost partitions whose offsets were sent), after which ``begin`` starts the next one. Any
       other ``LogError`` (the log did not answer in time) leaves the outcome unknown: close the
       producer; a new one with the same id settles the transaction, and the group's committed
       offsets tell which way.

    On Kafka, records of a transaction take offsets whether it commits or not, and each commit or
    abort writes a marker that takes one more, so a transactional topic's offsets have gaps. An
    open transaction holds ``read_committed`` readers of its partitions back until it ends: a
    crashed producer's transaction ends when a new producer with its id starts, or after
    ``transaction.timeout.ms`` (60 s). Likewise, while a transaction holds offsets for a group,
    Kafka tells that group's committed offsets (``Consumer.committed``, and where a new member
    starts) only once it ends, where the embedded log tells those from before it: ask before
    ``begin``, not in between.
    """

    @abstractmethod
    def begin(self) -> None:
        """Start a transaction; ``LogError`` if one is already open."""

    @abstractmethod
    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Add one record to the open transaction, partitioned as ``Producer.send`` does."""

    @abstractmethod
    def send_offsets(self, consumer: Consumer, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` (the next record to read, per partition) for ``consumer``'s group
        with the open transaction. ``consumer`` comes from the same log and has a ``group_id``;
        a later call for the same partition replaces the offset."""

    @abstractmethod
    def commit(self, timeout: float = 30.0) -> None:
        """Make the open transaction's records and offsets visible together (step 5 for failures)."""

    @abstractmethod
    def abort(self, timeout: float = 30.0) -> None:
        """Drop the open transaction: nothing of it becomes visible."""

    @abstractmethod
    def close(self) -> None:
        """Abort the open transaction, if any, and release resources."""

    def __enter__(self) -> "TransactionalProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Log(ABC):
    """Admin operations plus factories for producers and consumers of one log."""

    @abstractmethod
    def create_topic(self, spec: TopicSpec, exist_ok: bool = True) -> None:
        """Create a topic; an existing one is left as it is when ``exist_ok``."""

    @abstractmethod
    def describe_topic(self, name: str) -> TopicSpec:
        """Settings of an existing topic; ``TopicNotFoundError`` otherwise."""

    @abstractmethod
    def list_topics(self) -> list[str]:
        """Names of all user topics, sorted."""

    @abstractmethod
    def delete_topic(self, name: str) -> None:
        """Delete a topic and its records."""

    @abstractmethod
    def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset the next appended record will get."""

    @abstractmethod
    def delete_records(self, topic: str, before: dict[int, int]) -> None:
        """Delete, per partition given, every record below its offset (Kafka's DeleteRecords).

        The partition's start moves up; kept records keep their offsets, and a reader positioned
        below the new start continues from it. Used to cut a topic back to the records still needed
        (``weights.keep_versions``). ``TopicNotFoundError`` for a missing topic, ``LogError`` for an
        unknown partition or an offset past the partition's end.
        """

    @abstractmethod
    def group_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Read-only: every consumer group's committed next-offset per partition (groups that never
        committed are absent). Analysis tools compute a group's lag from it without joining it."""

    @abstractmethod
    def producer(self) -> Producer:
        """A new producer (idempotent where the backend allows)."""

    @abstractmethod
    def transactional_producer(self, transactional_id: str, timeout_s: float | None = None) -> TransactionalProducer:
        """A producer of transactions that fences every older one with the same ``transactional_id``.

        Name the id after what the stage writes for, e.g. ``{run}.train.{policy}``, so that a
        restarted stage gets the same one; it may wait for an older instance's transaction to end.
        ``timeout_s``: how long a transaction may stay open before the log aborts it (Kafka's
        ``transaction.timeout.ms``, librdkafka's default when None); the embedded log never leaves
        one open, so it has none.
        """

    @abstractmethod
    def consumer(
        self,
        group_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        session_timeout_s: float = 10.0,
    ) -> Consumer:
        """A new consumer; with ``group_id`` it can ``subscribe``, without it only ``assign``."""

    def range_reader(self) -> Consumer:
        """A consumer without a group, to be kept for many ``Consumer.read_range`` calls."""
        return self.consumer()

    @abstractmethod
    def close(self) -> None:
        """Release the log's resources."""

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
