"""The SQLite file behind the embedded log: schema, short transactions, retries, record reads.

One file in WAL mode holds every topic, record, consumer-group member and committed offset.
Each producer, consumer, heartbeat thread and log handle opens its own connection, so several
processes on one machine share the log: SQLite serialises the writers, readers never block them.

Every write runs the same three steps:

1. ``BEGIN IMMEDIATE`` takes the file's single write lock up front (waiting up to the busy
   timeout), so no transaction fails half-way for want of the lock;
2. the statements of one operation run (a producer's whole batch, a heartbeat, a commit);
3. ``COMMIT`` makes them durable against the crash of any process. With ``synchronous=NORMAL``
   in WAL mode a power cut may lose the last transactions but never corrupts the file, the
   same promise as Kafka's default of not calling fsync.

A ``database is locked`` / ``busy`` error at any step rolls the transaction back and runs it
again after a growing back-off, until the caller's deadline; any other SQLite error, or the
deadline, raises ``LogError``. Reads run in a deferred transaction, so each sees one snapshot.

Checkpoints (copying the write-ahead log back into the file) are not run by ``COMMIT``, where
SQLite puts them by default and where they took two thirds of the time of a large write: each
process runs them on a thread of its own (``Checkpointer``) once it has written
``CHECKPOINT_WAL_BYTES``. A record is readable from its ``COMMIT`` on either way.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from astraflow.core.errors import LogError
from astraflow.log.base import Message

logger = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_S = 1.0
"""How long SQLite itself waits for the write lock before our own retry loop takes over."""

WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
"""The write-ahead log is cut back to this size after each checkpoint, so big records do not leave
it large for good."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so a re-created topic starts empty
    name TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL,
    retention_ms INTEGER,
    compacted INTEGER NOT NULL,
    max_message_bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    key BLOB,
    headers BLOB,
    value BLOB NOT NULL,
    PRIMARY KEY (topic_id, partition, offset)
);
CREATE TABLE IF NOT EXISTS group_members (
    group_id TEXT NOT NULL,
    member_id TEXT NOT NULL,
    topics TEXT NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    session_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, member_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_generations (
    group_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS committed_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producer_epochs (
    transactional_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL  -- bumped by each new producer with the id: only the newest commits
) WITHOUT ROWID;
"""


CHECKPOINT_WAL_BYTES = 4 * 1024 * 1024
"""A process's checkpointer runs once its writes since the last checkpoint reach this many bytes
(SQLite's default automatic checkpoint is at 1000 pages, 4 MiB)."""

SMALL_WRITE_BYTES = 8 * 1024
"""What a write transaction counts for at least: the pages of its rows and of the indexes it updates."""


class Checkpointer:
    """One thread per process and log file that runs passive checkpoints after writes.

    It counts the bytes this process wrote (each transaction at least ``SMALL_WRITE_BYTES``) and
    runs once they reach ``CHECKPOINT_WAL_BYTES``; a writer that finds ``WAL_SIZE_LIMIT_BYTES``
    counted and not yet checkpointed runs the checkpoint itself, so the write-ahead log stays
    bounded. A passive checkpoint copies what no reader still needs and never blocks readers or
    writers; whatever it leaves, the next one takes. A process killed mid-checkpoint loses nothing
    (SQLite recovers the write-ahead log on the next open).

    Nothing here opens the ``-wal`` or ``-shm`` files except through SQLite: closing any file
    descriptor of a file drops every POSIX lock the process holds on it, SQLite's included, which
    is how databases get corrupted (https://sqlite.org/howtocorrupt.html, section 2.2). (An earlier
    version read the wal-index header with ``open()``; a benchmark's log came out malformed.)
    """

    _registry: dict[tuple[int, Path], Checkpointer] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def of(cls, path: Path) -> Checkpointer:
        """This process's checkpointer for ``path`` (a forked child gets its own)."""
        key = (os.getpid(), path)
        with cls._registry_lock:
            if key not in cls._registry:
                cls._registry[key] = cls(path)
            return cls._registry[key]

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._pending = 0  # bytes written since the thread was last woken
        self._unchecked = 0  # bytes written since the last checkpoint finished
        self._wake = threading.Event()
        threading.Thread(target=self._run, name=f"checkpoint {path.name}", daemon=True).start()

    def written(self, nbytes: int) -> int:
        """A write transaction of about ``nbytes`` committed: wake the thread once enough waits.
        Returns the bytes written since the last finished checkpoint."""
        with self._lock:
            size = max(nbytes, SMALL_WRITE_BYTES)
            self._pending += size
            self._unchecked += size
            if self._pending >= CHECKPOINT_WAL_BYTES:
                self._pending = 0
                self._wake.set()
            return self._unchecked

    def checkpointed(self) -> None:
        with self._lock:
            self._unchecked = 0

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            checkpoint(self._path)
            self.checkpointed()


def checkpoint(path: Path, conn: sqlite3.Connection | None = None) -> None:
    """One passive checkpoint of ``path``, on ``conn`` or on a connection of its own (so that no
    idle connection keeps the write-ahead log alive after the last ``Store`` closes)."""
    own = conn is None
    try:
        if own:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.Error as exc:  # busy or gone: the next write wakes the checkpointer again
        logger.debug("embedded log %s: checkpoint skipped: %s", path, exc)
    finally:
        if own and conn is not None:
            conn.close()


def now_ms() -> int:
    """Wall-clock milliseconds: shared by every process on the machine, like record timestamps."""
    return time.time_ns() // 1_000_000


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _create_private(path: Path) -> None:
    """Create the log file readable and writable by its owner only (mode 0600), unless it exists:
    the embedded log has no users or ACLs, so the file's mode is its only access control. SQLite
    gives the write-ahead log and shared-memory files the database file's mode."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


class Store:
    """One connection to the log file; its threads take turns through a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _create_private(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        self._retry(lambda: self._conn.execute("PRAGMA journal_mode=WAL").fetchone(), 30.0)
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        self._conn.execute("PRAGMA wal_autocheckpoint=0")  # the Checkpointer's thread runs them
        self._checkpointer = Checkpointer.of(path)

    def create_schema(self) -> None:
        """Create the tables if this is a new file (every statement is ``IF NOT EXISTS``)."""
        self.write(lambda conn: [conn.execute(stmt) for stmt in SCHEMA.split(";") if stmt.strip()])

    def write(self, work: Callable[[sqlite3.Connection], T], timeout: float = 30.0, nbytes: int = 0) -> T:
        """Run ``work`` in one ``BEGIN IMMEDIATE`` transaction; it may run again after a busy error.
        ``nbytes``: about how many bytes it writes (record payloads), for the checkpointer."""
        result = self._retry(lambda: self._transaction("BEGIN IMMEDIATE", work), timeout)
        if self._checkpointer.written(nbytes) > WAL_SIZE_LIMIT_BYTES:
            # writes outrun the thread: this writer checkpoints itself, as SQLite does by default,
            # so the write-ahead log cannot grow without bound
            with self._lock:
                checkpoint(self.path, self._conn)
            self._checkpointer.checkpointed()
        return result

    def read(self, work: Callable[[sqlite3.Connection], T], timeout: float = 30.0) -> T:
        """Run ``work`` on one consistent snapshot of the file."""
        return self._retry(lambda: self._transaction("BEGIN", work), timeout)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _transaction(self, begin: str, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                self._conn.execute(begin)
                result = work(self._conn)
                self._conn.execute("COMMIT")
                return result
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    def _retry(self, attempt: Callable[[], T], timeout: float) -> T:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                return attempt()
            except sqlite3.Error as exc:
                if not _is_busy(exc) or time.monotonic() + delay > deadline:
                    raise LogError(f"embedded log {self.path}: {exc}") from exc
                logger.debug("embedded log %s busy, retrying in %.3f s", self.path, delay)
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def pack_headers(headers: Sequence[tuple[str, bytes]]) -> bytes | None:
    """Headers as ``count:u16`` then ``name_len:u16 value_len:u32 name value`` each; ``None`` if empty."""
    if not headers:
        return None
    parts = [struct.pack("<H", len(headers))]
    for name, value in headers:
        encoded = name.encode()
        parts += [struct.pack("<HI", len(encoded), len(value)), encoded, bytes(value)]
    return b"".join(parts)


def unpack_headers(blob: bytes | None) -> tuple[tuple[str, bytes], ...]:
    if not blob:
        return ()
    (count,) = struct.unpack_from("<H", blob)
    at, out = 2, []
    for _ in range(count):
        name_len, value_len = struct.unpack_from("<HI", blob, at)
        at += 6
        name = blob[at : at + name_len].decode()
        at += name_len
        out.append((name, blob[at : at + value_len]))
        at += value_len
    return tuple(out)


def topic_id(conn: sqlite3.Connection, topic: str) -> int | None:
    row = conn.execute("SELECT id FROM topics WHERE name = ?", (topic,)).fetchone()
    return None if row is None else row[0]


def end_offsets(conn: sqlite3.Connection, topic: str) -> dict[int, int] | None:
    """Per partition, the offset the next record will get; ``None`` when the topic is missing."""
    tid = topic_id(conn, topic)
    if tid is None:
        return None
    rows = conn.execute("SELECT partition, next_offset FROM partitions WHERE topic_id = ?", (tid,))
    return dict(rows.fetchall())


def _first_offset(conn: sqlite3.Connection, topic: str, partition: int, min_timestamp_ms: int) -> int:
    """First offset whose timestamp is >= ``min_timestamp_ms``, or the end offset when none is.

    Walks the partition in offset order and stops at the first match: there is no time index,
    because keeping one would slow every append.
    """
    tid = topic_id(conn, topic)
    if tid is None:
        return 0
    row = conn.execute(
        "SELECT offset FROM records WHERE topic_id = ? AND partition = ? AND timestamp_ms >= ? ORDER BY offset LIMIT 1",
        (tid, partition, min_timestamp_ms),
    ).fetchone()
    if row is not None:
        return row[0]
    end = conn.execute(
        "SELECT next_offset FROM partitions WHERE topic_id = ? AND partition = ?", (tid, partition)
    ).fetchone()
    return 0 if end is None else end[0]


def start_offset(conn: sqlite3.Connection, topic: str, partition: int) -> int:
    """Offset of the oldest retained record (the end offset when the partition is empty)."""
    return _first_offset(conn, topic, partition, -(2**63))


def offset_for_time(conn: sqlite3.Connection, topic: str, partition: int, timestamp_ms: int) -> int:
    """First offset whose timestamp is >= ``timestamp_ms`` (the end offset when there is none)."""
    return _first_offset(conn, topic, partition, timestamp_ms)


def read_records(
    conn: sqlite3.Connection, topic: str, partition: int, offset: int, limit: int, max_bytes: int
) -> list[Message]:
    """Records from ``offset`` on, at most ``limit`` of them and about ``max_bytes`` (never none)."""
    cursor = conn.execute(
        "SELECT r.offset, r.timestamp_ms, r.key, r.headers, r.value FROM records r"
        " JOIN topics t ON r.topic_id = t.id"
        " WHERE t.name = ? AND r.partition = ? AND r.offset >= ? ORDER BY r.offset LIMIT ?",
        (topic, partition, offset, limit),
    )
    out: list[Message] = []
    for record_offset, timestamp, key, headers, value in cursor:
        out.append(Message(topic, partition, record_offset, key, value, timestamp, unpack_headers(headers)))
        max_bytes -= len(value)
        if max_bytes <= 0:
            break
    return out


def committed_offset(conn: sqlite3.Connection, group_id: str, topic: str, partition: int) -> int | None:
    row = conn.execute(
        "SELECT next_offset FROM committed_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
        (group_id, topic, partition),
    ).fetchone()
    return None if row is None else row[0]


def write_committed(conn: sqlite3.Connection, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
    conn.executemany(
        "INSERT INTO committed_offsets (group_id, topic, partition, next_offset) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (group_id, topic, partition) DO UPDATE SET next_offset = excluded.next_offset",
        [(group_id, topic, partition, offset) for (topic, partition), offset in offsets.items()],
    )


def apply_retention(conn: sqlite3.Connection, topic: str, partitions: int, retention_ms: int, now: int) -> int:
    """Delete, per partition, the records before the first one younger than ``retention_ms``.

    Like Kafka, retention moves the log start forward: a young record keeps the older
    records behind it even if their own timestamps have expired. Returns the count deleted.
    """
    tid = topic_id(conn, topic)
    deleted = 0
    for partition in range(partitions):
        keep_from = _first_offset(conn, topic, partition, now - retention_ms)
        deleted += conn.execute(
            "DELETE FROM records WHERE topic_id = ? AND partition = ? AND offset < ?", (tid, partition, keep_from)
        ).rowcount
    return deleted
