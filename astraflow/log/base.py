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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal, Sequence

OffsetReset = Literal["earliest", "latest"]


@dataclass(frozen=True)
class TopicSpec:
    """A topic's name and settings, as created or as described."""

    name: str
    partitions: int = 1
    retention_ms: int | None = None
    """Records older than this may be deleted; ``None`` keeps them forever."""
    compacted: bool = False
    """Keep only the newest record per key (used for the schema topic)."""
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest record the topic accepts."""


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
    def consumer(
        self,
        group_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        session_timeout_s: float = 10.0,
    ) -> Consumer:
        """A new consumer; with ``group_id`` it can ``subscribe``, without it only ``assign``."""

    @abstractmethod
    def close(self) -> None:
        """Release the log's resources."""

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
