"""Compaction of the embedded log's compacted topics (``TopicSpec.compacted``), run by the appending
transaction itself, so a reader never sees a superseded record."""

from __future__ import annotations

import sqlite3

TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000  # a tombstone stays readable a day: Kafka's delete.retention.ms


def compact(conn: sqlite3.Connection, tid: int, partition: int, now_ms: int = 0) -> int:
    """Delete every keyed record a newer one with the same key supersedes, and the tombstones (empty values,
    ``TopicSpec.compacted``) older than ``TOMBSTONE_RETENTION_MS`` at ``now_ms``."""
    return conn.execute(
        "DELETE FROM records WHERE topic_id = :t AND partition = :p AND key IS NOT NULL"
        " AND (offset NOT IN (SELECT max(offset) FROM records WHERE topic_id = :t AND partition = :p"
        " AND key IS NOT NULL GROUP BY key) OR (length(value) = 0 AND timestamp_ms < :before))",
        {"t": tid, "p": partition, "before": now_ms - TOMBSTONE_RETENTION_MS},
    ).rowcount
