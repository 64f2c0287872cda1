"""Signed weight versions: the trainer's publisher signs each manifest (Ed25519), and followers that
hold the public key take in only versions it signed, refusing, counting and dead-lettering the rest.

A forger here is anyone who can write the weights topic: it publishes versions of its own, unsigned
or signed with another key, and changes a genuine manifest after signing. Everything runs on a real
embedded log with the publisher and follower the components use.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from astraflow.config import WeightsConfig, parse_config
from astraflow.core.errors import ConfigError
from astraflow.log import TopicPartition, TopicSpec
from astraflow.runtime.context import ComponentContext
from astraflow.runtime.topics import WEIGHTS_MANIFEST_PARTITION
from astraflow.schemas.records import DeadLetter, TensorSpec, WeightChunk
from astraflow.weights.follow import WeightFollower, follow_weights
from astraflow.weights.publish import WeightPublisher
from astraflow.weights.signing import ManifestSigner, ManifestVerifier, generate_key_pair
from tests.unit.test_weight_delta import random_state


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, str]:
    private, public, _ = generate_key_pair(tmp_path / "keys")
    return {"signing_key": str(private), "verify_key": str(public)}


@pytest.fixture
def foreign_keys(tmp_path: Path) -> dict[str, str]:
    private, public, _ = generate_key_pair(tmp_path / "foreign")
    return {"signing_key": str(private), "verify_key": str(public)}


TOPIC = "run.weights.main"


def manifest(**fields: object) -> WeightChunk:
    base = WeightChunk(
        "main", 3, 2, "delta", "manifest", -1, 1, 64, "ab" * 32, tensors=[TensorSpec("w", "bf16", [4, 8], 0, 64)]
    )
    return replace(base, base_sha256="cd" * 32, chunk_offset=7, created_ms=1234, **fields)


def test_a_signed_manifest_verifies_and_any_change_to_it_does_not(keys: dict, foreign_keys: dict) -> None:
    signer, verifier = ManifestSigner(keys["signing_key"]), ManifestVerifier(keys["verify_key"])
    signed = signer.sign(manifest(), TOPIC)
    assert signed.signer == verifier.fingerprint and len(signed.signature) == 64
    assert verifier.refusal(signed, TOPIC) is None
    assert verifier.refusal(manifest(), TOPIC).startswith("unsigned: weights version 3 of policy 'main'")
    foreign = ManifestSigner(foreign_keys["signing_key"]).sign(manifest(), TOPIC)
    assert verifier.refusal(foreign, TOPIC).startswith(
        f"foreign: weights version 3 of policy 'main' is signed by key {foreign.signer}"
    )
    changes = {
        "policy": "other",
        "version": 4,
        "base_version": 1,
        "base_sha256": "ef" * 32,
        "encoding": "full",
        "num_chunks": 2,
        "total_bytes": 65,
        "sha256": "00" * 32,
        "tensors": [TensorSpec("w", "bf16", [8, 4], 0, 64)],
        "store_uri": "file:///elsewhere",
        "chunk_offset": 0,
        "created_ms": 1235,
    }
    for name, value in changes.items():
        reason = verifier.refusal(replace(signed, **{name: value}), TOPIC)
        assert reason is not None and reason.startswith("bad signature:"), name


@pytest.mark.parametrize("elsewhere", ["run.weights.verifier", "other.weights.main"])
def test_a_manifest_copied_to_another_policys_or_runs_topic_does_not_verify_there(keys: dict, elsewhere: str) -> None:
    """The signature covers the topic it was published on, so the trainer's genuine version of one
    policy (or run) cannot be replayed to another's readers, who share the key."""
    verifier = ManifestVerifier(keys["verify_key"])
    signed = ManifestSigner(keys["signing_key"]).sign(manifest(), TOPIC)
    reason = verifier.refusal(signed, elsewhere)
    assert reason is not None and reason.startswith("bad signature:") and elsewhere in reason


