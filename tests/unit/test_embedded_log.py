"""What only the embedded backend promises, or what is too slow to see on Kafka: assignment,
header packing, retention, compaction, commit fencing and concurrent writers."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from astraflow.core.errors import LogError
from astraflow.log import TopicPartition, TopicSpec
from astraflow.log.embedded import store as embedded_store
from astraflow.log.embedded.compaction import TOMBSTONE_RETENTION_MS
from astraflow.log.embedded.groups import assign_round_robin
from astraflow.log.embedded.log import EmbeddedLog
from astraflow.log.embedded.store import WAL_SIZE_LIMIT_BYTES, Checkpointer, now_ms, pack_headers, unpack_headers


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    with EmbeddedLog(tmp_path / "log.sqlite") as opened:
        yield opened


def read_all(log: EmbeddedLog, topic: str, partitions: int = 1) -> list[tuple[int, bytes | None, bytes]]:
    with log.consumer() as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        return [(m.offset, m.key, m.value) for m in consumer.poll(timeout=0)]


@pytest.mark.parametrize(
    ("members", "partitions", "expected"),
    [
        ({"a": ["t"]}, {"t": 3}, {"a": [("t", 0), ("t", 1), ("t", 2)]}),
        ({"b": ["t"], "a": ["t"]}, {"t": 4}, {"a": [("t", 0), ("t", 2)], "b": [("t", 1), ("t", 3)]}),
        ({"a": ["x", "y"], "b": ["x", "y"]}, {"x": 1, "y": 1}, {"a": [("x", 0)], "b": [("y", 0)]}),
        ({"a": ["x"], "b": ["y"]}, {"x": 2, "y": 1}, {"a": [("x", 0), ("x", 1)], "b": [("y", 0)]}),
        ({"a": ["t"], "b": ["t"]}, {}, {"a": [], "b": []}),
    ],
)
def test_assignment_is_a_function_of_members_and_partitions(
    members: dict[str, list[str]], partitions: dict[str, int], expected: dict[str, list[tuple[str, int]]]
) -> None:
    shares = assign_round_robin(members, partitions)
    assert shares == {m: [TopicPartition(t, p) for t, p in tps] for m, tps in expected.items()}


@pytest.mark.parametrize("headers", [(), (("a", b"1"),), (("trace-id", b""), ("é", b"\x00" * 300))])
def test_headers_round_trip(headers: tuple[tuple[str, bytes], ...]) -> None:
    assert unpack_headers(pack_headers(headers)) == headers


def test_retention_moves_the_log_start(log: EmbeddedLog) -> None:
    log.create_topic(TopicSpec("kept", retention_ms=60_000))
    now = now_ms()
    with log.producer() as producer:
        for age_ms in (600_000, 300_000, 1_000, 700_000, 0):
            producer.send("kept", str(age_ms).encode(), timestamp_ms=now - age_ms)
    assert [offset for offset, _, _ in read_all(log, "kept")] == [2, 3, 4]
    assert log.end_offsets("kept") == {0: 5}


def test_compaction_keeps_the_newest_record_per_key(log: EmbeddedLog) -> None:
    log.create_topic(TopicSpec("schemas", compacted=True))
    with log.producer() as producer:
        for key, value in [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (None, b"n"), (b"a", b"4")]:
            producer.send("schemas", value, key=key)
    assert read_all(log, "schemas") == [(1, b"b", b"2"), (3, None, b"n"), (4, b"a", b"4")]


def test_a_tombstone_removes_its_key_at_once_and_itself_after_a_day(
    log: EmbeddedLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.create_topic(TopicSpec("episodes", compacted=True))
    start = now_ms()
    with log.producer() as producer:
        for key, value in [(b"a", b"turn 1"), (b"b", b"turn 1"), (b"a", b"turn 2"), (b"a", b"")]:
            producer.send("episodes", value, key=key, timestamp_ms=start)
    assert read_all(log, "episodes") == [(1, b"b", b"turn 1"), (3, b"a", b"")]  # the tombstone still readable
    monkeypatch.setattr(embedded_store, "now_ms", lambda: start + TOMBSTONE_RETENTION_MS + 1)
    with log.producer() as producer:
        producer.send("episodes", b"turn 1", key=b"c", timestamp_ms=start)  # the next append compacts
    assert read_all(log, "episodes") == [(1, b"b", b"turn 1"), (4, b"c", b"turn 1")]


def test_commit_of_a_partition_that_moved_or_of_an_old_generation_is_rejected(log: EmbeddedLog) -> None:
    log.create_topic(TopicSpec("work", partitions=2))
    first, second = log.consumer("g"), log.consumer("g")
    try:
        first.subscribe(["work"])
        assert len(first.assignment()) == 2
        second.subscribe(["work"])
        moved = second.assignment()
        assert len(moved) == 1
        held = first.assignment()
        with pytest.raises(LogError, match="rejected"):  # the group changed since first's last poll: nothing
            first.commit({tp: 1 for tp in held})
        kept = [tp for tp in held if tp not in moved]
        assert first.committed(kept + moved) == {kept[0]: None, moved[0]: None}
        first.poll(timeout=0)  # sees the new generation: keeps one partition
        assert first.assignment() == kept
        with pytest.raises(LogError, match="rejected"):  # the moved one still refused, the kept one written
            first.commit({tp: 1 for tp in held})
        assert first.committed(kept + moved) == {kept[0]: 1, moved[0]: None}
    finally:
        first.close()
        second.close()


def test_concurrent_producers_get_contiguous_offsets(log: EmbeddedLog) -> None:
    log.create_topic(TopicSpec("busy"))

    def write(worker: int) -> None:
        with log.producer() as producer:
            for batch in range(20):
                for i in range(50):
                    producer.send("busy", f"{worker}-{batch}-{i}".encode())
                producer.flush()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with log.consumer() as consumer:
        consumer.assign([TopicPartition("busy", 0)])
        offsets = [m.offset for m in consumer.poll(max_records=10_000, timeout=0)]
    assert offsets == list(range(4000))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (TopicSpec("bad name"), "topic name"),
        (TopicSpec("t", partitions=0), "partitions"),
        (TopicSpec("t", retention_ms=0), "retention_ms"),
        (TopicSpec("t", max_message_bytes=0), "max_message_bytes"),
    ],
)
def test_invalid_topic_specs_name_the_field(log: EmbeddedLog, spec: TopicSpec, message: str) -> None:
    with pytest.raises(LogError, match=message):
        log.create_topic(spec)


def _write_big(log: EmbeddedLog, topic: str, count: int) -> None:
    with log.producer() as producer:
        for _ in range(count):
            producer.send(topic, bytes(4 * 1024 * 1024), partition=0)
            producer.flush()


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def checkpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Who ran each checkpoint of this test's ``log.sqlite``: ``thread`` (the Checkpointer's) or
    ``writer`` (checkpointer threads of earlier tests' logs live on in this process: not counted)."""
    calls: list[str] = []
    real = embedded_store.checkpoint

    def recording(path: Path, conn=None) -> None:
        if Path(path) == tmp_path / "log.sqlite":
            calls.append("writer" if conn is not None else "thread")
        real(path, conn)

    monkeypatch.setattr(embedded_store, "checkpoint", recording)
    return calls


