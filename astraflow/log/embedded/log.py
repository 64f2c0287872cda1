"""The embedded log backend: every topic in one SQLite file, shared by the processes of one machine.

No server: a run directory holds ``log.sqlite`` and any process that opens it is a client.
``EmbeddedLog`` is the admin side and hands out the clients; ``embedded_store`` owns the file
(schema, transactions, retries), ``embedded_producer`` writes, ``embedded_transactions`` writes
records and offsets together, ``embedded_consumer`` reads and ``embedded_groups`` keeps the
consumer-group leases. Each module's docstring states its guarantees. Retention runs when the log
is opened and when producers append.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from astraflow.core.errors import LogError, TopicNotFoundError
from astraflow.log.base import Consumer, Log, OffsetReset, Producer, TopicPartition, TopicSpec, TransactionalProducer
from astraflow.log.embedded import store
from astraflow.log.embedded.consumer import EmbeddedConsumer
from astraflow.log.embedded.producer import EmbeddedProducer
from astraflow.log.embedded.transactions import EmbeddedTransactionalProducer

TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""Kafka's rule for topic names, so a run can move between the backends unchanged."""


class EmbeddedLog(Log):
    """A log in one SQLite file; creates the file and its tables on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._store = store.Store(path)
        self._store.create_schema()
        self._store.write(self._retention_pass)

    def create_topic(self, spec: TopicSpec, exist_ok: bool = True) -> None:
        _check_spec(spec)

        def create(conn: sqlite3.Connection) -> None:
            if store.topic_id(conn, spec.name) is not None:
                if exist_ok:
                    return
                raise LogError(f"topic {spec.name!r} already exists")
            tid = conn.execute(
                "INSERT INTO topics (name, partitions, retention_ms, compacted, max_message_bytes)"
                " VALUES (?, ?, ?, ?, ?)",
                (spec.name, spec.partitions, spec.retention_ms, int(spec.compacted), spec.max_message_bytes),
            ).lastrowid
            conn.executemany(
                "INSERT INTO partitions (topic_id, partition, next_offset) VALUES (?, ?, 0)",
                [(tid, p) for p in range(spec.partitions)],
            )

        self._store.write(create)

    def describe_topic(self, name: str) -> TopicSpec:
        row = self._store.read(
            lambda conn: conn.execute(
                "SELECT partitions, retention_ms, compacted, max_message_bytes FROM topics WHERE name = ?",
                (name,),
            ).fetchone()
        )
        if row is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist in {self.path}")
        partitions, retention_ms, compacted, max_bytes = row
        return TopicSpec(name, partitions, retention_ms, bool(compacted), max_bytes)

    def list_topics(self) -> list[str]:
        rows = self._store.read(lambda conn: conn.execute("SELECT name FROM topics ORDER BY name").fetchall())
        return [name for (name,) in rows]

    def delete_topic(self, name: str) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            tid = store.topic_id(conn, name)
            if tid is None:
                raise TopicNotFoundError(f"topic {name!r} does not exist in {self.path}")
            for table in ("records", "partitions"):
                conn.execute(f"DELETE FROM {table} WHERE topic_id = ?", (tid,))
            conn.execute("DELETE FROM topics WHERE id = ?", (tid,))
            conn.execute("DELETE FROM committed_offsets WHERE topic = ?", (name,))

        self._store.write(delete)

    def end_offsets(self, topic: str) -> dict[int, int]:
        ends = self._store.read(lambda conn: store.end_offsets(conn, topic))
        if ends is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist in {self.path}")
        return ends

    def delete_records(self, topic: str, before: dict[int, int]) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            ends = store.end_offsets(conn, topic)
            if ends is None:
                raise TopicNotFoundError(f"topic {topic!r} does not exist in {self.path}")
            for partition, offset in before.items():
                if partition not in ends or not 0 <= offset <= ends[partition]:
                    raise LogError(
                        f"cannot delete records of {topic}:{partition} below offset {offset}: "
                        f"the partition ends at {ends.get(partition)}"
                    )
            tid = store.topic_id(conn, topic)
            conn.executemany(
                "DELETE FROM records WHERE topic_id = ? AND partition = ? AND offset < ?",
                [(tid, partition, offset) for partition, offset in before.items()],
            )

        self._store.write(delete)

    def group_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        rows = self._store.read(
            lambda conn: conn.execute(
                "SELECT group_id, topic, partition, next_offset FROM committed_offsets"
            ).fetchall()
        )
        groups: dict[str, dict[TopicPartition, int]] = {}
        for group_id, topic, partition, offset in rows:
            groups.setdefault(group_id, {})[TopicPartition(topic, partition)] = offset
        return groups

    def producer(self) -> Producer:
        return EmbeddedProducer(self.path)

    def transactional_producer(self, transactional_id: str, timeout_s: float | None = None) -> TransactionalProducer:
        return EmbeddedTransactionalProducer(self.path, transactional_id)

    def consumer(
        self,
        group_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        session_timeout_s: float = 10.0,
    ) -> Consumer:
        return EmbeddedConsumer(self.path, group_id, auto_offset_reset, session_timeout_s)

    def close(self) -> None:
        self._store.close()

    def _retention_pass(self, conn: sqlite3.Connection) -> None:
        now = store.now_ms()
        rows = conn.execute("SELECT name, partitions, retention_ms FROM topics WHERE retention_ms IS NOT NULL")
        for name, partitions, retention_ms in rows.fetchall():
            store.apply_retention(conn, name, partitions, retention_ms, now)


def _check_spec(spec: TopicSpec) -> None:
    if not TOPIC_NAME.fullmatch(spec.name):
        raise LogError(f"topic name {spec.name!r}: use 1-249 of the characters a-z A-Z 0-9 . _ -")
    if spec.partitions < 1:
        raise LogError(f"topic {spec.name!r}: partitions must be >= 1, got {spec.partitions}")
    if spec.retention_ms is not None and spec.retention_ms < 1:
        raise LogError(f"topic {spec.name!r}: retention_ms must be >= 1 or None, got {spec.retention_ms}")
    if spec.max_message_bytes < 1:
        raise LogError(f"topic {spec.name!r}: max_message_bytes must be >= 1, got {spec.max_message_bytes}")