def publisher(ctx: ComponentContext, weights: dict) -> WeightPublisher:
    config = WeightsConfig(**weights)
    return WeightPublisher(ctx.producer, ctx.codec, ctx.topics.weights("main"), "main", config, log=ctx.log)


def dead_letters(ctx: ComponentContext) -> list[DeadLetter]:
    consumer = ctx.log.consumer(group_id=None)
    consumer.assign([TopicPartition(ctx.topics.deadletter(ctx.role), 0)])
    consumer.seek_to_beginning()
    letters = [ctx.codec.decode(m.value, expect=DeadLetter) for m in consumer.poll(max_records=100, timeout=0.0)]
    consumer.close()
    return letters


def manifests(ctx: ComponentContext) -> list[bytes]:
    consumer = ctx.log.consumer(group_id=None)
    consumer.assign([TopicPartition(ctx.topics.weights("main"), WEIGHTS_MANIFEST_PARTITION)])
    consumer.seek_to_beginning()
    values = [m.value for m in consumer.poll(max_records=100, timeout=0.0)]
    consumer.close()
    return values


def step_of(follower: WeightFollower) -> int:
    taken = follower.take()
    assert taken is not None
    return int(taken[1]["step"].item())


def test_followers_take_only_the_trainers_versions_and_dead_letter_the_forged_ones(
    tmp_path: Path, keys: dict, foreign_keys: dict
) -> None:
    ctx = ComponentContext(parse_config({"weights": keys}), tmp_path, "rollout")
    try:
        trainer = publisher(ctx, keys)
        for version in range(3):
            trainer.publish(random_state(version), version)
        publisher(ctx, {}).publish(random_state(103), 3, full=True)  # unsigned
        publisher(ctx, foreign_keys).publish(random_state(104), 4, full=True)  # another key
        genuine = ctx.codec.decode(manifests(ctx)[0], expect=WeightChunk)
        tampered = replace(genuine, version=5)  # the trainer's full version 0, renumbered after signing
        topic = ctx.topics.weights("main")
        ctx.producer.send(topic, ctx.codec.encode(tampered), partition=WEIGHTS_MANIFEST_PARTITION)
        ctx.producer.flush()
        trainer.publish(random_state(3), 3)  # the trainer goes on: a delta on its version 2

        follower = follow_weights(ctx, "main", payload=True)
        announced = follow_weights(ctx, "main", payload=False)
        try:
            assert follower.wait_caught_up(timeout=30) and announced.wait_caught_up(timeout=30)
            assert (follower.latest_version, follower.newest_version, step_of(follower)) == (3, 3, 3)
            assert (announced.latest_version, announced.newest_version) == (3, 3)
            assert (follower.refused_versions, follower.corrupt_versions, follower.skipped_deltas) == (3, 0, 0)
            assert announced.refused_versions == 3
        finally:
            follower.close()
            announced.close()
        letters = dead_letters(ctx)
        assert len(letters) == 6  # each reader dead-letters what it refused, under its own name
        reasons = sorted(letter.reason.split(":")[0] for letter in letters)
        assert reasons == ["bad signature"] * 2 + ["foreign"] * 2 + ["unsigned"] * 2
        assert {(letter.topic, letter.partition, letter.error_type) for letter in letters} == {
            (topic, WEIGHTS_MANIFEST_PARTITION, "WeightsError")
        }
        assert {letter.origin for letter in letters} == {ctx.instance}
        assert {letter.payload for letter in letters} == set(manifests(ctx)[-4:-1])  # the three forged manifests
    finally:
        ctx.close()


