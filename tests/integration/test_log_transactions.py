"""Transactions of the Log API (``TransactionalProducer`` in ``astraflow/log/base.py``), on every backend.

Each test runs on ``embedded`` and on ``kafka`` (a real broker shared by the session). What a
reader never sees is shown the deterministic way: a later committed record on the same
partition is read, and nothing from before it but what was committed came first. The crash
test SIGKILLs a process of its own that holds an open transaction; run as a module, this file is
that process:

    python -m tests.integration.test_log_transactions TARGET_JSON OUTPUT_TOPIC INPUT_TOPIC GROUP TXN_ID
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astraflow.core.errors import FencedError, LogError, RecordTooLargeError, TransactionAbortedError
from astraflow.log import Consumer, Log, TopicPartition, TransactionalProducer, open_log
from tests.integration.test_log_conformance import REPO_ROOT, drain, make_topic, pump, wait_until


def fill(log: Log, topic: str, count: int, partitions: int = 1) -> None:
    """``count`` input records per partition, written without a transaction."""
    with log.producer() as producer:
        for partition in range(partitions):
            for i in range(count):
                producer.send(topic, f"in-{partition}-{i}".encode(), partition=partition)
        producer.flush()


def read_through(log: Log, topic: str, last: bytes, timeout: float = 30.0) -> list[bytes]:
    """Every visible value of partition 0 of ``topic`` from the start up to and including ``last``."""
    values: list[bytes] = []
    with log.consumer() as reader:
        reader.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + timeout
        while last not in values:
            if time.monotonic() > deadline:
                pytest.fail(f"{last!r} not read from {topic} within {timeout:.0f}s; read {values}")
            values += [message.value for message in reader.poll(timeout=0.5)]
    return values


def wait_in_log(log: Log, backend: str, topic: str, count: int) -> None:
    """On Kafka the records of an open transaction reach the broker before the commit: wait for
    them, so that what follows meets records the log holds uncommitted, not a client's queue. The
    embedded log writes nothing before the commit, so there is nothing to wait for."""
    if backend == "kafka":
        wait_until(
            lambda: sum(log.end_offsets(topic).values()) >= count,
            30,
            lambda: f"{count} uncommitted records in {topic}: ends {log.end_offsets(topic)}",
        )


def committed(log: Log, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int | None]:
    """The group's committed offsets, asked by a fresh consumer of the group that joins nothing."""
    with log.consumer(group) as asker:
        return asker.committed(partitions)


def test_commit_makes_records_and_offsets_visible_together(log: Log, backend: str, unique: str) -> None:
    source, sink = make_topic(log, unique, "tx-in"), make_topic(log, unique, "tx-out")
    group, tp = f"tx-commit-{unique}", TopicPartition(source, 0)
    fill(log, source, 6)
    with log.consumer(group) as consumer, log.transactional_producer(f"tx-commit-{unique}") as producer:
        consumer.subscribe([source])
        taken = drain(consumer, 3, batch=3)
        assert [m.offset for m in taken] == [0, 1, 2]
        producer.begin()
        for message in taken:
            producer.send(sink, message.value.replace(b"in", b"out"))
        producer.send_offsets(consumer, {tp: taken[-1].offset + 1})
        wait_in_log(log, backend, sink, 3)

        with log.consumer() as reader:
            reader.assign([TopicPartition(sink, 0)])
            assert reader.poll(timeout=1.0) == [], "records of an open transaction were read"
        assert group not in log.group_offsets(), "offsets of an open transaction were committed"

        producer.commit()
    assert read_through(log, sink, b"out-0-2") == [b"out-0-0", b"out-0-1", b"out-0-2"]
    assert committed(log, group, [tp]) == {tp: 3}


def test_abort_makes_neither_records_nor_offsets_visible(log: Log, backend: str, unique: str) -> None:
    source, sink = make_topic(log, unique, "abort-in"), make_topic(log, unique, "abort-out")
    group, tp = f"tx-abort-{unique}", TopicPartition(source, 0)
    fill(log, source, 3)
    with log.consumer(group) as consumer, log.transactional_producer(f"tx-abort-{unique}") as producer:
        consumer.assign([tp])
        producer.begin()
        for i in range(3):
            producer.send(sink, f"aborted-{i}".encode())
        producer.send_offsets(consumer, {tp: 3})
        wait_in_log(log, backend, sink, 3)
        producer.abort()

        producer.begin()  # a later transaction on the same partition: a reader that reaches it passed the aborted one
        producer.send(sink, b"committed")
        producer.commit()
    assert read_through(log, sink, b"committed") == [b"committed"]
    assert committed(log, group, [tp]) == {tp: None}


