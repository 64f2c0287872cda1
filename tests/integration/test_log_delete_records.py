"""``Log.delete_records`` on every backend: the partition start moves up, nothing else changes."""

from __future__ import annotations

import pytest

from astraflow.core.errors import LogError, TopicNotFoundError
from astraflow.log import Log, TopicPartition, TopicSpec
from tests.integration.test_log_conformance import drain


def test_delete_records_moves_the_start_and_keeps_offsets(log: Log, unique: str) -> None:
    topic = f"conformance.trim.{unique}"
    log.create_topic(TopicSpec(topic, partitions=2))
    with log.producer() as producer:
        for i in range(10):
            producer.send(topic, f"a{i}".encode(), partition=0)
            producer.send(topic, f"b{i}".encode(), partition=1)
        producer.flush()
    log.delete_records(topic, {0: 6})
    log.delete_records(topic, {0: 4, 1: 0})  # below the start already: nothing more goes
    assert log.end_offsets(topic) == {0: 10, 1: 10}
    with log.consumer() as late:
        late.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        late.seek_to_beginning()
        got = drain(late, 14)
    assert [m.offset for m in got if m.partition == 0] == list(range(6, 10))
    assert [m.value for m in got if m.partition == 1] == [f"b{i}".encode() for i in range(10)]
    # A reader asking for an offset below the new start resumes at the start. (It is created after
    # the delete: a Kafka consumer prefetches as soon as it is assigned, and records it already
    # holds are delivered even if deleted on the broker meanwhile.)
    with log.consumer() as behind:
        behind.assign([TopicPartition(topic, 0)])
        behind.seek(TopicPartition(topic, 0), 2)
        assert [m.value for m in drain(behind, 4)] == [f"a{i}".encode() for i in range(6, 10)]


def test_delete_records_refuses_what_it_cannot_do(log: Log, unique: str) -> None:
    topic = f"conformance.trimbad.{unique}"
    log.create_topic(TopicSpec(topic, partitions=1))
    with log.producer() as producer:
        producer.send(topic, b"only", partition=0)
        producer.flush()
    with pytest.raises(LogError):
        log.delete_records(topic, {0: 5})  # past the end
    with pytest.raises(LogError):
        log.delete_records(topic, {0: -1})
    with pytest.raises(TopicNotFoundError):
        log.delete_records(f"conformance.nothere.{unique}", {0: 0})
    log.delete_records(topic, {0: 1})
    assert log.end_offsets(topic) == {0: 1}