def test_without_a_verify_key_a_forged_version_reaches_the_readers(tmp_path: Path, keys: dict) -> None:
    """The attack the keys stop: one unsigned full version from any writer replaces the trainer's weights."""
    ctx = ComponentContext(parse_config({}), tmp_path, "rollout")
    try:
        publisher(ctx, keys).publish(random_state(0), 0)
        publisher(ctx, {}).publish(random_state(101), 1, full=True)
        follower = follow_weights(ctx, "main", payload=True)
        try:
            assert follower.wait_caught_up(timeout=30)
            assert (follower.latest_version, step_of(follower), follower.refused_versions) == (1, 101, 0)
        finally:
            follower.close()
    finally:
        ctx.close()


def test_a_new_follower_starts_at_the_newest_signed_full_version(tmp_path: Path, keys: dict) -> None:
    """A forged full version at the end of the topic is not where a verifying follower starts."""
    ctx = ComponentContext(parse_config({"weights": keys}), tmp_path, "evaluator")
    try:
        trainer = publisher(ctx, keys)
        for version in range(2):
            trainer.publish(random_state(version), version)
        publisher(ctx, {}).publish(random_state(102), 2, full=True)
        follower = follow_weights(ctx, "main", payload=True)
        try:
            assert follower.wait_caught_up(timeout=30)
            assert (follower.latest_version, step_of(follower), follower.refused_versions) == (1, 1, 1)
        finally:
            follower.close()
    finally:
        ctx.close()


def test_keys_come_in_matching_pairs_and_the_private_one_stays_private(
    tmp_path: Path, keys: dict, foreign_keys: dict
) -> None:
    for one in ("signing_key", "verify_key"):
        with pytest.raises(ValidationError, match=f"weights.{one} is set but"):
            WeightsConfig(**{one: keys[one]})
    ctx = ComponentContext(parse_config({}), tmp_path, "trainer")
    try:
        with pytest.raises(ConfigError, match="is not the pair of weights.verify_key .* every reader would refuse"):
            publisher(ctx, {"signing_key": keys["signing_key"], "verify_key": foreign_keys["verify_key"]})
        os.chmod(keys["signing_key"], 0o644)
        with pytest.raises(ConfigError, match="can be read by other users .*chmod 600"):
            publisher(ctx, keys)
        os.chmod(keys["verify_key"], 0o600)
        with pytest.raises(ConfigError, match="is not an unencrypted PEM private key"):
            ManifestSigner(keys["verify_key"])
    finally:
        ctx.close()
    with pytest.raises(ConfigError, match="exists already: not overwriting a key"):
        generate_key_pair(Path(keys["signing_key"]).parent)


def test_the_trainers_versions_copied_to_another_policys_topic_are_refused_there(tmp_path: Path, keys: dict) -> None:
    """Both policies' readers hold the same verify key, but each manifest is signed for its own topic:
    every record of policy ``main``'s topic, copied verbatim to ``verifier``'s, is refused there."""
    ctx = ComponentContext(parse_config({"weights": keys}), tmp_path, "rollout")
    try:
        trainer = publisher(ctx, keys)
        for version in range(3):
            trainer.publish(random_state(version), version)
        source, copy = ctx.topics.weights("main"), ctx.topics.weights("verifier")
        ctx.log.create_topic(TopicSpec(copy, partitions=2, max_message_bytes=8 << 20))
        consumer = ctx.log.consumer(group_id=None)
        consumer.assign([TopicPartition(source, p) for p in range(2)])
        consumer.seek_to_beginning()
        records = consumer.poll(max_records=1000, timeout=0.0)
        consumer.close()
        for record in records:
            ctx.producer.send(copy, record.value, key=record.key, partition=record.partition)
        ctx.producer.flush()
        follower = follow_weights(ctx, "verifier", payload=True)
        try:
            assert follower.wait_caught_up(timeout=30)
            assert (follower.latest_version, follower.refused_versions) == (-1, 3)
        finally:
            follower.close()
        reasons = {letter.reason.split(":")[0] for letter in dead_letters(ctx) if letter.topic == copy}
        assert reasons == {"bad signature"}
    finally:
        ctx.close()