def child(target: str, sink: str, source: str, group: str, transactional_id: str) -> None:
    """Open a transaction with records and offsets, say so on stdout, then wait to be killed."""
    with open_log(**json.loads(target)) as log:
        consumer = log.consumer(group)
        consumer.assign([TopicPartition(source, 0)])
        producer = log.transactional_producer(transactional_id)
        producer.begin()
        for i in range(3):
            producer.send(sink, f"crashed-{i}".encode())
        producer.send_offsets(consumer, {TopicPartition(source, 0): 3})
        print("open", flush=True)
        sys.stdin.read()  # until the test kills this process


def open_then_kill(log: Log, backend: str, target: dict[str, str], *args: str) -> None:
    """Run ``child(target, *args)`` in a process of its own and SIGKILL it while its transaction is open."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.test_log_transactions", json.dumps(target), *args],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        opened = process.stdout.readline() == b"open\n"
        if opened:
            wait_in_log(log, backend, args[0], 3)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=30)
    assert opened, f"the child never opened its transaction: {stderr.decode()[-2000:]}"
    assert process.returncode == -signal.SIGKILL


@pytest.mark.parametrize("ending", ["closed", "killed"])
def test_a_transaction_never_committed_leaves_nothing_visible(
    log: Log, log_target: dict[str, str], backend: str, unique: str, ending: str
) -> None:
    source, sink = make_topic(log, unique, "crash-in"), make_topic(log, unique, "crash-out")
    group, tid, tp = f"tx-crash-{unique}", f"tx-crash-{unique}", TopicPartition(source, 0)
    fill(log, source, 3)
    if ending == "killed":
        open_then_kill(log, backend, log_target, sink, source, group, tid)
    else:
        with log.consumer(group) as consumer, log.transactional_producer(tid) as producer:
            consumer.assign([tp])
            producer.begin()
            for i in range(3):
                producer.send(sink, f"crashed-{i}".encode())
            producer.send_offsets(consumer, {tp: 3})
            wait_in_log(log, backend, sink, 3)
    with log.transactional_producer(tid) as successor:  # on Kafka this ends the killed one's transaction
        successor.begin()
        successor.send(sink, b"successor")
        successor.commit()
    assert read_through(log, sink, b"successor") == [b"successor"]
    assert committed(log, group, [tp]) == {tp: None}


def test_a_fenced_producer_writes_nothing_more(log: Log, backend: str, unique: str) -> None:
    source, sink = make_topic(log, unique, "fence-in"), make_topic(log, unique, "fence-out")
    group, tid, tp = f"tx-fence-{unique}", f"tx-fence-{unique}", TopicPartition(source, 0)
    fill(log, source, 3)
    with log.consumer(group) as consumer:
        consumer.assign([tp])
        zombie = log.transactional_producer(tid)
        zombie.begin()
        zombie.send(sink, b"zombie-0")
        zombie.send_offsets(consumer, {tp: 1})
        wait_in_log(log, backend, sink, 1)
        with log.transactional_producer(tid) as newer:
            with pytest.raises(FencedError):  # Kafka may learn it from the first send, or at the commit
                zombie.send(sink, b"zombie-1")
                zombie.send_offsets(consumer, {tp: 2})
                zombie.commit()
            for call in (zombie.begin, lambda: zombie.send(sink, b"zombie-2"), zombie.commit, zombie.abort):
                with pytest.raises(FencedError):
                    call()
            zombie.close()

            newer.begin()
            newer.send(sink, b"newer")
            newer.send_offsets(consumer, {tp: 3})
            newer.commit()
    assert read_through(log, sink, b"newer") == [b"newer"]
    assert committed(log, group, [tp]) == {tp: 3}


def test_the_group_resumes_from_offsets_committed_in_a_transaction(log: Log, unique: str) -> None:
    source, sink = make_topic(log, unique, "resume-in", partitions=2), make_topic(log, unique, "resume-out")
    group = f"tx-resume-{unique}"
    partitions = [TopicPartition(source, p) for p in range(2)]
    fill(log, source, 10, partitions=2)
    with log.consumer(group) as first, log.transactional_producer(f"tx-resume-{unique}") as producer:
        first.subscribe([source])
        head = drain(first, 8, batch=4)
        producer.begin()
        for message in head:
            producer.send(sink, message.value)
        positions = {tp: first.position(tp) for tp in partitions}
        producer.send_offsets(first, positions)
        producer.commit()
    assert len(head) == 8 and sum(positions.values()) == 8
    assert committed(log, group, partitions) == positions

    with log.consumer(group) as second:
        second.subscribe([source])
        tail = drain(second, 12)
    assert len(tail) == 12
    for tp in partitions:
        offsets = [m.offset for m in tail if m.partition == tp.partition]
        assert offsets == list(range(positions[tp], 10)), f"{tp} did not resume at {positions[tp]}"


def test_a_record_that_cannot_be_written_aborts_the_whole_transaction(log: Log, unique: str) -> None:
    sink = make_topic(log, unique, "large-out", max_message_bytes=64 * 1024)
    with log.transactional_producer(f"tx-large-{unique}") as producer:
        producer.begin()
        producer.send(sink, b"fits")
        producer.send(sink, os.urandom(128 * 1024))
        with pytest.raises(RecordTooLargeError, match=sink):
            producer.commit()
        committed_value = None
        for attempt in range(2):  # the producer goes on; on Kafka the next transaction may abort once more
            value = f"next-{attempt}".encode()
            producer.begin()
            producer.send(sink, value)
            try:
                producer.commit()
            except TransactionAbortedError:
                continue  # librdkafka's sequence numbers of the refused records: see kafka_transactions step 4
            committed_value = value
            break
    assert committed_value is not None, "no transaction committed after the one that failed"
    assert read_through(log, sink, committed_value) == [committed_value]


def test_calls_out_of_order_are_refused(log: Log, unique: str) -> None:
    sink = make_topic(log, unique, "order-out")
    with log.consumer() as groupless, log.transactional_producer(f"tx-order-{unique}") as producer:
        for call in (lambda: producer.send(sink, b"x"), producer.commit, producer.abort):
            with pytest.raises(LogError, match="open transaction"):
                call()
        producer.begin()
        with pytest.raises(LogError, match="already open"):
            producer.begin()
        with pytest.raises(LogError, match="group_id"):
            producer.send_offsets(groupless, {TopicPartition(sink, 0): 0})
        producer.abort()


def test_embedded_offsets_of_partitions_the_member_lost_abort_the_transaction(tmp_path: Path, unique: str) -> None:
    """Embedded only: its commit checks the member's leases per partition in the committing
    transaction. Kafka checks the group generation the member last saw (KIP-447) when the offsets
    are sent, which a member that polled through the rebalance passes."""
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        source, sink = make_topic(log, unique, "lost-in", partitions=2), make_topic(log, unique, "lost-out")
        group = f"tx-lost-{unique}"
        partitions = [TopicPartition(source, p) for p in range(2)]
        fill(log, source, 2, partitions=2)
        first, second = log.consumer(group, session_timeout_s=30), log.consumer(group, session_timeout_s=30)
        producer: TransactionalProducer = log.transactional_producer(f"tx-lost-{unique}")
        consumers: list[Consumer] = [first, second]
        try:
            first.subscribe([source])
            pump([first], lambda: len(first.assignment()) == 2, 10, "the first member to own both partitions")
            producer.begin()
            producer.send(sink, b"lost")
            producer.send_offsets(first, {tp: 1 for tp in partitions})
            second.subscribe([source])
            pump(consumers, lambda: len(first.assignment()) == 1, 10, "the second member to take a partition")
            with pytest.raises(TransactionAbortedError, match="no longer owns"):
                producer.commit()
            producer.begin()
            producer.send(sink, b"after")
            producer.commit()
            assert read_through(log, sink, b"after") == [b"after"]
            assert log.group_offsets().get(group) is None
        finally:
            for closable in (producer, first, second):
                closable.close()


def test_a_range_reader_reads_ranges_across_commit_markers_and_keeps_no_assignment(
    log: Log, backend: str, unique: str
) -> None:
    """``Consumer.read_range`` on one reader kept for many ranges (the faust runtime's gap reader): each
    range holds exactly the records committed in it, a range of only a commit marker (an offset no
    record stands for on Kafka) is empty, ranges may go backwards, and between ranges the reader
    holds no partition."""
    topic = make_topic(log, unique, "ranges")
    with log.transactional_producer(f"ranges-{unique}") as producer:
        for batch in range(3):
            producer.begin()
            for i in range(5):
                producer.send(topic, f"b{batch}-{i}".encode(), partition=0)
            producer.commit()
    tp = TopicPartition(topic, 0)
    with log.consumer() as full:
        full.assign([tp])
        everything = drain(full, 15)
    offsets = [m.offset for m in everything]
    assert [m.value for m in everything] == [f"b{b}-{i}".encode() for b in range(3) for i in range(5)]
    gaps = [a + 1 for a, b in zip(offsets, offsets[1:]) if b != a + 1]  # commit markers (Kafka only)
    assert len(gaps) == (2 if backend == "kafka" else 0)
    ranges = [(offsets[5], offsets[10]), (offsets[0], offsets[3]), (offsets[3], offsets[14] + 1)]
    ranges += [(gap, gap + 1) for gap in gaps] + [(offsets[0], offsets[0] + 1)]
    with log.range_reader() as reader:
        for start, end in ranges:
            got = list(reader.read_range(tp, start, end))
            assert [m.offset for m in got] == [o for o in offsets if start <= o < end], (start, end)
            assert [m.value for m in got] == [m.value for m in everything if start <= m.offset < end]
            assert reader.assignment() == []


if __name__ == "__main__":
    child(*sys.argv[1:])
