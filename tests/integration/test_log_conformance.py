"""The Log contract (``astraflow/log/base.py``), checked the same way on every backend.

Each test runs once on ``embedded`` and once on ``kafka`` (a real broker shared by the session,
hence the ``unique`` suffix on every topic and group). Waits are on conditions with deadlines,
never fixed sleeps; the group test runs its members as separate processes and SIGKILLs one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from astraflow.core.errors import DeliveryError, LogError, RecordTooLargeError, TopicNotFoundError
from astraflow.log import Consumer, Log, Message, TopicPartition, TopicSpec

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_topic(log: Log, unique: str, name: str, **settings: object) -> str:
    topic = f"conformance.{name}.{unique}"
    log.create_topic(TopicSpec(topic, **settings))  # type: ignore[arg-type]
    return topic


def drain(consumer: Consumer, count: int, timeout: float = 30.0, batch: int = 500) -> list[Message]:
    """Poll until ``count`` records arrived (fewer only when the deadline passes first)."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out += consumer.poll(max_records=min(batch, count - len(out)), timeout=0.5)
    return out


def wait_until(condition: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout:.0f}s: {what()}")
        time.sleep(0.05)


def pump(consumers: list[Consumer], until: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll every consumer in turn (group protocols need all members polling) until ``until()``."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            pytest.fail(
                f"not reached within {timeout:.0f}s: {what}; assignments "
                f"{[sorted(tp.partition for tp in c.assignment()) for c in consumers]}"
            )
        for consumer in consumers:
            consumer.poll(max_records=1, timeout=0.1)


def test_topic_admin(log: Log, unique: str) -> None:
    spec = TopicSpec(
        f"conformance.admin.{unique}", partitions=3, retention_ms=86_400_000, max_message_bytes=2 * 1024 * 1024
    )
    log.create_topic(spec)
    log.create_topic(spec, exist_ok=True)
    with pytest.raises(LogError):
        log.create_topic(spec, exist_ok=False)
    assert log.describe_topic(spec.name) == spec
    assert spec.name in log.list_topics()
    assert log.list_topics() == sorted(log.list_topics())
    assert log.end_offsets(spec.name) == {0: 0, 1: 0, 2: 0}
    log.delete_topic(spec.name)
    assert spec.name not in log.list_topics()
    with pytest.raises(TopicNotFoundError):
        log.describe_topic(spec.name)


def test_partitions_honoured_and_order_kept_per_key(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "order", partitions=4)
    keys = [f"key-{k}" for k in range(20)]
    with log.producer() as producer:
        for seq in range(10):
            for key in keys:
                producer.send(topic, f"{key}:{seq}".encode(), key=key.encode())
        producer.send(topic, b"pinned", partition=2)
        producer.flush()
    ends = log.end_offsets(topic)
    assert sorted(ends) == [0, 1, 2, 3] and sum(ends.values()) == 201
    assert log.describe_topic(topic).partitions == 4

    with log.consumer() as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(4)])
        messages = drain(consumer, 201)
    assert len(messages) == 201
    pinned = [m for m in messages if m.value == b"pinned"]
    assert [m.partition for m in pinned] == [2]
    by_key: dict[bytes, list[Message]] = {}
    for message in messages:
        if message.key is not None:
            by_key.setdefault(message.key, []).append(message)
    for key, records in by_key.items():
        assert len({m.partition for m in records}) == 1, f"{key!r} spread over partitions"
        assert [int(m.value.split(b":")[1]) for m in records] == list(range(10)), f"{key!r} out of order"
    assert len({m.partition for m in messages}) > 1


def test_commit_and_resume_in_the_same_group(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "resume", partitions=2)
    group = f"conformance-resume-{unique}"
    with log.producer() as producer:
        for i in range(30):
            producer.send(topic, f"r{i}".encode(), partition=i % 2)
        producer.flush()

    with log.consumer(group) as first:
        first.subscribe([topic])
        head = drain(first, 10, batch=5)
        first.commit()
        committed = first.committed([TopicPartition(topic, p) for p in range(2)])
    assert len(head) >= 10
    for p in range(2):
        offsets = [m.offset for m in head if m.partition == p]
        assert committed[TopicPartition(topic, p)] == (max(offsets) + 1 if offsets else None)

    with log.consumer(group) as second:
        second.subscribe([topic])
        assert second.committed(list(committed)) == committed
        tail = drain(second, 30 - len(head))
    seen = [(m.partition, m.offset) for m in head + tail]
    assert len(seen) == len(set(seen)) == 30, "the second member re-read or skipped records"
    for p in range(2):
        offsets = [m.offset for m in tail if m.partition == p]
        assert not offsets or min(offsets) == (committed[TopicPartition(topic, p)] or 0)

    with log.consumer(group) as replayer:
        replayer.subscribe([topic])
        replayer.seek_to_beginning()
        again = drain(replayer, 30)
    assert sorted((m.partition, m.offset) for m in again) == sorted(seen), "seek after subscribe ignored"


