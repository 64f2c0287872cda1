"""``Log.group_offsets``: every group's committed offsets, read without joining — on both backends."""

from __future__ import annotations

from astraflow.log import Log, TopicPartition, TopicSpec
from tests.integration.test_log_conformance import drain


def test_group_offsets_lists_committed_groups_only(log: Log, unique: str) -> None:
    topic = f"groups.offsets.{unique}"
    log.create_topic(TopicSpec(topic, partitions=2))
    with log.producer() as producer:
        for i in range(6):
            producer.send(topic, b"x", partition=i % 2)
        producer.flush()
    group = f"groups-{unique}"
    with log.consumer(group_id=group) as member:
        member.subscribe([topic])
        assert len(drain(member, 6)) == 6
        member.commit({TopicPartition(topic, 0): 3, TopicPartition(topic, 1): 2})
    with log.consumer() as reader:
        reader.assign([TopicPartition(topic, 0)])
        assert len(drain(reader, 3)) == 3
    before = log.group_offsets()
    assert before[group] == {TopicPartition(topic, 0): 3, TopicPartition(topic, 1): 2}
    assert all(topic not in {tp.topic for tp in offsets} for name, offsets in before.items() if name != group)
    assert log.group_offsets()[group] == before[group]
