"""The embedded log's transactional producer: a transaction is one SQLite write transaction.

A transaction lives in this process's memory until ``commit``; nothing of it is in the file
before, so readers cannot see it and a crash loses it whole. Fencing uses an epoch per
transactional id in ``producer_epochs``:

1. Creating the producer bumps the id's epoch (inserting it at 1) and keeps the new value: every
   older producer with the id now holds a stale epoch.
2. ``begin`` and ``send_offsets`` read the epoch and raise ``FencedError`` if it moved on (as
   Kafka's coordinator answers the offsets of a fenced producer), so a stage learns it was fenced
   before it acts on a transaction it could not commit; ``send`` and ``send_offsets`` only buffer,
   in order.
3. ``commit`` runs one ``BEGIN IMMEDIATE ... COMMIT`` transaction that
   a. reads the epoch again and raises ``FencedError`` if it moved on (SQLite serialises writers,
      so no newer producer can appear between this check and the ``COMMIT``);
   b. appends the records as a flush of ``EmbeddedProducer`` does (``Appender``), but a record
      that cannot be written (missing topic or partition, over ``max_message_bytes``) fails the
      whole transaction with ``DeliveryError``;
   c. writes each consumer's offsets for the partitions it still owns in its group
      (``EmbeddedConsumer.commit_in``), and fails the whole transaction with
      ``TransactionAbortedError`` when it owns not all of them;
   d. commits. Any failure rolls all of it back: records and offsets are written together or
      not at all.
4. ``abort`` and ``close`` drop the buffer. After a ``FencedError`` every call raises it again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import DeliveryError, FencedError, LogError, TransactionAbortedError
from astraflow.log.base import Consumer, TopicPartition, TransactionalProducer
from astraflow.log.embedded import store
from astraflow.log.embedded.consumer import EmbeddedConsumer
from astraflow.log.embedded.doorbell import ring
from astraflow.log.embedded.producer import Appender, Pending, delivery_error


class EmbeddedTransactionalProducer(TransactionalProducer):
    """A ``TransactionalProducer`` on the embedded log (see the module docstring)."""

    def __init__(self, path: Path, transactional_id: str) -> None:
        self._store = store.Store(path)
        self._id = transactional_id
        crash_point("embedded.fence_predecessor", transactional_id)  # the epoch bump that fences an older producer
        self._epoch = self._store.write(self._bump)
        self._appender = Appender()
        self._records: list[Pending] | None = None
        """The open transaction's records; ``None`` when no transaction is open."""
        self._offsets: list[tuple[EmbeddedConsumer, dict[TopicPartition, int]]] = []
        self._fenced = False
        self._closed = False

    def begin(self) -> None:
        self._check_usable()
        if self._records is not None:
            raise LogError(f"transactional producer {self._id!r}: a transaction is already open")
        self._store.read(self._check_epoch)
        self._records, self._offsets = [], []

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self._open_records("send").append(Pending.of(topic, value, key, headers, partition, timestamp_ms))

    def send_offsets(self, consumer: Consumer, offsets: dict[TopicPartition, int]) -> None:
        self._open_records("send_offsets")
        if not isinstance(consumer, EmbeddedConsumer):
            raise LogError(f"send_offsets needs a consumer of the embedded log, got {type(consumer).__name__}")
        if consumer.group_id is None:
            raise LogError("send_offsets needs a consumer with a group_id")
        self._store.read(self._check_epoch)
        if offsets:
            self._offsets.append((consumer, dict(offsets)))

    def commit(self, timeout: float = 30.0) -> None:
        records = self._open_records("commit")
        offsets, self._records, self._offsets = self._offsets, None, []
        nbytes = sum(record.size for record in records)
        try:
            crash_point("embedded.commit_transaction", self._id)
            self._store.write(lambda conn: self._commit(conn, records, offsets), timeout, nbytes)
        except (FencedError, DeliveryError, TransactionAbortedError):
            raise
        except LogError as exc:  # SQLite failed, or stayed locked past the timeout: all rolled back
            raise TransactionAbortedError(f"transaction of {self._id!r} not written: {exc}") from exc
        ring(self._store.path, {record.topic for record in records})

    def abort(self, timeout: float = 30.0) -> None:
        self._open_records("abort")
        self._records, self._offsets = None, []

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._records, self._offsets = None, []
        self._store.close()

    def _commit(
        self,
        conn: sqlite3.Connection,
        records: list[Pending],
        offsets: list[tuple[EmbeddedConsumer, dict[TopicPartition, int]]],
    ) -> None:
        self._check_epoch(conn)  # 3a
        failures = self._appender.append(conn, records)  # 3b
        if failures:
            error, cause = delivery_error(failures, len(records))
            raise error from cause
        for consumer, partitions in offsets:  # 3c
            rejected = consumer.commit_in(conn, partitions)
            if rejected:
                names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in rejected)
                raise TransactionAbortedError(
                    f"transaction of {self._id!r} aborted: its consumer no longer owns {names} in its group"
                )
        crash_point("embedded.commit_written", self._id)  # all written, the SQL COMMIT not yet made

    def _bump(self, conn: sqlite3.Connection) -> int:
        conn.execute(
            "INSERT INTO producer_epochs (transactional_id, epoch) VALUES (?, 1)"
            " ON CONFLICT (transactional_id) DO UPDATE SET epoch = epoch + 1",
            (self._id,),
        )
        return self._read_epoch(conn)

    def _check_epoch(self, conn: sqlite3.Connection) -> None:
        if self._read_epoch(conn) != self._epoch:
            self._fenced = True
            raise FencedError(
                f"transactional producer {self._id!r} was fenced: a newer producer with the same id exists"
            )

    def _read_epoch(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT epoch FROM producer_epochs WHERE transactional_id = ?", (self._id,)).fetchone()
        return row[0]

    def _open_records(self, operation: str) -> list[Pending]:
        self._check_usable()
        if self._records is None:
            raise LogError(f"transactional producer {self._id!r}: {operation} needs an open transaction (begin)")
        return self._records

    def _check_usable(self) -> None:
        if self._fenced:
            raise FencedError(f"transactional producer {self._id!r} was fenced by a newer one with the same id")
        if self._closed:
            raise LogError(f"transactional producer {self._id!r} is closed")