def test_replay_from_beginning_offset_and_timestamp(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "replay", partitions=1)
    tp = TopicPartition(topic, 0)
    base = int(time.time() * 1000) - 60_000
    with log.producer() as producer:
        for i in range(10):
            producer.send(topic, f"v{i}".encode(), timestamp_ms=base + i * 1000)
        producer.flush()

        with log.consumer() as consumer:
            consumer.assign([tp])
            assert [m.timestamp_ms for m in drain(consumer, 10)] == [base + i * 1000 for i in range(10)]
            consumer.seek_to_beginning()
            assert [m.offset for m in drain(consumer, 10)] == list(range(10))
            consumer.seek_to_timestamp(base + 5_500)
            assert consumer.position(tp) == 6
            assert [m.value for m in drain(consumer, 4)] == [b"v6", b"v7", b"v8", b"v9"]
            consumer.seek(tp, 3)
            assert [m.offset for m in drain(consumer, 7)] == list(range(3, 10))
            consumer.seek_to_end()
            assert consumer.poll(timeout=0.3) == []
            producer.send(topic, b"fresh")
            producer.flush()
            assert [(m.offset, m.value) for m in drain(consumer, 1)] == [(10, b"fresh")]


def test_lag_follows_position(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "lag", partitions=2)
    partitions = [TopicPartition(topic, p) for p in range(2)]
    with log.producer() as producer:
        for i in range(10):
            producer.send(topic, b"x", partition=i % 2)
        producer.flush()

    with log.consumer(f"conformance-lag-{unique}") as consumer:
        consumer.assign(partitions)
        assert consumer.lag() == {partitions[0]: 5, partitions[1]: 5}
        assert len(drain(consumer, 4, batch=4)) == 4
        ends = log.end_offsets(topic)
        lag = consumer.lag()
        assert sum(lag.values()) == 6
        assert lag == {tp: ends[tp.partition] - consumer.position(tp) for tp in partitions}
        assert len(drain(consumer, 6)) == 6
        assert consumer.lag() == {partitions[0]: 0, partitions[1]: 0}
        consumer.commit()
        assert consumer.committed(partitions) == {partitions[0]: 5, partitions[1]: 5}


def test_close_hands_partitions_over_at_once(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "handover", partitions=4)
    group = f"conformance-handover-{unique}"
    first, second = log.consumer(group, session_timeout_s=30), log.consumer(group, session_timeout_s=30)
    try:
        first.subscribe([topic])
        second.subscribe([topic])
        pump(
            [first, second],
            lambda: len(first.assignment()) == len(second.assignment()) == 2,
            30,
            "both members to own 2 of the 4 partitions",
        )
        assert not set(first.assignment()) & set(second.assignment())
        second.close()
        pump(
            [first],
            lambda: len(first.assignment()) == 4,
            10,
            "the remaining member to own all partitions well before the 30 s session timeout",
        )
    finally:
        first.close()
        second.close()


class Member:
    """A ``group_member`` process and the JSON lines it writes."""

    def __init__(
        self, name: str, tmp_path: Path, target: dict[str, str], topic: str, group: str, session_s: float
    ) -> None:
        self.name = name
        self.out = tmp_path / f"{name}.jsonl"
        self.stderr = tmp_path / f"{name}.stderr"
        with self.stderr.open("wb") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.group_member",
                    json.dumps(target),
                    topic,
                    group,
                    str(session_s),
                    str(self.out),
                ],
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def events(self) -> list[dict]:
        if not self.out.exists():
            return []
        lines = self.out.read_text().split("\n")[:-1]
        return [json.loads(line) for line in lines]

    def assignment(self) -> list[int] | None:
        found = [event["assignment"] for event in self.events() if "assignment" in event]
        return found[-1] if found else None

    def consumed(self) -> set[str]:
        return {value for event in self.events() for _, _, value in event.get("records", [])}

    def describe(self) -> str:
        alive = "alive" if self.process.poll() is None else f"exited {self.process.returncode}"
        return f"{self.name} ({alive}) owns {self.assignment()}; stderr: {self.stderr.read_text()[-2000:]!r}"

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def test_group_members_in_processes_split_and_survivor_takes_over(
    log: Log, log_target: dict[str, str], backend: str, unique: str, tmp_path: Path
) -> None:
    session_s = 6.0 if backend == "kafka" else 2.0
    topic = make_topic(log, unique, "takeover", partitions=4)
    group = f"conformance-takeover-{unique}"

    def produce(phase: str) -> set[str]:
        values = {f"{phase}-{p}-{i}": p for p in range(4) for i in range(10)}
        with log.producer() as producer:
            for value, partition in values.items():
                producer.send(topic, value.encode(), partition=partition)
            producer.flush()
        return set(values)

    before = produce("before")
    victim = Member("victim", tmp_path, log_target, topic, group, session_s)
    survivor = Member("survivor", tmp_path, log_target, topic, group, session_s)
    members = [victim, survivor]
    status = lambda: "; ".join(member.describe() for member in members)  # noqa: E731
    try:

        def split() -> bool:
            owned = [member.assignment() or [] for member in members]
            return all(len(parts) == 2 for parts in owned) and sorted(owned[0] + owned[1]) == [0, 1, 2, 3]

        wait_until(split, 60, lambda: f"both members to own 2 of the 4 partitions: {status()}")
        wait_until(
            lambda: before <= victim.consumed() | survivor.consumed(),
            30,
            lambda: f"the members to read every record produced before: {status()}",
        )
        victim.kill()
        after = produce("after")
        wait_until(
            lambda: survivor.assignment() == [0, 1, 2, 3],
            3 * session_s + 20,
            lambda: f"the survivor to own every partition after the kill: {status()}",
        )
        wait_until(
            lambda: after <= survivor.consumed(),
            30,
            lambda: (
                f"the survivor to read every record produced after the kill "
                f"({len(after - survivor.consumed())} missing): {status()}"
            ),
        )
    finally:
        for member in members:
            member.kill()


