"""Where a new weight follower starts (``weights/start.py``), retention by default, and old records."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from fastavro import schemaless_writer

from astraflow.config import RunConfig, WeightsConfig
from astraflow.log import Log, Producer, TopicPartition, open_log
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.schemas.store import packaged_schemas
from astraflow.weights.follow import WeightFollower
from astraflow.weights.publish import WeightPublisher
from astraflow.weights.start import WINDOW
from tests.unit.test_weight_delta import assert_bit_exact, perturbed, random_state
from tests.unit.watched_log import WatchedLog

TOPIC = "r.weights.main"
STATES = [perturbed(random_state(1), 0.02, seed=v) for v in range(30)]


def open_weights_log(tmp_path: Path):
    log = open_log("embedded", path=tmp_path / "log.sqlite")
    RunTopics("r", "math", ("main",)).ensure(log, partitions=1)
    return log


def decoded(log: WatchedLog, partition: int) -> list[WeightChunk]:
    """The records of ``partition`` of the weights topic that ``log``'s consumers read."""
    return [Codec().decode(m.value) for m in log.read if m.topic == TOPIC and m.partition == partition]


def test_weights_keep_eight_versions_by_default(tmp_path: Path) -> None:
    assert WeightsConfig().keep_versions == RunConfig().weights.keep_versions == 8
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", log=log)
        for version, state in enumerate(STATES):  # full every 10 versions
            publisher.publish(state, version)
        reader = log.consumer()
        reader.assign([TopicPartition(TOPIC, WEIGHTS_MANIFEST_PARTITION)])
        reader.seek_to_beginning()
        kept = [Codec().decode(message.value).version for message in reader.poll(max_records=100, timeout=0)]
        reader.close()
    assert kept == list(range(20, 30))  # the last 8 (22-29) and the full version 20 they need


@pytest.mark.parametrize("payload", [True, False])
def test_a_new_follower_starts_at_the_newest_full_version(tmp_path: Path, payload: bool) -> None:
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        config = WeightsConfig(full_sync_interval=10, keep_versions=None, chunk_bytes=4096)
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config, log=log)
        for version, state in enumerate(STATES):  # full 0, 10 and 20, deltas between
            publisher.publish(state, version)
        watched = WatchedLog(log)
        follower = WeightFollower(watched, TOPIC, payload=payload).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            assert follower.latest_version == follower.newest_version == 29
            taken = follower.take()
        finally:
            follower.close()
        manifests = decoded(watched, WEIGHTS_MANIFEST_PARTITION)
        chunks = decoded(watched, WEIGHTS_CHUNK_PARTITION)
        if not payload:
            # only the newest few manifests: on Kafka a commit marker may follow each
            assert taken is None and [m.version for m in manifests] == list(range(30 - WINDOW, 30))
            return
        assert {c.version for c in chunks} == set(range(20, 30))  # no chunk of a version before the full 20
        assert len(manifests) <= WINDOW + 10  # looking back for it reads a window of small manifests
        assert follower.skipped_deltas == follower.corrupt_versions == 0
        version, received = taken
        assert version == 29
        assert_bit_exact(received, publisher.published.state)


def test_a_new_follower_whose_newest_full_version_is_corrupt_waits_for_the_next(tmp_path: Path) -> None:
    """The versions before the newest full one are superseded, and the deltas after it need it."""
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        config = WeightsConfig(full_sync_interval=3, keep_versions=None)
        publisher = WeightPublisher(Corrupting(producer, version=3), Codec(), TOPIC, "main", config, log=log)
        for version in range(5):  # full 0, 1, 2, full 3 (corrupt), 4
            publisher.publish(STATES[version], version)
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            assert follower.take() is None and (follower.corrupt_versions, follower.skipped_deltas) == (1, 1)
            for version in (5, 6):  # full 6
                publisher.publish(STATES[version], version)
            assert follower.wait_for(6, timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
        assert version == 6
        assert_bit_exact(received, publisher.published.state)


def test_records_of_an_older_astraflow_are_still_followed(tmp_path: Path) -> None:
    """Manifests written before ``chunk_offset`` existed decode through the schema topic; the
    follower then reads the chunks from the beginning."""
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        config = WeightsConfig(full_sync_interval=5, keep_versions=None, chunk_bytes=4096)
        publisher = WeightPublisher(OlderAstraFlow(producer, log), Codec(), TOPIC, "main", config, log=log)
        for version, state in enumerate(STATES[:12]):
            publisher.publish(state, version)
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
        assert version == 11 and follower.skipped_deltas == follower.corrupt_versions == 0
        assert_bit_exact(received, publisher.published.state)


class Corrupting(Producer):
    """Passes records on, flipping a bit of the first chunk of one version."""

    def __init__(self, inner: Producer, version: int) -> None:
        self.inner, self.version, self.codec = inner, version, Codec()

    def send(self, topic, value, key=None, headers=(), partition=None, timestamp_ms=None) -> None:
        record = self.codec.decode(value, expect=WeightChunk)
        if record.version == self.version and record.chunk_index == 0:
            value = self.codec.encode(dataclasses.replace(record, data=bytes([record.data[0] ^ 1]) + record.data[1:]))
        self.inner.send(topic, value, key=key, partition=partition)

    def flush(self, timeout: float = 30.0) -> None:
        self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


class OlderAstraFlow(Producer):
    """Passes records on written with the WeightChunk schema from before ``chunk_offset``, which it
    publishes to the schema topic as an older AstraFlow process does."""

    def __init__(self, inner: Producer, log: Log) -> None:
        schema = json.loads(packaged_schemas()["astraflow.WeightChunk"].text)
        schema["fields"] = [f for f in schema["fields"] if f["name"] != "chunk_offset"]
        with LogSchemaStore(log, schemas=[]) as store:
            self.fingerprint = store.add(schema)
            self.schema = store.get(self.fingerprint).parsed
        self.inner, self.codec = inner, Codec()

    def send(self, topic, value, key=None, headers=(), partition=None, timestamp_ms=None) -> None:
        fields = dataclasses.asdict(self.codec.decode(value, expect=WeightChunk))
        del fields["chunk_offset"]
        out = io.BytesIO()
        out.write(b"\xc3\x01" + self.fingerprint)
        schemaless_writer(out, self.schema, fields)
        self.inner.send(topic, out.getvalue(), key=key, partition=partition)

    def flush(self, timeout: float = 30.0) -> None:
        self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()
