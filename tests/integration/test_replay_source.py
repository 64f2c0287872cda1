"""Offline replay's source on both backends: a live source topic is copied byte for byte up to the
end planned at start, and the source's consumer group keeps its committed offsets."""

from __future__ import annotations

import threading
from pathlib import Path

from astraflow.infra.launch.replay_source import ORIGIN_HEADER, ReplaySource, plan_span
from astraflow.log import Log, TopicPartition, TopicSpec, open_log
from tests.integration.test_log_conformance import drain


def test_copy_of_a_live_topic_stops_at_the_planned_end(log: Log, unique: str, tmp_path: Path) -> None:
    topic = f"src{unique}.trajectories.main"
    log.create_topic(TopicSpec(topic, partitions=2))
    with log.producer() as producer:
        for i in range(10):
            producer.send(topic, f"record {i}".encode(), key=f"group {i % 3}".encode())
        producer.flush()
    group = f"src{unique}.stream.main"
    with log.consumer(group_id=group) as member:
        member.subscribe([topic])
        drain(member, 10)
        member.commit({TopicPartition(topic, p): end - 1 for p, end in log.end_offsets(topic).items()})
    before = log.group_offsets()[group]

    span = plan_span(log, topic)
    with log.producer() as producer:  # the source run goes on appending
        producer.send(topic, b"later", key=b"group 0")
        producer.flush()
    with open_log("embedded", path=tmp_path / "target.sqlite") as target:
        target.create_topic(TopicSpec("new.trajectories.main", partitions=2))
        copier = ReplaySource(log, span, target, "new.trajectories.main")
        copier.run(threading.Event())
        with target.consumer() as reader:
            reader.assign([TopicPartition("new.trajectories.main", p) for p in range(2)])
            copies = drain(reader, 10)
        assert sum(target.end_offsets("new.trajectories.main").values()) == 10  # not the later record
    assert copier.finished.is_set() and copier.copied == span.total == 10
    assert sorted(m.value for m in copies) == sorted(f"record {i}".encode() for i in range(10))
    assert all(m.key == f"group {int(m.value.split()[1]) % 3}".encode() for m in copies)
    assert all(dict(m.headers)[ORIGIN_HEADER].decode().startswith(f"{topic}/") for m in copies)
    assert log.group_offsets()[group] == before
