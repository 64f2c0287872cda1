"""Sparse bf16 deltas: bit-exact round trips, per-tensor encodings, and how followers treat bad bases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.config import WeightsConfig, parse_config
from astraflow.errors import ConfigError, WeightsError
from astraflow.log import Producer, open_log
from astraflow.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.topics import WEIGHTS_CHUNK_PARTITION, RunTopics
from astraflow.weights.delta import decode_bits, encode_bits
from astraflow.weights.follow import WeightFollower
from astraflow.weights.payload import build_payload, read_payload, to_transfer
from astraflow.weights.publish import WeightPublisher

TOPIC = "r.weights.main"
SMALL = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def assert_bit_exact(received: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert received.keys() == expected.keys()
    for name, tensor in expected.items():
        assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape, name
        assert torch.equal(bits(received[name]), bits(tensor)), name


def perturbed(state: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """``state`` with ``fraction`` of each floating tensor's elements nudged by ~1% (tied tensors stay tied)."""
    g = torch.Generator().manual_seed(seed)
    out, done = {}, {}
    for name, tensor in state.items():
        if id(tensor) not in done:
            moved = tensor.clone()
            if tensor.is_floating_point():
                mask = torch.rand(tensor.shape, generator=g) < fraction
                moved[mask] *= 1.01
            done[id(tensor)] = moved
        out[name] = done[id(tensor)]
    return out


def random_state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(300, 64, generator=g)
    return {"embed.weight": embed, "lm_head.weight": embed, "norm.weight": torch.ones(64), "bias": torch.zeros(5),
            "step": torch.tensor([seed]), "scalar": torch.tensor(0.5), "empty": torch.zeros(0, 3)}


# --- tensor-level encodings ---------------------------------------------------------------------


