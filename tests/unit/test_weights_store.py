"""Claim check (``weights.transport: store``): chunks in a directory, manifests on the log."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from astraflow.config import WeightsConfig
from astraflow.core.errors import ConfigError, WeightsError
from astraflow.log import open_log
from astraflow.runtime.topics import MiB, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.weights.follow import WeightFollower
from astraflow.weights.payload import to_transfer
from astraflow.weights.publish import WeightPublisher
from astraflow.weights.store import read_stored
from tests.unit.test_weight_delta import assert_bit_exact, perturbed, random_state

TOPIC = "r.weights.main"


def open_weights_log(tmp_path: Path):
    log = open_log("embedded", path=tmp_path / "log.sqlite")
    RunTopics("r", "math", ("main",)).ensure(log, partitions=1)
    return log


def version_dirs(root: Path) -> list[Path]:
    return sorted((root / TOPIC).glob("v*"))


@pytest.mark.parametrize("as_uri", [False, True])
def test_store_round_trip_puts_only_manifests_on_the_log(tmp_path: Path, as_uri: bool) -> None:
    root = tmp_path / "store"
    config = WeightsConfig(
        transport="store", store=root.as_uri() if as_uri else str(root), chunk_bytes=4096, full_sync_interval=3
    )
    states = [perturbed(random_state(1), 0.02, seed=v) for v in range(5)]
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config, log=log)
        manifests = [publisher.publish(state, version) for version, state in enumerate(states)]
        assert [m.encoding for m in manifests] == ["full", "delta", "delta", "full", "delta"]
        assert log.end_offsets(TOPIC) == {0: 5, 1: 0}  # no chunk records
        for manifest, folder in zip(manifests, version_dirs(root), strict=True):
            assert manifest.store_uri == folder.as_uri() and len(list(folder.iterdir())) == manifest.num_chunks
        assert manifests[0].num_chunks > 1
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
    assert version == 4 and follower.corrupt_versions == follower.skipped_deltas == 0
    assert_bit_exact(received, to_transfer(states[4], "bf16"))


@pytest.mark.parametrize("damage", ["flipped byte", "missing chunk", "missing version", "extra bytes"])
def test_a_damaged_stored_version_is_never_applied(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "store"
    states = [perturbed(random_state(1), 0.02, seed=v) for v in range(5)]
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(
            producer,
            Codec(),
            TOPIC,
            "main",
            WeightsConfig(transport="store", store=str(root), chunk_bytes=4096, full_sync_interval=3),
            log=log,
        )
        for version in range(3):  # full 0, delta 1 (damaged), delta 2
            publisher.publish(states[version], version)
        folder = version_dirs(root)[1]
        chunk = sorted(folder.iterdir())[0]
        if damage == "flipped byte":
            data = bytearray(chunk.read_bytes())
            data[100] ^= 1
            chunk.write_bytes(bytes(data))
        elif damage == "missing chunk":
            chunk.unlink()
        elif damage == "missing version":
            for part in folder.iterdir():
                part.unlink()
            folder.rmdir()
        else:
            chunk.write_bytes(chunk.read_bytes() + b"\0")
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            assert follower.take()[0] == 0 and follower.take() is None  # never a wrong delta on top of version 0
            assert follower.corrupt_versions == 1 and follower.skipped_deltas == 1
            publisher.publish(states[3], 3)  # the next full version
            publisher.publish(states[4], 4)
            assert follower.wait_for(4, timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
    assert version == 4
    assert_bit_exact(received, to_transfer(states[4], "bf16"))


def test_reading_a_missing_stored_version_names_it(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="is missing"):
        read_stored((tmp_path / "gone").as_uri(), 2, 100)
    with pytest.raises(WeightsError, match="only file://"):
        read_stored("s3://bucket/v1", 1, 1)


def test_retention_needs_the_log() -> None:
    with pytest.raises(WeightsError, match="weights.keep_versions"):
        WeightPublisher(None, Codec(), TOPIC, "main", WeightsConfig(keep_versions=2))  # type: ignore[arg-type]


def test_weights_topic_created_for_larger_chunks_and_checked_when_it_exists(tmp_path: Path) -> None:
    topics = RunTopics("r", "math", ("main",))
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        topics.ensure(log, partitions=1, chunk_bytes=24 * MiB)
        assert log.describe_topic(TOPIC).max_message_bytes == 25 * MiB
        topics.ensure(log, partitions=1, chunk_bytes=4 * MiB)  # smaller chunks fit too
        with pytest.raises(ConfigError, match="weights.chunk_bytes"):
            topics.ensure(log, partitions=1, chunk_bytes=32 * MiB)


def test_retention_on_the_store_deletes_old_versions_and_leftovers(tmp_path: Path) -> None:
    root = tmp_path / "store"
    leftover = root / TOPIC / f"v{7:012d}-{'ab' * 8}"  # an earlier trainer run's version
    leftover.mkdir(parents=True)
    config = WeightsConfig(transport="store", store=str(root), keep_versions=1, full_sync_interval=2, chunk_bytes=4096)
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config, log=log)
        names = []
        for version in range(5):  # full 0, delta 1, full 2, delta 3, full 4
            publisher.publish({"w": torch.full((3000,), float(version))}, version)
            names.append([p.name[:13] for p in version_dirs(root)])
    assert names[1] == [f"v{v:012d}" for v in (0, 1, 7)]  # version 1 needs its full base 0; nothing dropped yet
    assert names[2] == [f"v{2:012d}"]  # version 2 is full: 0 and 1 go, and so does the leftover
    assert names[3] == [f"v{v:012d}" for v in (2, 3)]
    assert names[4] == [f"v{4:012d}"]


def test_retention_waits_for_the_commit_of_the_version_that_drops_the_others(tmp_path: Path) -> None:
    """A version published in a transaction deletes nothing until the caller says it committed: a fenced
    trainer's transaction never commits, so its sweep never removes the versions a newer trainer stored."""
    root = tmp_path / "store"
    config = WeightsConfig(transport="store", store=str(root), keep_versions=1, chunk_bytes=4096)
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        transactions = log.transactional_producer("r.train.main")
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config, log=log)
        for version in range(2):
            transactions.begin()
            publisher.publish({"w": torch.full((3000,), float(version))}, version, full=True, transaction=transactions)
            assert [p.name[:13] for p in version_dirs(root)] == [f"v{v:012d}" for v in range(version + 1)]
            transactions.commit()
            publisher.committed()
        assert [p.name[:13] for p in version_dirs(root)] == [f"v{1:012d}"]  # version 0 went once 1 committed
        transactions.begin()
        publisher.publish({"w": torch.full((3000,), 2.0)}, 2, full=True, transaction=transactions)
        transactions.abort()  # as a fenced trainer's never commits: nothing of version 1 may go
        assert [p.name[:13] for p in version_dirs(root)] == [f"v{v:012d}" for v in (1, 2)]
        transactions.close()
