"""Sparse bf16 deltas: bit-exact round trips, per-tensor encodings, and how followers treat bad bases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import WeightsConfig, parse_config
from astraflow.core.errors import ConfigError, WeightsError
from astraflow.log import Producer, open_log
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.delta import apply_section, decode_section, encode_bits, pad8, parse_section
from astraflow.weights.follow import WeightFollower
from astraflow.weights.payload import build_payload, read_payload, to_transfer
from astraflow.weights.publish import WeightPublisher

TOPIC = "r.weights.main"
SMALL = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    )


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
    return {
        "embed.weight": embed,
        "lm_head.weight": embed,
        "norm.weight": torch.ones(64),
        "bias": torch.zeros(5),
        "step": torch.tensor([seed]),
        "scalar": torch.tensor(0.5),
        "empty": torch.zeros(0, 3),
    }


# --- tensor-level encodings ---------------------------------------------------------------------


def changed_at(n: int, positions: np.ndarray, by: int | np.ndarray = 1) -> tuple[np.ndarray, np.ndarray]:
    base = np.arange(n, dtype=np.int16)
    new = base.copy()
    new[positions] += np.asarray(by, dtype=np.int16)
    return new, base


def as_section(encoded) -> np.ndarray:
    """The parts written 8-byte aligned, as in a payload."""
    section = np.zeros(encoded.nbytes + 8, dtype=np.uint8)[: encoded.nbytes]
    start = 0
    for part in encoded.parts:
        section[start : start + part.nbytes] = part.reshape(-1).view(np.uint8)
        start = pad8(start + part.nbytes)
    return section


def decode(encoding: str, section: np.ndarray, n: int, base: np.ndarray) -> np.ndarray:
    return decode_section(parse_section(encoding, section, n, base.dtype), base)


BIG_STEPS = np.array([300, -1000, 8, -8, 32767])
"""Bit-pattern differences outside 4 bits ([-7, 7]): the new values travel whole."""


@pytest.mark.parametrize(
    ("positions", "n", "by", "encoding"),
    [
        (np.array([], dtype=np.int64), 10_000, 1, "none"),
        (np.arange(10_000), 10_000, 300, "raw"),  # fully changed, by more than 4 bits: dense values, no index
        (np.arange(10_000), 10_000, 1, "bitmap+d4"),  # fully changed by one ulp: 4.1 bits per element beat 16
        (np.arange(0, 10_000, 20), 10_000, 1, "gap8+d4"),
        (np.arange(0, 10_000, 20), 10_000, 300, "gap8"),  # differences too large for 4 bits
        (
            np.r_[np.arange(0, 5_000, 20), 9_000],
            10_000,
            -1,
            "gap8+d4",
        ),  # one gap past 255 takes escapes, not a wider type
        (np.arange(0, 100_000, 1_000), 100_000, 1, "gap16+d4"),
        (np.array([3, 250_000, 499_999]), 500_000, 300, "gap32"),
        (np.arange(0, 10_000, 2), 10_000, 1, "bitmap+d4"),
        (
            np.arange(0, 10_000, 8),
            10_000,
            1,
            "bitmap+d4",
        ),  # sparse enough to scan for indices, yet a bitmap is as small
        (np.arange(0, 10_000, 2), 10_000, np.resize(BIG_STEPS, 5_000), "bitmap"),
        (
            np.arange(0, 10_000, 20),
            10_000,
            np.resize(np.r_[1, -1, 7, -7, 1, 2, 3, BIG_STEPS], 500),
            "gap8+d4",
        ),  # some escapes
    ],
)
@pytest.mark.parametrize("scan", [1 << 20, 999])  # changes found in one slice, or across many
def test_each_encoding_is_chosen_and_round_trips(
    monkeypatch: pytest.MonkeyPatch, positions: np.ndarray, n: int, by: object, encoding: str, scan: int
) -> None:
    import astraflow.weights.delta as delta

    monkeypatch.setattr(delta, "SCAN_ELEMENTS", scan)
    new, base = changed_at(n, positions, by)
    encoded = encode_bits(new, base, entropy=False)  # the plain layouts; entropy coding below
    assert encoded.encoding == encoding and encoded.changed == len(positions)
    section = as_section(encoded)
    assert np.array_equal(decode(encoding, section, n, base), new)
    in_place = base.copy()
    apply_section(parse_section(encoding, section, n, base.dtype), in_place)
    assert np.array_equal(in_place, new)


@pytest.mark.parametrize("block", [3, 64, 1 << 16])
def test_blocks_of_a_gap_stream_join_up(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    import astraflow.weights.delta as delta

    monkeypatch.setattr(delta, "BLOCK_WORDS", block)
    rng = np.random.default_rng(block)
    positions = np.sort(rng.choice(300_000, 3_000, replace=False))  # many gaps past 255: escapes
    steps = rng.choice(np.r_[-1, 1, 2, -3, BIG_STEPS], positions.size)  # some differences escape too
    new, base = changed_at(300_000, positions, steps)
    new[positions[:3]] = base[positions[:3]] + 1  # changes at the very start
    encoded = encode_bits(new, base)
    assert encoded.encoding == "gap8+d4"
    target = base.copy()
    apply_section(parse_section(encoded.encoding, as_section(encoded), base.size, base.dtype), target)
    assert np.array_equal(target, new)


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_differences_wrap_around_the_bit_width(dtype: type) -> None:
    info = np.iinfo(dtype)
    base = np.array([info.max, info.min, -1, 0, 5] * 40, dtype=dtype)
    new = base.copy()
    new[::5] = info.min  # max + 1 wraps to min: a difference of 1
    new[1::5] = info.max  # min - 1 wraps to max
    new[2::5] = 0
    encoded = encode_bits(new, base)
    assert encoded.encoding.endswith("+d4")
    assert np.array_equal(decode(encoded.encoding, as_section(encoded), base.size, base), new)


def test_delta_is_no_bigger_than_any_single_form() -> None:
    rng = np.random.default_rng(0)
    for fraction in (0.0005, 0.01, 0.05, 0.3, 0.9):
        for steps in (1, BIG_STEPS):
            positions = np.flatnonzero(rng.random(200_000) < fraction)
            new, base = changed_at(200_000, positions, np.resize(steps, positions.size))
            k = int(np.count_nonzero(new != base))
            assert encode_bits(new, base).nbytes <= min(2 * 200_000, 200_000 // 8 + 2 * k + 16, 4 * k + 2 * k + 16)


def test_a_small_step_costs_about_twelve_bits_per_change_and_eight_entropy_coded() -> None:
    rng = np.random.default_rng(0)
    positions = np.flatnonzero(rng.random(1_000_000) < 0.04)
    new, base = changed_at(1_000_000, positions, rng.choice([-1, 1], positions.size))
    plain, coded = encode_bits(new, base, entropy=False), encode_bits(new, base)
    assert plain.encoding == "gap8+d4" and coded.encoding == "gap8+d4+z"
    assert 12 < plain.nbytes * 8 / positions.size < 13  # gap8 ~8.3 bits + 4-bit differences
    # the gaps' entropy (geometric at 4%: ~6.1 bits) + 1 bit of sign, Huffman coded: each within ~0.1 bit of it
    assert coded.nbytes * 8 / positions.size < 8.2
    assert np.array_equal(decode(coded.encoding, as_section(coded), new.size, base), new)


ENTROPY_CASES = {
    "gap8+d4+z": (np.arange(0, 400_000, 23), 400_000, 1),
    "gap8+z": (np.arange(0, 400_000, 23), 400_000, np.resize(BIG_STEPS, 400_000 // 23 + 1)),
    "gap16+d4+z": (np.arange(0, 4_000_000, 700), 4_000_000, -1),
    "bitmap+d4+z": (np.flatnonzero(np.random.default_rng(1).random(400_000) < 0.3), 400_000, 1),
}


@pytest.mark.parametrize("encoding", list(ENTROPY_CASES))
def test_entropy_coded_sections_are_smaller_and_round_trip_exactly(encoding: str) -> None:
    positions, n, by = ENTROPY_CASES[encoding]
    new, base = changed_at(n, positions, by)
    plain, coded = encode_bits(new, base, entropy=False), encode_bits(new, base)
    assert coded.encoding == encoding and plain.encoding == encoding.removesuffix("+z")
    assert coded.nbytes < plain.nbytes and coded.changed == plain.changed == positions.size
    section = as_section(coded)
    assert np.array_equal(decode(encoding, section, n, base), new)
    in_place = base.copy()
    apply_section(parse_section(encoding, section, n, base.dtype), in_place)
    assert np.array_equal(in_place, new)


@pytest.mark.parametrize(
    "problem", ["truncated stream", "garbage stream", "longer stream", "stream past the section", "values", "counts"]
)
def test_malformed_entropy_coded_sections_are_refused(problem: str) -> None:
    positions, n, by = ENTROPY_CASES["gap8+d4+z"]
    new, base = changed_at(n, positions, by)
    encoded = encode_bits(new, base)
    header, stream, nibbles, exceptions = encoded.parts
    header = header.copy()
    if problem == "truncated stream":
        stream = stream[:-3]
        header[3] = stream.size
    if problem == "garbage stream":
        stream = np.full(stream.size, 0xFF, dtype=np.uint8)
    if problem == "longer stream":  # the words of another tensor: inflates past what the header implies
        header[1] -= 1
    if problem == "stream past the section":
        header[3] += 1 << 20
    if problem == "values":
        exceptions = np.zeros(1, dtype=np.int16)
    if problem == "counts":
        header[0] = n + 1
    parts = [header.view(np.uint8), stream, nibbles, exceptions.view(np.uint8)]
    section = np.concatenate([np.pad(part, (0, -part.size % 8)) for part in parts[:-1]] + [parts[-1]])
    with pytest.raises(WeightsError, match="malformed delta"):
        decode("gap8+d4+z", section, n, base)


@pytest.mark.parametrize(
    ("problem", "encoding"),
    [
        ("truncated", "gap8"),
        ("index past the end", "gap8"),
        ("wrong count", "gap8"),
        ("ends in an escape", "gap8"),
        ("truncated", "gap8+d4"),
        ("wrong count", "gap8+d4"),
        ("wrong escape count", "gap8+d4"),
        ("unknown", "gap8+d9"),
        ("bits past the end", "bitmap"),
    ],
)
def test_malformed_delta_sections_are_refused(problem: str, encoding: str) -> None:
    positions = np.arange(1, 1_000, 2) if encoding == "bitmap" else np.arange(5, 1_000, 40)
    new, base = changed_at(1_000, positions, 300 if encoding in ("gap8", "bitmap") else 1)
    encoded = encode_bits(new, base)
    assert encoded.encoding == encoding.replace("+d9", "+d4")
    header, stream, *values = encoded.parts
    n = 400 if problem == "index past the end" else 1_000
    if problem == "truncated":
        values[-1] = values[-1][:-1] if values[-1].size else values[-1]
        values[0] = values[0][:1]
    if problem == "wrong count":
        header = header.copy()
        header[0] = 3
    if problem == "wrong escape count":
        header = header.copy()
        header[2] = 1
    if problem == "ends in an escape":
        stream = np.r_[stream, 255].astype(np.uint8)
        header = np.array([2, stream.size], dtype="<u8")
    if problem == "bits past the end":
        n = 999
    parts = [header.view(np.uint8), stream, *(v.view(np.uint8) for v in values)]
    section = np.concatenate([np.pad(part, (0, -part.size % 8)) for part in parts[:-1]] + [parts[-1]])
    with pytest.raises(WeightsError, match="malformed delta|unknown tensor encoding"):
        decode(encoding, section, n, base[:n])


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


@pytest.mark.parametrize("transfer_dtype", ["bf16", "fp32"])
def test_in_place_apply_writes_only_into_the_base(transfer_dtype: str) -> None:
    base = to_transfer(random_state(1), transfer_dtype)
    pointers = {name: tensor.data_ptr() for name, tensor in base.items()}
    target = to_transfer(perturbed(random_state(1), 0.05, seed=2), transfer_dtype)
    delta = build_payload(target, base)
    received = read_payload(delta.buffer, delta.specs, base, in_place=True)
    assert_bit_exact(received, target)
    assert {name: tensor.data_ptr() for name, tensor in received.items()} == pointers
    assert_bit_exact(base, target)  # the base itself now holds the new version
    assert received["lm_head.weight"] is received["embed.weight"]


def test_in_place_apply_unties_a_base_tensor_that_two_tensors_start_from() -> None:
    base = to_transfer(random_state(1), "bf16")  # embed and lm_head: one tensor
    target = dict(base)
    target["lm_head.weight"] = perturbed({"w": base["lm_head.weight"]}, 0.1, seed=3)["w"]  # untied, changed
    delta = build_payload(target, base)
    assert {spec.name: spec.encoding for spec in delta.specs}["embed.weight"] == "none"
    received = read_payload(delta.buffer, delta.specs, base, in_place=True)
    assert_bit_exact(received, target)
    assert received["lm_head.weight"].data_ptr() != received["embed.weight"].data_ptr()


def test_a_malformed_payload_leaves_the_base_untouched() -> None:
    base = to_transfer(random_state(1), "bf16")
    before = {name: tensor.clone() for name, tensor in base.items()}
    delta = build_payload(to_transfer(perturbed(random_state(1), 0.05, seed=2), "bf16"), base)
    last = max(range(len(delta.specs)), key=lambda i: delta.specs[i].offset)
    delta.specs[last].encoding = "gap8+d9"  # the last section is unreadable: nothing may be written before it
    with pytest.raises(WeightsError, match="unknown tensor encoding"):
        read_payload(delta.buffer, delta.specs, base, in_place=True)
    assert_bit_exact(base, before)


def test_to_transfer_overwrites_a_spare_copy_and_keeps_ties() -> None:
    spare = to_transfer(random_state(1), "bf16")
    pointer = spare["embed.weight"].data_ptr()
    again = to_transfer(random_state(2), "bf16", reuse=spare)
    assert again["embed.weight"].data_ptr() == pointer and again["lm_head.weight"] is again["embed.weight"]
    assert_bit_exact(again, to_transfer(random_state(2), "bf16"))


class _MadeAsRead(dict):
    """A state whose tensors are made as they are read and dropped after, as a sharded model's gathered
    weights are (``FsdpBackend.full_state``): the allocator hands the next one the freed address."""

    def items(self):
        for name, tensor in super().items():
            yield name, tensor.clone()


def test_to_transfer_does_not_tie_a_tensor_to_one_freed_before_at_its_address() -> None:
    state = {f"layer{i}": torch.full((64, 64), float(i)) for i in range(6)}
    state["head"] = state["layer0"]  # a tie the made-as-read state cannot show (each read is a new tensor)
    copied = to_transfer(_MadeAsRead(state), "fp32")
    for name, tensor in state.items():
        assert torch.equal(copied[name], tensor), name


def test_real_tiny_model_after_adamw_steps_round_trips_through_the_log(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    published = {}
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", WeightsConfig(chunk_bytes=4096), log=log)
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
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", config, log=log)
        got = [publisher.publish(perturbed(random_state(1), 0.01, seed=v), v).encoding for v in range(6)]
        assert got == encodings
        assert publisher.publish(random_state(3), 6, full=True).encoding == "full"


@pytest.mark.parametrize("sabotage", ["corrupt", "drop"])
def test_follower_skips_deltas_without_their_base_until_the_next_full(tmp_path: Path, sabotage: str) -> None:
    states = [perturbed(random_state(1), 0.02, seed=v) for v in range(6)]
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        faulty = Sabotage(producer, **{sabotage: {1}})
        publisher = WeightPublisher(faulty, Codec(), TOPIC, "main", WeightsConfig(full_sync_interval=4), log=log)
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
        first = WeightPublisher(producer, Codec(), TOPIC, "main", log=log)
        for version in range(3):
            first.publish(before[version], version)
        restarted = WeightPublisher(producer, Codec(), TOPIC, "main", log=log)  # resumed from a checkpoint at version 1
        for version in (1, 2):
            restarted.publish(after[version], version)
        newest = perturbed(after[2], 0.02, seed=99)
        restarted.publish(newest, 3)  # a delta on the *new* version 2
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
    # the republished versions become the base of the new lineage's deltas: version 3 applies onto
    # the new version 2, never onto the old one, and nothing waits for a full version
    assert version == 3 and follower.skipped_deltas == 0
    assert_bit_exact(received, to_transfer(newest, "bf16"))


def test_follower_that_holds_a_version_follows_its_republished_lineage(tmp_path: Path) -> None:
    states = [perturbed(random_state(1), 0.02, seed=v) for v in range(4)]
    with open_weights_log(tmp_path) as log, log.producer() as producer:
        first = WeightPublisher(producer, Codec(), TOPIC, "main", log=log)
        for version in range(3):  # full 0, delta 1, delta 2
            first.publish(states[version], version)
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=60)
            assert follower.take()[0] == 2
            restarted = WeightPublisher(
                producer, Codec(), TOPIC, "main", log=log
            )  # resumed from the checkpoint of version 2
            restarted.publish(states[2], 2)  # republished in full: other payload bytes, same weights
            restarted.publish(states[3], 3)  # a delta on the full version 2
            assert follower.wait_for(3, timeout=60)
            version, received = follower.take()
        finally:
            follower.close()
    assert version == 3 and follower.skipped_deltas == 0
    assert_bit_exact(received, to_transfer(states[3], "bf16"))


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"chunk_bytes": 64 * 1024 * 1024}, "chunk_bytes"),
        ({"full_sync_interval": 0}, "full_sync_interval"),
        ({"transfer_dtype": "fp8"}, "transfer_dtype"),
        ({"keep_versions": 0}, "keep_versions"),
        ({"transport": "s3"}, "transport"),
        ({"transport": "store"}, "store"),
        ({"transport": "store", "store": "s3://bucket/weights"}, "store"),
        ({"retain": 3}, "retain"),
    ],
)
def test_weights_config_is_checked_at_load_time(settings: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"weights.{field}"):
        parse_config({"weights": settings})


def test_weights_config_accepts_a_store_and_larger_chunks(tmp_path: Path) -> None:
    weights = parse_config(
        {
            "weights": {
                "transport": "store",
                "store": tmp_path.as_uri(),
                "chunk_bytes": 32 * 1024 * 1024,
                "keep_versions": 2,
            }
        }
    ).weights
    assert (weights.transport, weights.store, weights.keep_versions) == ("store", tmp_path.as_uri(), 2)
