"""Weight versions on each backend: retention of the last versions, and chunks above the broker's default size."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from astraflow.config import WeightsConfig
from astraflow.log import Log, TopicPartition
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION, MiB, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.follow import WeightFollower
from astraflow.weights.payload import to_transfer
from astraflow.weights.publish import WeightPublisher
from tests.unit.test_weight_delta import assert_bit_exact, perturbed, random_state
from tests.unit.watched_log import WatchedLog


def retained(log: Log, topic: str, partition: int) -> list[WeightChunk]:
    """Every record still on one partition of a weights topic, oldest first."""
    end = log.end_offsets(topic)[partition]
    codec, out = Codec(), []
    with log.consumer() as consumer:
        consumer.assign([TopicPartition(topic, partition)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 30
        while consumer.position(TopicPartition(topic, partition)) < end and time.monotonic() < deadline:
            out += [codec.decode(m.value, expect=WeightChunk) for m in consumer.poll(max_records=100, timeout=0.5)]
    return out


@pytest.mark.parametrize("transport", ["inline", "store"])
def test_retention_keeps_the_last_versions_and_the_full_one_they_need(
    log: Log, unique: str, tmp_path: Path, transport: str
) -> None:
    topics = RunTopics(f"keep{unique}", "math", ("main",))
    topics.ensure(log, partitions=1)
    topic = topics.weights("main")
    store = tmp_path / "store"
    config = WeightsConfig(
        keep_versions=2,
        full_sync_interval=3,
        chunk_bytes=8192,
        transport=transport,
        store=str(store) if transport == "store" else None,
    )
    states = [perturbed(random_state(1), 0.02, seed=v) for v in range(8)]
    kept = []
    with log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), topic, "main", config, log=log)
        for version, state in enumerate(states):  # full 0, 1, 2, full 3, 4, 5, full 6, 7
            publisher.publish(state, version)
            kept.append([m.version for m in retained(log, topic, WEIGHTS_MANIFEST_PARTITION)])
    assert kept[2] == [0, 1, 2]  # keeps 1 and 2, which need the full version 0
    assert kept[4] == [3, 4]
    assert kept[5] == [3, 4, 5]
    assert kept[7] == [6, 7]
    chunks = {m.version for m in retained(log, topic, WEIGHTS_CHUNK_PARTITION)}
    assert chunks == ({6, 7} if transport == "inline" else set())
    if transport == "store":
        assert sorted(p.name[:13] for p in (store / topic).iterdir()) == ["v000000000006", "v000000000007"]
    late = WeightFollower(log, topic, payload=True).start()  # starts after the cut: begins at full version 6
    try:
        assert late.wait_caught_up(timeout=60)
        version, received = late.take()
    finally:
        late.close()
    assert version == 7 and late.skipped_deltas == late.corrupt_versions == 0
    assert_bit_exact(received, to_transfer(states[7], "bf16"))


def test_a_late_follower_reads_no_chunk_before_the_newest_full_version(log: Log, unique: str) -> None:
    topics = RunTopics(f"late{unique}", "math", ("main",))
    topics.ensure(log, partitions=1)
    topic = topics.weights("main")
    config = WeightsConfig(full_sync_interval=5, keep_versions=None, chunk_bytes=4096)
    with log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), topic, "main", config, log=log)
        for version in range(12):  # full 0, 5 and 10
            publisher.publish(perturbed(random_state(1), 0.02, seed=version), version)
        watched = WatchedLog(log)
        late = WeightFollower(watched, topic, payload=True).start()
        try:
            assert late.wait_caught_up(timeout=60)
            version, received = late.take()
        finally:
            late.close()
        assert version == 11 and late.skipped_deltas == late.corrupt_versions == 0
        assert_bit_exact(received, publisher.published.state)
    chunks = [m for m in watched.read if m.topic == topic and m.partition == WEIGHTS_CHUNK_PARTITION]
    assert {Codec().decode(m.value, expect=WeightChunk).version for m in chunks} == {10, 11}


def test_chunks_above_the_brokers_default_record_size(log: Log, unique: str) -> None:
    topics = RunTopics(f"big{unique}", "math", ("main",))
    topics.ensure(log, partitions=1, chunk_bytes=24 * MiB)
    topic = topics.weights("main")
    assert log.describe_topic(topic).max_message_bytes == 25 * MiB  # the local broker's message.max.bytes is 16 MiB
    state = {"w": torch.randn(10 * MiB, generator=torch.Generator().manual_seed(0))}  # 20 MiB in bf16: one chunk
    with log.producer() as producer:
        manifest = WeightPublisher(
            producer, Codec(), topic, "main", WeightsConfig(chunk_bytes=24 * MiB), log=log
        ).publish(state, 0)
    assert manifest.num_chunks == 1 and manifest.total_bytes == 20 * MiB
    follower = WeightFollower(log, topic, payload=True).start()
    try:
        assert follower.wait_for(0, timeout=60)
        version, received = follower.take()
    finally:
        follower.close()
    assert version == 0
    assert_bit_exact(received, to_transfer(state, "bf16"))
