"""Weight versions through the log: chunked publish, checksum, newest version, manifest-only follow."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from astraflow.config import WeightsConfig
from astraflow.log import open_log
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.follow import WeightFollower
from astraflow.weights.publish import WeightPublisher

TOPIC = "r.weights.main"


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(300, 200, generator=g)
    # lm_head shares the embedding's storage, as in tied-embedding models
    return {
        "a.weight": embed,
        "lm_head.weight": embed,
        "b.bias": torch.randn(7, generator=g),
        "c.step": torch.tensor([seed]),
    }


def open_weights_log(tmp_path: Path):
    log = open_log("embedded", path=tmp_path / "log.sqlite")
    RunTopics("r", "math", ("main",)).ensure(log, partitions=1)
    return log


def test_publish_then_follow_gets_the_newest_version_bit_exact(tmp_path: Path) -> None:
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        config = WeightsConfig(transfer_dtype="fp32", encoding="full", chunk_bytes=64 * 1024)
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config, log=log)
        manifest = publisher.publish(state(1), 1)
        assert manifest.num_chunks == 4  # one 240 KB float copy (tied weights travel once) in 64 KiB chunks
        publisher.publish(state(2), 2)
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=30)
            version, received = follower.take()
            assert version == 2
            for name, tensor in state(2).items():
                assert torch.equal(received[name], tensor)
            assert follower.take() is None
        finally:
            follower.close()


def test_corrupt_version_is_never_applied(tmp_path: Path) -> None:
    codec = Codec()
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(producer, codec, TOPIC, "main", log=log)
        publisher.publish(state(1), 1)
        payload = b"not the weights"
        bad = WeightChunk(
            "main", 2, -1, "full", "chunk", 0, 1, len(payload), hashlib.sha256(b"other").hexdigest(), data=payload
        )
        producer.send(TOPIC, codec.encode(bad), partition=WEIGHTS_CHUNK_PARTITION)
        manifest = WeightChunk("main", 2, -1, "full", "manifest", -1, 1, len(payload), bad.sha256)
        producer.send(TOPIC, codec.encode(manifest), partition=WEIGHTS_MANIFEST_PARTITION)
        producer.flush()
        follower = WeightFollower(log, TOPIC, payload=True).start()  # starts at the newest full version: 2
        try:
            assert follower.wait_caught_up(timeout=30)
            assert follower.take() is None and follower.latest_version == -1 and follower.corrupt_versions == 1
            publisher.publish(state(3), 3, full=True)
            assert follower.wait_for(3, timeout=30)
            version, received = follower.take()
        finally:
            follower.close()
        assert version == 3
        assert all(torch.equal(received[name], tensor) for name, tensor in publisher.published.state.items())


def test_manifest_only_follower_tracks_versions_without_payload(tmp_path: Path) -> None:
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        follower = WeightFollower(log, TOPIC, payload=False).start()
        try:
            WeightPublisher(producer, Codec(), TOPIC, "main", log=log).publish(state(0), 0)
            assert follower.wait_for(0, timeout=30)
            WeightPublisher(producer, Codec(), TOPIC, "main", log=log).publish(state(3), 3)
            assert follower.wait_for(3, timeout=30)
            assert follower.take() is None  # no state dicts in manifest-only mode
        finally:
            follower.close()
