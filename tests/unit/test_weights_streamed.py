"""Streamed publish and shadow apply: the payload is the serial one byte for byte, and a follower
shows only versions whose (signed) manifest vouches for every chunk it applied ahead."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

import pytest
import torch

from astraflow.config import WeightsConfig
from astraflow.log import open_log
from astraflow.runtime.topics import WEIGHTS_MANIFEST_PARTITION, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.follow import WeightFollower
from astraflow.weights.payload import build_payload, to_transfer
from astraflow.weights.publish import WeightPublisher
from astraflow.weights.signing import ManifestSigner, ManifestVerifier, generate_key_pair
from astraflow.weights.streamed import stream_chunks

TOPIC = "r.weights.main"


def model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(400, 96, generator=g)
    return {
        "embed.weight": embed,
        "lm_head.weight": embed,  # tied
        "layer.weight": torch.randn(96, 300, generator=g),
        "norm.weight": torch.ones(96),
        "step": torch.tensor([seed]),
        "empty": torch.zeros(0, 3),
    }


def updated(state: dict[str, torch.Tensor], how: str, seed: int) -> dict[str, torch.Tensor]:
    """``state`` after an update of kind ``how``; tied tensors stay tied."""
    g = torch.Generator().manual_seed(seed)
    out, done = {}, {}
    for name, tensor in state.items():
        if id(tensor) not in done:
            moved = tensor.clone()
            if tensor.is_floating_point() and tensor.numel():
                pick = torch.rand(tensor.shape, generator=g)
                if how == "random":
                    moved += torch.randn(tensor.shape, generator=g) * 0.1
                elif how == "few":  # a warmed-up model: ~0.3% of the bf16 elements move by an ulp or two
                    moved[pick < 0.003] *= 1.01
                elif how == "signs":
                    moved[pick < 0.02] *= -1
                elif how == "specials":  # NaN payloads, infinities and -0.0 travel bit for bit
                    flat = moved.view(-1)
                    flat[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
                    flat.view(torch.int32)[3] = 0x7FC0_1234  # a NaN with a payload
            done[id(tensor)] = moved
        out[name] = done[id(tensor)]
    return out


class Capture:
    """A producer that keeps what it is sent."""

    def __init__(self) -> None:
        self.records: list[WeightChunk] = []

    def send(self, topic: str, value: WeightChunk, key: bytes | None = None, partition: int | None = None) -> None:
        self.records.append(value)


class Identity:
    def encode(self, record: WeightChunk) -> WeightChunk:
        return record


@pytest.mark.parametrize("how", ["random", "few", "signs", "specials"])
@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("chunk_bytes, workers, compiled", [(1024, 3, True), (1 << 20, 1, True), (1024, 2, False)])
def test_streamed_payload_is_the_serial_one_byte_for_byte(
    how: str, full: bool, chunk_bytes: int, workers: int, compiled: bool
) -> None:
    old = to_transfer(model_state(), "bf16")
    new = updated(model_state(), how, seed=1)
    base = None if full else old
    serial = build_payload(to_transfer(new, "bf16"), base)
    producer = Capture()
    outline = WeightChunk("p", 1, -1, "delta", "manifest", -1, 0, 0, "")
    sent = stream_chunks(
        producer, Identity(), TOPIC, outline, new, "bf16", base, None, chunk_bytes, workers, True, compiled
    )
    assert b"".join(chunk.data for chunk in producer.records) == bytes(serial.buffer)
    assert sent.sha256 == hashlib.sha256(serial.buffer).hexdigest() and sent.total_bytes == len(serial.buffer)
    assert sent.specs == serial.specs == [spec for chunk in producer.records for spec in chunk.tensors]
    assert sent.changes == serial.changes and sent.num_chunks == len(producer.records)
    assert sent.transfer["lm_head.weight"] is sent.transfer["embed.weight"]
    for name, tensor in to_transfer(new, "bf16").items():
        assert torch.equal(sent.transfer[name].view(-1).view(torch.uint8), tensor.view(-1).view(torch.uint8))


class Reordering:
    """A producer that sends a version's chunks only with its manifest, reversed or each twice; or that
    holds them (``held``) and drops the manifest."""

    def __init__(self, producer, mode: str) -> None:
        self.producer, self.mode, self.held = producer, mode, []

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None) -> None:
        if partition != WEIGHTS_MANIFEST_PARTITION:
            self.held.append((topic, value, key, partition))
            return
        if self.mode == "hold":  # the chunks stay in ``held``, the manifest is dropped
            return
        held, self.held = self.held, []
        if self.mode == "reversed":
            held = held[::-1]
        elif self.mode == "duplicated":
            held = [record for record in held for _ in range(2)]
        for record in held:
            self.producer.send(record[0], record[1], key=record[2], partition=record[3])
        self.producer.send(topic, value, key=key, partition=partition)

    def flush(self) -> None:
        self.producer.flush()


def bits_equal(received: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> bool:
    return received.keys() == expected.keys() and all(
        torch.equal(received[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))
        for name, tensor in expected.items()
    )


def applied_ahead(follower: WeightFollower) -> int:
    delta = follower._shadow.delta
    return delta.next_index if delta is not None else -1


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def log(tmp_path: Path):
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        RunTopics("r", "math", ("main",)).ensure(log, partitions=1)
        yield log


def test_follower_applies_streamed_deltas_in_a_shadow_bit_exact(log) -> None:
    config = WeightsConfig(chunk_bytes=4096, full_sync_interval=100, keep_versions=None)
    follower = WeightFollower(log, TOPIC, payload=True, poll_timeout=0.01).start()
    states = []
    try:
        with log.producer() as producer:
            publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config, log=log)
            state = model_state()
            for version in range(6):
                publisher.publish(state, version)
                assert follower.wait_for(version, timeout=30)
                taken_version, taken = follower.take()
                assert taken_version == version and bits_equal(taken, publisher.published.state)
                states.append(taken)
                state = updated(state, "few" if version % 2 else "signs", seed=version)
        assert follower.shadow_bytes > 0 and follower.corrupt_versions == 0 and follower.applied_ahead == 5
        assert states[2] is not states[1] and states[3] is not states[2]  # handed out from the shadow
    finally:
        follower.close()


@pytest.mark.parametrize("mode", ["reversed", "duplicated"])
def test_chunks_out_of_order_or_twice_are_applied_once_in_order(log, mode: str) -> None:
    config = WeightsConfig(chunk_bytes=1024, full_sync_interval=100, keep_versions=None)
    follower = WeightFollower(log, TOPIC, payload=True, poll_timeout=0.01).start()
    try:
        with log.producer() as producer:
            reordering = Reordering(producer, mode)
            publisher = WeightPublisher(reordering, Codec(), TOPIC, "main", config, log=log)
            state = model_state()
            for version in range(4):
                manifest = publisher.publish(state, version)
                assert manifest.num_chunks > 2
                assert follower.wait_for(version, timeout=30)
                assert bits_equal(follower.take()[1], publisher.published.state)
                state = updated(state, "signs", seed=version)
        assert follower.corrupt_versions == 0
    finally:
        follower.close()


@pytest.mark.parametrize("problem", ["no manifest", "tampered chunk", "foreign signer", "wrong sha256"])
def test_chunks_applied_ahead_are_never_shown_without_a_manifest_that_vouches_for_them(
    log, tmp_path: Path, problem: str
) -> None:
    private, public, _ = generate_key_pair(tmp_path / "keys")
    foreign, _, _ = generate_key_pair(tmp_path / "foreign")
    config = WeightsConfig(
        chunk_bytes=2048, full_sync_interval=100, keep_versions=None, signing_key=str(private), verify_key=str(public)
    )
    codec = Codec()
    follower = WeightFollower(log, TOPIC, payload=True, poll_timeout=0.01, verifier=ManifestVerifier(public))
    follower.start()
    try:
        with log.producer() as producer:
            publisher = WeightPublisher(producer, codec, TOPIC, "main", config, log=log)
            for version in range(2):  # taken one by one: the state taken before goes back to be the shadow
                publisher.publish(updated(model_state(), "few", seed=0) if version else model_state(), version)
                assert follower.wait_for(version, timeout=30)
                if not version:
                    follower.take()
            _, shown = follower.take()
            before = {name: tensor.clone() for name, tensor in shown.items()}
            held = Reordering(producer, "hold")
            sneaky = WeightPublisher(held, codec, TOPIC, "main", config, log=log)
            sneaky._previous, sneaky._last_full = publisher.published, 0  # a delta on version 1
            manifest = sneaky.publish(updated(model_state(), "signs", seed=7), 2)
            for topic, value, key, partition in held.held:
                record = codec.decode(value, expect=WeightChunk)
                if problem == "tampered chunk" and record.chunk_index == 1:
                    record = dataclasses.replace(record, data=bytes(len(record.data)))
                producer.send(topic, codec.encode(record), key=key, partition=partition)
            producer.flush()
            if problem != "tampered chunk":  # the follower applies them to its shadow before any manifest
                assert wait_until(lambda: applied_ahead(follower) == len(held.held))
            if problem == "foreign signer":
                manifest = ManifestSigner(foreign).sign(manifest, TOPIC)
            elif problem == "wrong sha256":
                manifest = ManifestSigner(private).sign(dataclasses.replace(manifest, sha256="0" * 64), TOPIC)
            if problem != "no manifest":
                producer.send(TOPIC, codec.encode(manifest), partition=WEIGHTS_MANIFEST_PARTITION)
            producer.flush()
            assert not follower.wait_for(2, timeout=1.0)
            assert follower.take() is None and bits_equal(shown, before)
            publisher.publish(updated(model_state(), "few", seed=3), 2)  # the genuine version 2
            assert follower.wait_for(2, timeout=30)
            assert bits_equal(follower.take()[1], publisher.published.state)
        assert follower.corrupt_versions == (problem in ("tampered chunk", "wrong sha256"))
        assert follower.refused_versions == (problem == "foreign signer")
    finally:
        follower.close()