def test_the_checkpointer_thread_runs_after_big_writes_not_the_writer(tmp_path: Path, checkpoints: list[str]) -> None:
    with EmbeddedLog(tmp_path / "log.sqlite") as log:
        log.create_topic(TopicSpec("big", partitions=1, max_message_bytes=8 * 1024 * 1024))
        _write_big(log, "big", 3)  # 12 MiB: past CHECKPOINT_WAL_BYTES, not past WAL_SIZE_LIMIT_BYTES
        deadline = time.monotonic() + 30
        while "thread" not in checkpoints:
            assert time.monotonic() < deadline, "no checkpoint 30 s after 12 MiB of writes"
            time.sleep(0.02)
        assert "writer" not in checkpoints
        assert log.end_offsets("big") == {0: 3}
    assert _integrity(tmp_path / "log.sqlite") == "ok"


def test_writers_checkpoint_themselves_when_the_thread_falls_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoints: list[str]
) -> None:
    monkeypatch.setattr(Checkpointer, "_run", lambda self: None)  # a thread that never checkpoints
    with EmbeddedLog(tmp_path / "log.sqlite") as log:
        log.create_topic(TopicSpec("big", partitions=1, max_message_bytes=8 * 1024 * 1024))
        _write_big(log, "big", 24)  # 96 MiB
        assert checkpoints and set(checkpoints) == {"writer"}
        assert len(checkpoints) <= 24 * 4 * 1024 * 1024 // WAL_SIZE_LIMIT_BYTES  # once per 64 MiB, not per write
        assert log.end_offsets("big") == {0: 24}
    assert _integrity(tmp_path / "log.sqlite") == "ok"


def _hammer(path: str, worker: int) -> None:
    """Big and small records, commits and reads from one process, as a run's components do."""
    with EmbeddedLog(Path(path)) as log:
        with log.producer() as producer, log.consumer(group_id=f"g{worker}") as consumer:
            consumer.subscribe(["mixed"])
            for i in range(60):
                producer.send("mixed", bytes(512 * 1024 if i % 5 == 0 else 300), key=f"{worker}".encode())
                if i % 3 == 0:
                    producer.flush()
                    consumer.poll(max_records=50, timeout=0)
                    consumer.commit()
            producer.flush()


def test_processes_writing_big_and_small_records_leave_an_intact_log(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with EmbeddedLog(path) as log:
        log.create_topic(TopicSpec("mixed", partitions=2, max_message_bytes=1024 * 1024))
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_hammer, args=(str(path), w)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]
    assert _integrity(path) == "ok"
    with EmbeddedLog(path) as log:
        assert sum(log.end_offsets("mixed").values()) == 180
