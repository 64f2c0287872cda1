"""What only the Kafka backend has to get right, beyond the shared conformance suite.

- seeks made in subscribe mode before the group has assigned anything (librdkafka refuses them,
  ``KafkaConsumer`` defers them to the assignment);
- topic settings mapped to and from Kafka topic configs, and a compacted topic's active segment
  rolled (``segment_ms``) so that its newest records are compacted too;
- keyed records land where Java clients (Kafka Streams, faust, the console tools) put them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from astraflow.log.base import Consumer, Message, TopicPartition, TopicSpec
from astraflow.log.kafka.log import KafkaLog

pytestmark = pytest.mark.kafka


@pytest.fixture
def kafka_log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    with KafkaLog(kafka_bootstrap) as log:
        yield log


def first_records(consumer: Consumer, count: int, timeout: float = 30.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out += consumer.poll(max_records=count - len(out), timeout=0.5)
    return out


@pytest.mark.parametrize("seek", ["offset", "beginning", "timestamp"])
def test_seek_before_the_group_assigns(kafka_log: KafkaLog, unique: str, seek: str) -> None:
    topic, group = f"kafka.seek.{unique}", f"kafka-seek-{unique}"
    tp = TopicPartition(topic, 0)
    kafka_log.create_topic(TopicSpec(topic))
    base = int(time.time() * 1000) - 60_000
    with kafka_log.producer() as producer:
        for i in range(10):
            producer.send(topic, f"v{i}".encode(), timestamp_ms=base + i * 1000)
        producer.flush()
    with kafka_log.consumer(group) as committer:
        committer.assign([tp])
        committer.commit({tp: 8})

    expected = {"offset": 3, "beginning": 0, "timestamp": 4}[seek]
    with kafka_log.consumer(group) as consumer:
        consumer.subscribe([topic])
        assert consumer.assignment() == []
        if seek == "offset":
            consumer.seek(tp, 3)
        elif seek == "beginning":
            consumer.seek_to_beginning()
        else:
            consumer.seek_to_timestamp(base + 3_500)
        assert [m.offset for m in first_records(consumer, 10 - expected)] == list(range(expected, 10))
        assert consumer.position(tp) == 10


@pytest.mark.parametrize(
    "spec",
    [
        TopicSpec("compacted", partitions=1, compacted=True, max_message_bytes=1024 * 1024),
        TopicSpec("changelog", partitions=1, compacted=True, segment_ms=60_000),
        TopicSpec("retained", partitions=2, retention_ms=3_600_000),
        TopicSpec("forever", partitions=3, retention_ms=None, max_message_bytes=10 * 1024 * 1024),
    ],
)
def test_topic_spec_round_trips(kafka_log: KafkaLog, unique: str, spec: TopicSpec) -> None:
    named = dataclasses.replace(spec, name=f"kafka.spec.{spec.name}.{unique}")
    kafka_log.create_topic(named)
    assert kafka_log.describe_topic(named.name) == named


def test_a_compacted_topic_that_rolls_its_segment_keeps_only_new_values(kafka_log: KafkaLog, unique: str) -> None:
    """Kafka never compacts the active segment: without ``segment_ms`` a changelog written all the
    time would keep every value it ever had, which a restarted stream processor reads through.
    Writes go on (50 values of key ``k`` per poll) until the segment rolled and the cleaner removed at
    least 50 old values: a roll by time can fall inside a batch, so the first pass of the cleaner may
    remove fewer than one batch, and the next roll removes more."""
    topic = f"kafka.rolled.{unique}"
    kafka_log.create_topic(TopicSpec(topic, compacted=True, segment_ms=1000))
    tp = TopicPartition(topic, 0)
    written = 0
    deadline = time.monotonic() + 120
    with kafka_log.producer() as producer, kafka_log.consumer() as reader:
        while True:
            for _ in range(50):
                producer.send(topic, f"v{written}".encode(), key=b"k", partition=0)
                written += 1
            producer.flush()
            reader.assign([tp])
            reader.seek(tp, 0)
            values = [m.value for m in first_records(reader, written, timeout=2.0)]
            if len(values) <= written - 50:  # compacted: at least a batch of old values is gone
                break
            assert time.monotonic() < deadline, f"{written - len(values)} of {written} values compacted within 120 s"
    assert values[-1] == f"v{written - 1}".encode()
    kept = [int(v.decode()[1:]) for v in values]
    assert kept == sorted(set(kept)), "compaction keeps the surviving values once each, in the order written"


def test_an_empty_value_is_a_tombstone_read_as_empty(kafka_log: KafkaLog, kafka_bootstrap: str, unique: str) -> None:
    """An empty value goes to Kafka as a null value - a tombstone, which the broker's cleaner removes with
    its key from a compacted topic - and the Log API reads it back as an empty value."""
    from confluent_kafka import Consumer as RawConsumer
    from confluent_kafka import TopicPartition as RawPartition

    topic = f"kafka.tombstone.{unique}"
    kafka_log.create_topic(TopicSpec(topic, compacted=True))
    with kafka_log.producer() as producer:
        producer.send(topic, b"turn 1", key=b"episode", partition=0)
        producer.send(topic, b"", key=b"episode", partition=0)
    with kafka_log.consumer() as reader:
        reader.assign([TopicPartition(topic, 0)])
        assert [m.value for m in first_records(reader, 2)] == [b"turn 1", b""]
    raw = RawConsumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"raw-{unique}", "enable.auto.commit": False})
    try:
        raw.assign([RawPartition(topic, 0, 0)])
        values = []
        deadline = time.monotonic() + 30
        while len(values) < 2 and time.monotonic() < deadline:
            message = raw.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
        assert values == [b"turn 1", None]
    finally:
        raw.close()


def java_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition for a key: ``toPositive(murmur2(key)) % partitions``."""
    m, seed, mask = 0x5BD1E995, 0x9747B28C, 0xFFFFFFFF
    h = (seed ^ len(key)) & mask
    body = len(key) - len(key) % 4
    for i in range(0, body, 4):
        k = (int.from_bytes(key[i : i + 4], "little") * m) & mask
        k = ((k ^ (k >> 24)) * m) & mask
        h = ((h * m) & mask) ^ k
    for shift, byte in reversed(list(enumerate(key[body:]))):
        h ^= byte << (8 * shift)
    if len(key) % 4:
        h = (h * m) & mask
    h = ((h ^ (h >> 13)) * m) & mask
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def test_keyed_records_land_where_java_clients_put_them(kafka_log: KafkaLog, unique: str) -> None:
    topic = f"kafka.murmur2.{unique}"
    kafka_log.create_topic(TopicSpec(topic, partitions=6))
    keys = [f"group-{i}".encode() for i in range(40)] + [b"a", b"ab", b"abc"]
    with kafka_log.producer() as producer:
        for key in keys:
            producer.send(topic, b"x", key=key)
        producer.flush()
    with kafka_log.consumer() as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(6)])
        landed = {m.key: m.partition for m in first_records(consumer, len(keys))}
    assert landed == {key: java_partition(key, 6) for key in keys}