def test_large_record_round_trips(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "large", partitions=1, max_message_bytes=10 * 1024 * 1024)
    value = os.urandom(8 * 1024 * 1024)
    with log.producer() as producer:
        producer.send(topic, value, key=b"big", headers=[("kind", b"weights")])
        producer.flush()
    with log.consumer() as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        (message,) = drain(consumer, 1)
    assert (message.key, message.headers, len(message.value)) == (b"big", (("kind", b"weights"),), len(value))
    assert message.value == value


def test_delivery_errors_surface_from_flush(log: Log, unique: str) -> None:
    missing = f"conformance.missing.{unique}"
    topic = make_topic(log, unique, "small", partitions=1, max_message_bytes=64 * 1024)
    with log.producer() as producer:
        with pytest.raises(DeliveryError, match=missing):
            producer.send(missing, b"lost")
            producer.flush(timeout=20)
        with pytest.raises(RecordTooLargeError, match=topic):
            producer.send(topic, os.urandom(128 * 1024))
            producer.flush(timeout=20)
        producer.send(topic, b"fits")
        producer.flush()
    assert log.end_offsets(topic) == {0: 1}


def test_settled_at_a_mark_means_every_record_sent_before_it_is_written(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "marked", partitions=2)
    with log.producer() as producer:
        for i in range(40):
            producer.send(topic, os.urandom(1024), key=str(i).encode())
        mark = producer.mark()
        for i in range(40):
            producer.send(topic, os.urandom(1024), key=str(i).encode())  # after the mark: may still be in flight
        deadline = time.monotonic() + 30
        while not producer.settled(mark):
            assert time.monotonic() < deadline, "sends before the mark never acknowledged"
            time.sleep(0.01)
        ends = log.end_offsets(topic)
        assert sum(ends.values()) >= 40


def test_settled_tells_when_sends_are_acknowledged_and_raises_their_errors(log: Log, unique: str) -> None:
    topic = make_topic(log, unique, "settled", partitions=1, max_message_bytes=64 * 1024)
    with log.producer() as producer:
        assert producer.settled()  # nothing sent
        for i in range(50):
            producer.send(topic, os.urandom(1024), key=str(i).encode())  # 50 kB: one batch fits the topic
        deadline = time.monotonic() + 30
        while not producer.settled():  # Kafka: not blocking, true once the broker acknowledged all 50
            assert time.monotonic() < deadline, "sends never acknowledged"
            time.sleep(0.01)
        with log.consumer() as consumer:  # settled means written: every record is there to read
            consumer.assign([TopicPartition(topic, 0)])
            assert len(drain(consumer, 50)) == 50
        producer.send(topic, os.urandom(128 * 1024))
        with pytest.raises(RecordTooLargeError, match=topic):
            deadline = time.monotonic() + 30
            while not producer.settled():
                assert time.monotonic() < deadline, "the failure was never reported"
                time.sleep(0.01)


def test_a_seek_right_after_assign_holds(log: Log, unique: str) -> None:
    """Partitions assigned and sought at once are read from the sought offsets, never from where the
    assignment alone would start (the beginning, the group's committed offset): on Kafka that start is
    looked up after the seek and could undo it (librdkafka issue 2256). As a late weights follower
    does: read one partition, then assign it with a second and seek both."""
    topic = make_topic(log, unique, "seekassign", partitions=2)
    first, second = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with log.producer() as producer:
        for i in range(20):
            producer.send(topic, f"v{i}".encode(), partition=i % 2)
        producer.flush()
    group = f"conformance-seekassign-{unique}"
    with log.consumer(group) as committer:
        committer.assign([first, second])
        committer.commit({first: 9, second: 9})
    starts = []
    for round_ in range(10):
        for group_id in (None, group):  # the beginning or the committed 9 would be wrong
            with log.consumer(group_id) as consumer:
                consumer.assign([first])
                consumer.seek(first, 2)
                drain(consumer, 8)
                consumer.assign([first, second])
                consumer.seek(first, 5)
                consumer.seek(second, 7)
                assert (consumer.position(first), consumer.position(second)) == (5, 7)
                got = drain(consumer, 8)
                starts.append((round_, group_id is not None, sorted({(m.partition, m.offset) for m in got})))
    wanted = sorted({(0, o) for o in range(5, 10)} | {(1, o) for o in range(7, 10)})
    assert starts == [(r, grouped, wanted) for r in range(10) for grouped in (False, True)]
