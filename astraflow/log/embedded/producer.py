"""The embedded log's producer: a queue in memory, written one transaction per flush.

Guarantees (the numbered contract of ``base.py``, as implemented here):

1. ``send`` only queues. The queue is written by ``flush`` - or by a ``send`` that finds it over
   ``LINGER_RECORDS`` records, ``LINGER_BYTES`` bytes or ``LINGER_S`` seconds old, in which case
   that ``send`` raises what ``flush`` would.
2. ``flush`` writes the whole queue in one transaction: per partition, offsets are taken from
   ``partitions.next_offset`` in queue order, so records of one key keep their order.
3. A record for a missing topic, over its topic's ``max_message_bytes``, or for a partition the
   topic lacks is not written; the others of the batch are (as a Kafka producer delivers the
   rest of its queue), and ``flush`` then raises ``DeliveryError`` naming every failure -
   ``RecordTooLargeError`` when all failures are over-size records. Topics are never created
   on the fly, exactly like the Kafka backend.
4. A failed transaction (a full disk, the file locked past the deadline) writes nothing and
   raises ``DeliveryError``; the batch is dropped either way, never retried behind the caller.

Keys pick partitions by CRC-32 of the key bytes (librdkafka's ``consistent`` partitioner), so
the choice is stable across processes; records without a key go round robin. In the appending
transaction, compacted topics drop the records that a new one with the same key supersedes, and
topics with ``retention_ms`` drop expired records (per producer and topic, at most every
``RETENTION_CHECK_S``). ``Appender`` does this appending for the transactional producer
(``embedded_transactions``) too.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from astraflow.core.errors import DeliveryError, LogError, RecordTooLargeError, TopicNotFoundError
from astraflow.log.base import Producer
from astraflow.log.embedded import store
from astraflow.log.embedded.compaction import compact
from astraflow.log.embedded.doorbell import ring

LINGER_RECORDS = 10_000
LINGER_BYTES = 8 * 1024 * 1024
LINGER_S = 0.1
RETENTION_CHECK_S = 5.0


class Pending(NamedTuple):
    """A queued record (a tuple, because a producer makes hundreds of thousands a second)."""

    topic: str
    value: bytes
    key: bytes | None
    headers: bytes | None
    partition: int | None
    timestamp_ms: int
    size: int
    """Bytes counted against ``max_message_bytes``: value, key and packed headers."""

    @classmethod
    def of(
        cls,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        partition: int | None,
        timestamp_ms: int | None,
    ) -> Pending:
        packed = store.pack_headers(headers)
        timestamp = store.now_ms() if timestamp_ms is None else timestamp_ms
        return cls(topic, value, key, packed, partition, timestamp, len(value) + len(key or b"") + len(packed or b""))


@dataclass(frozen=True)
class Failure:
    reason: str
    too_large: bool = False
    missing_topic: str | None = None


class EmbeddedProducer(Producer):
    """Queues records and writes each flushed batch in one transaction (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self._store = store.Store(path)
        self._queue_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._queue: list[Pending] = []
        self._queued_bytes = 0
        self._oldest = 0.0
        self._appender = Appender()
        self._closed = False

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        if self._closed:
            raise LogError("send on a closed producer")
        record = Pending.of(topic, value, key, headers, partition, timestamp_ms)
        with self._queue_lock:
            if not self._queue:
                self._oldest = time.monotonic()
            self._queue.append(record)
            self._queued_bytes += record.size
            due = (
                len(self._queue) >= LINGER_RECORDS
                or self._queued_bytes >= LINGER_BYTES
                or time.monotonic() - self._oldest >= LINGER_S
            )
        if due:
            self.flush()

    def flush(self, timeout: float = 30.0) -> None:
        with self._flush_lock:
            with self._queue_lock:
                batch, self._queue, nbytes, self._queued_bytes = self._queue, [], self._queued_bytes, 0
            if not batch:
                return
            try:
                failures = self._store.write(lambda conn: self._appender.append(conn, batch), timeout, nbytes)
            except LogError as exc:
                raise DeliveryError(f"{len(batch)} records not written to {self._store.path}: {exc}") from exc
            ring(self._store.path, {record.topic for record in batch})
        if failures:
            error, cause = delivery_error(failures, len(batch))
            raise error from cause

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            self._store.close()


class Appender:
    """Appends batches of records inside a write transaction (steps 2 and 3 of the module docstring).

    Keeps what must outlive one batch: the round-robin turn of each topic and when its retention
    last ran. ``append`` may run again on a busy retry; the turns it took stay taken.
    """

    def __init__(self) -> None:
        self._round_robin: dict[str, int] = {}
        self._retention_checked: dict[str, float] = {}

    def append(self, conn: sqlite3.Connection, batch: list[Pending]) -> list[Failure]:
        """Write every record of ``batch`` that fits; return the failures of the others."""
        now = store.now_ms()
        topics = {
            name: row
            for name in {record.topic for record in batch}
            if (
                row := conn.execute(
                    "SELECT id, partitions, max_message_bytes, compacted, retention_ms FROM topics WHERE name = ?",
                    (name,),
                ).fetchone()
            )
        }
        ends: dict[tuple[int, int], int] = {}
        rows, failures = [], []
        for record in batch:
            if record.topic not in topics:
                failures.append(Failure(f"topic {record.topic!r} does not exist", missing_topic=record.topic))
                continue
            tid, partitions, max_bytes, _, _ = topics[record.topic]
            if record.size > max_bytes:
                failures.append(
                    Failure(
                        f"record of {record.size:,} bytes exceeds max_message_bytes {max_bytes:,}"
                        f" of topic {record.topic!r}",
                        too_large=True,
                    )
                )
                continue
            partition = self._partition_for(record, partitions)
            if not 0 <= partition < partitions:
                failures.append(Failure(f"topic {record.topic!r} has no partition {partition}"))
                continue
            if (tid, partition) not in ends:
                ends[tid, partition] = conn.execute(
                    "SELECT next_offset FROM partitions WHERE topic_id = ? AND partition = ?", (tid, partition)
                ).fetchone()[0]
            offset = ends[tid, partition]
            ends[tid, partition] = offset + 1
            rows.append((tid, partition, offset, record.timestamp_ms, record.key, record.headers, record.value))
        conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        conn.executemany(
            "UPDATE partitions SET next_offset = ? WHERE topic_id = ? AND partition = ?",
            [(end, tid, partition) for (tid, partition), end in ends.items()],
        )
        for name, (tid, partitions, _, compacted, retention_ms) in topics.items():
            if compacted:
                for touched, partition in ends:
                    if touched == tid:
                        compact(conn, tid, partition, now)
            if retention_ms is not None and time.monotonic() >= self._retention_checked.get(name, 0.0):
                self._retention_checked[name] = time.monotonic() + RETENTION_CHECK_S
                store.apply_retention(conn, name, partitions, retention_ms, now)
        return failures

    def _partition_for(self, record: Pending, partitions: int) -> int:
        if record.partition is not None:
            return record.partition
        if record.key is not None:
            return zlib.crc32(record.key) % partitions
        turn = self._round_robin.get(record.topic, 0)
        self._round_robin[record.topic] = turn + 1
        return turn % partitions


def delivery_error(failures: list[Failure], total: int) -> tuple[DeliveryError, TopicNotFoundError | None]:
    """The error ``flush`` raises for these failures, and its cause when a topic was missing."""
    reasons = list(dict.fromkeys(failure.reason for failure in failures))
    shown = "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")
    message = f"{len(failures)} of {total} records not delivered: {shown}"
    error_class = RecordTooLargeError if all(f.too_large for f in failures) else DeliveryError
    missing = next((f.missing_topic for f in failures if f.missing_topic), None)
    cause = None if missing is None else TopicNotFoundError(f"topic {missing!r} does not exist")
    return error_class(message), cause