def changed_at(n: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    base = np.arange(n, dtype=np.int16)
    new = base.copy()
    new[positions] += 1
    return new, base


@pytest.mark.parametrize(
    ("positions", "n", "encoding"),
    [
        (np.array([], dtype=np.int64), 10_000, "none"),
        (np.arange(10_000), 10_000, "raw"),  # fully changed: dense values, no index
        (np.arange(0, 10_000, 20), 10_000, "gap8"),
        (np.r_[np.arange(0, 5_000, 20), 9_000], 10_000, "gap8"),  # one gap past 255 takes escapes, not a wider type
        (np.arange(0, 100_000, 1_000), 100_000, "gap16"),
        (np.array([3, 250_000, 499_999]), 500_000, "gap32"),
        (np.arange(0, 10_000, 2), 10_000, "bitmap"),
    ],
)
def test_each_encoding_is_chosen_and_round_trips(positions: np.ndarray, n: int, encoding: str) -> None:
    new, base = changed_at(n, positions)
    encoded = encode_bits(new, base)
    assert encoded.encoding == encoding and encoded.changed == len(positions)
    section = np.zeros(encoded.nbytes + 8, dtype=np.uint8)[:encoded.nbytes]  # parts written 8-byte aligned, as in a payload
    start = 0
    for part in encoded.parts:
        section[start : start + part.nbytes] = part.reshape(-1).view(np.uint8)
        start = (start + part.nbytes + 7) & ~7
    assert np.array_equal(decode_bits(encoding, section, n, new.dtype, base), new)


def test_delta_is_no_bigger_than_any_single_form() -> None:
    rng = np.random.default_rng(0)
    for fraction in (0.0005, 0.01, 0.05, 0.3, 0.9):
        new, base = changed_at(200_000, np.flatnonzero(rng.random(200_000) < fraction))
        k = int(np.count_nonzero(new != base))
        assert encode_bits(new, base).nbytes <= min(2 * 200_000, 200_000 // 8 + 2 * k + 16, 4 * k + 2 * k + 16)


@pytest.mark.parametrize("problem", ["truncated", "index past the end", "wrong count"])
def test_malformed_delta_sections_are_refused(problem: str) -> None:
    new, base = changed_at(1_000, np.array([5, 500]))
    header, stream, values = encode_bits(new, base).parts
    n = 400 if problem == "index past the end" else 1_000
    if problem == "truncated":
        values = values[:1]
    if problem == "wrong count":
        header = np.array([3, stream.size], dtype="<u8")
    section = np.concatenate([header.view(np.uint8), np.pad(stream, (0, -stream.size % 8)), values.view(np.uint8)])
    with pytest.raises(WeightsError, match="malformed delta"):
        decode_bits("gap8", section, n, base.dtype, base[:n])


# --- whole versions -----------------------------------------------------------------------------


@pytest.mark.parametrize("transfer_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("fraction", [0.0, 0.003, 0.05, 0.5, 1.0])
def test_payload_round_trip_is_bit_exact(transfer_dtype: str, fraction: float) -> None:
    base = to_transfer(random_state(1), transfer_dtype)
    target = to_transfer(perturbed(random_state(1), fraction, seed=2), transfer_dtype)
    full = build_payload(target, None)
    delta = build_payload(target, base)
    assert_bit_exact(read_payload(full.buffer, full.specs, None), target)
    received = read_payload(delta.buffer, delta.specs, base)
    assert_bit_exact(received, target)
    assert received["lm_head.weight"] is received["embed.weight"]  # tied weights stay tied, stored once
    assert len(delta.buffer) <= len(full.buffer) + 16 * len(delta.specs)
    if fraction == 0.0:
        assert len(delta.buffer) == 0 and all(spec.encoding == "none" for spec in delta.specs)


def test_real_tiny_model_after_adamw_steps_round_trips_through_the_log(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    published = {}
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", WeightsConfig(chunk_bytes=4096))
        for version in range(4):
            if version:
                ids = torch.randint(3, len(tokenizer), (4, 12))
                model(input_ids=ids, labels=ids).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            manifest = publisher.publish(model.state_dict(), version)
            assert manifest.encoding == ("full" if version == 0 else "delta")
            assert 0 < publisher.last_stats.changed < publisher.last_stats.elements or version == 0
            published[version] = to_transfer(model.state_dict(), "bf16")
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
    assert version == 3 and follower.skipped_deltas == follower.corrupt_versions == 0
    assert_bit_exact(received, published[3])
    fresh = build_tiny_model(tokenizer, SMALL)
    fresh.load_state_dict(received)  # bf16 into the fp32 model: the values every reader samples with
    assert all(p.dtype == torch.float32 for p in fresh.parameters())
    assert torch.equal(fresh.state_dict()["lm_head.weight"], published[3]["lm_head.weight"].float())


# --- publisher schedule and followers -----------------------------------------------------------


def open_weights_log(tmp_path: Path):
    log = open_log("embedded", path=tmp_path / "log.sqlite")
    RunTopics("r", "math", ("main",)).ensure(log, partitions=1)
    return log


class Sabotage(Producer):
    """Passes records on, except that it corrupts or drops the chunks of chosen versions."""

    def __init__(self, inner: Producer, corrupt: set[int] = frozenset(), drop: set[int] = frozenset()) -> None:
        self.inner, self.corrupt, self.drop, self.codec = inner, corrupt, drop, Codec()

    def send(self, topic, value, key=None, headers=(), partition=None, timestamp_ms=None) -> None:
        if partition == WEIGHTS_CHUNK_PARTITION:
            record = self.codec.decode(value, expect=WeightChunk)
            if record.version in self.drop:
                return
            if record.version in self.corrupt:
                record.data = bytes([record.data[0] ^ 1]) + record.data[1:]
                value = self.codec.encode(record)
        self.inner.send(topic, value, key=key, partition=partition)

    def flush(self, timeout: float = 30.0) -> None:
        self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize(
    ("config", "encodings"),
    [
        (WeightsConfig(full_sync_interval=3), ["full", "delta", "delta", "full", "delta", "delta"]),
        (WeightsConfig(full_sync_interval=1), ["full"] * 6),
        (WeightsConfig(encoding="full"), ["full"] * 6),
    ],
)
def test_full_versions_first_and_every_interval(tmp_path: Path, config: WeightsConfig, encodings: list[str]) -> None:
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config)
        got = [publisher.publish(perturbed(random_state(1), 0.01, seed=v), v).encoding for v in range(6)]
        assert got == encodings
        assert publisher.publish(random_state(3), 6, full=True).encoding == "full"


@pytest.mark.parametrize("sabotage", ["corrupt", "drop"])
def test_follower_skips_deltas_without_their_base_until_the_next_full(tmp_path: Path, sabotage: str) -> None:
    states = [perturbed(random_state(1), 0.02, seed=v) for v in range(6)]
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        faulty = Sabotage(producer, **{sabotage: {1}})
        publisher = WeightPublisher(faulty, Codec(), TOPIC, "main", WeightsConfig(full_sync_interval=4))
        for version, state in enumerate(states[:4]):  # full 0, delta 1 (sabotaged), delta 2, delta 3
            publisher.publish(state, version)
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            version, received = follower.take()
            assert version == 0 and follower.take() is None  # never a wrong delta on top of version 0
            assert follower.skipped_deltas == 2 and follower.corrupt_versions == (sabotage == "corrupt")
            publisher.publish(states[4], 4)  # the next full version
            publisher.publish(states[5], 5)
            assert follower.wait_for(5, timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
    assert version == 5
    assert_bit_exact(received, to_transfer(states[5], "bf16"))


def test_delta_from_a_restarted_trainer_is_not_applied_onto_the_old_version(tmp_path: Path) -> None:
    before = [perturbed(random_state(1), 0.02, seed=v) for v in range(3)]
    after = [perturbed(random_state(1), 0.02, seed=10 + v) for v in range(3)]  # redone versions, other bits
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        first = WeightPublisher(producer, Codec(), TOPIC, "main")
        for version in range(3):
            first.publish(before[version], version)
        restarted = WeightPublisher(producer, Codec(), TOPIC, "main")  # resumed from a checkpoint at version 1
        for version in (1, 2):
            restarted.publish(after[version], version)
        restarted.publish(perturbed(after[2], 0.02, seed=99), 3)  # a delta on the *new* version 2
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
    assert version == 2 and follower.skipped_deltas == 1
    assert_bit_exact(received, to_transfer(before[2], "bf16"))


@pytest.mark.parametrize(("field", "value"), [("chunk_bytes", 64 * 1024 * 1024), ("full_sync_interval", 0), ("transfer_dtype", "fp8")])
def test_weights_config_is_checked_at_load_time(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"weights.{field}"):
        parse_config({"weights": {field: value}})
