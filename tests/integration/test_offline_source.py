"""An ``offline`` source mixed into a live stream processor, on both backends.

An earlier run's trajectory topic (here written directly: 12 groups, one of them all-equal, plus a
record of garbage bytes after the first group) is mixed into this run's samples at weight 0.5 by the native runtime:
offline groups pass the group operators except ``staleness`` (their versions are another run's),
carry ``#offline0`` ids and ``replayed``, make up half of the samples while the topic lasts, the
garbage is dead-lettered, and the processor's changelog holds the source's position.

With two input partitions, each partition's source mixes in the offline groups whose id hashes
to it: together every offline group once, each from one partition's share.

The restart test splits an offline group the way the issue splits a live one: group o10 lies
wholly after o11's first member, and o11's second member comes only after the processor stopped;
the restarted processor must neither emit o10 again nor lose o11 nor any group fed to the mixer
but not yet emitted.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import numpy as np
import pytest

from astraflow.config import parse_config
from astraflow.log import TopicPartition, TopicSpec
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import DeadLetter, TrainSample, Trajectory
from astraflow.streams.runtimes.changelog import Changelog
from astraflow.streams.runtimes.native import NativeStreamProcessor
from astraflow.streams.runtimes.offline import state_key

GROUP = 4


def trajectory(run: str, group: int, index: int, reward: float, version: int) -> Trajectory:
    n = 3
    gid = f"{run}/g{group}"
    return Trajectory(
        trajectory_id=f"{gid}/{index}",
        episode_id=f"{gid}/{index}",
        group_id=gid,
        task_id=gid,
        prompt_id=f"p{group}",
        policy="main",
        workflow="math",
        prompt_ids=np.arange(3, dtype=np.int32),
        response_ids=np.arange(n, dtype=np.int32),
        behaviour_logprobs=np.full(n, -0.5, dtype=np.float32),
        token_versions=np.full(n, version, dtype=np.int32),
        loss_mask=np.ones(n, dtype=np.uint8),
        reward=reward,
        group_size=GROUP,
    )


def read(ctx: ComponentContext, topic: str, record: type) -> list:
    consumer = ctx.log.consumer(group_id=None)
    partitions = [TopicPartition(topic, p) for p in range(ctx.log.describe_topic(topic).partitions)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(partitions)
    records = []
    while any(consumer.lag().values()):
        records += [ctx.codec.decode(m.value, expect=record) for m in consumer.poll(max_records=10_000, timeout=1.0)]
    consumer.close()
    return records


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def ctx(log_target: dict[str, str], tmp_path, unique: str):
    context = ComponentContext(parse_config(live_config(log_target, unique, partitions=1)), tmp_path, "stream")
    yield context
    context.close()


def live_config(log_target: dict[str, str], unique: str, partitions: int) -> dict:
    raw = {
        "run": f"live{unique}",
        "log": {
            "backend": log_target["backend"],
            "bootstrap": log_target.get("bootstrap", "localhost:9092"),
            "partitions": partitions,  # with one input partition its source has the whole offline topic
        },
        "rollout": {"group_size": GROUP},
        "stream": {
            "max_staleness": 1,
            "pipeline": [
                {"op": "staleness"},
                {"op": "grpo"},
                {"op": "zero_variance"},
                {"op": "offline", "topic": f"old{unique}.trajectories.main", "weight": 0.5},
            ],
        },
    }
    return raw


def test_offline_topic_is_mixed_in_at_its_weight(ctx: ComponentContext, unique: str) -> None:
    offline_topic = f"old{unique}.trajectories.main"
    ctx.log.create_topic(TopicSpec(offline_topic, partitions=2))
    old = f"old{unique}"
    for g in range(12):  # versions 250+ of the old run: a staleness filter would drop every one
        rewards = [1.0] * GROUP if g == 5 else [1.0, 0.0, 1.0, 0.0]
        for i, reward in enumerate(rewards):
            ctx.producer.send(
                offline_topic,
                ctx.codec.encode(trajectory(old, g, i, reward, 250 + g)),
                key=f"{old}/g{g}".encode(),
                partition=0,
            )
        if g == 0:
            ctx.producer.send(offline_topic, b"\x00garbage", key=f"{old}/g99".encode(), partition=0)
    live = ctx.topics.trajectories("main")
    for g in range(6):
        for i, reward in enumerate([0.0, 1.0, 0.0, 1.0]):
            ctx.producer.send(
                live,
                ctx.codec.encode(trajectory(ctx.config.run, g, i, reward, 0)),
                key=f"{ctx.config.run}/g{g}".encode(),
            )
    ctx.producer.flush()

    processor = NativeStreamProcessor(ctx, "main")
    stop = threading.Event()
    thread = threading.Thread(target=processor.run, args=(stop,))
    thread.start()
    try:
        # 6 fresh groups earn 6 offline groups at weight 0.5
        wait_for(lambda: len(read(ctx, ctx.topics.samples("main"), TrainSample)) >= 12 * GROUP, 120, "48 samples")
    finally:
        stop.set()
        thread.join(timeout=60)
    samples = read(ctx, ctx.topics.samples("main"), TrainSample)
    offline = [s for s in samples if "#offline" in s.sample_id]
    assert len(samples) == 12 * GROUP and len(offline) == 6 * GROUP  # exactly half, in whole groups
    assert all(s.sample_id.endswith("#offline0") and s.replayed and s.trajectory.policy == "main" for s in offline)
    assert all(
        f"offline:{offline_topic}" in s.operators and "staleness" not in s.operators[: s.operators.index("grpo")]
        for s in offline
    )
    assert not any(s.sample_id.startswith(f"{old}/g5/") for s in offline)  # the all-equal group was filtered
    fresh = [s for s in samples if "#offline" not in s.sample_id]
    assert len({s.sample_id for s in fresh}) == 6 * GROUP and not any(s.replayed for s in fresh)
    # the changelog holds the source's position past the garbage and the emitted groups, not past the end
    state = json.loads(Changelog.load(ctx.log, ctx.topics.stream_changelog("main"), 0).table[state_key(0)])
    assert 5 * GROUP < sum(state["next"].values()) <= 12 * GROUP + 1, state
    assert ctx.log.group_offsets().get(f"{ctx.config.run}.stream.main.offline0") is None  # the source joins no group
    live_committed = ctx.log.group_offsets().get(f"{ctx.config.run}.stream.main", {})
    assert sum(live_committed.values()) == 6 * GROUP, live_committed  # and the live topic's, all of it
    (letter,) = read(ctx, ctx.topics.deadletter(ctx.role), DeadLetter)
    assert letter.reason.startswith("undecodable offline trajectory") and letter.payload == b"\x00garbage"


def running_until(ctx: ComponentContext, condition, what: str) -> None:
    """Run a native processor of ``ctx`` until ``condition()``, then stop it."""
    processor = NativeStreamProcessor(ctx, "main")
    stop, failures = threading.Event(), []

    def loop() -> None:
        try:
            processor.run(stop)
        except BaseException as exc:  # reported below
            failures.append(exc)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        wait_for(lambda: condition() or bool(failures), 120, what)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not failures, failures
    assert not thread.is_alive()


def test_a_restarted_processor_mixes_each_offline_group_once(ctx: ComponentContext, unique: str) -> None:
    offline_topic, old = f"old{unique}.trajectories.main", f"old{unique}"
    ctx.log.create_topic(TopicSpec(offline_topic, partitions=1))

    def offline(members: list[tuple[int, int]]) -> None:
        for g, i in members:
            value = ctx.codec.encode(trajectory(old, g, i, float(i % 2), 300))
            ctx.producer.send(offline_topic, value, key=f"{old}/g{g}".encode(), partition=0)
        ctx.producer.flush()

    def fresh(groups: range) -> None:
        live = ctx.topics.trajectories("main")
        for g in groups:
            for i, reward in enumerate([0.0, 1.0, 0.0, 1.0]):
                value = ctx.codec.encode(trajectory(ctx.config.run, g, i, reward, 0))
                ctx.producer.send(live, value, key=f"{ctx.config.run}/g{g}".encode())
        ctx.producer.flush()

    def emitted() -> Counter[str]:
        return Counter(s.sample_id for s in read(ctx, ctx.topics.samples("main"), TrainSample))

    # o0..o9 whole; then o11's first member, all of o10, and the rest of o11 only after the stop
    offline([(g, i) for g in range(10) for i in range(GROUP)] + [(11, 0)] + [(10, i) for i in range(GROUP)])
    fresh(range(4))
    running_until(ctx, lambda: sum("#offline" not in sid for sid in emitted()) == 4 * GROUP, "4 fresh groups")
    before = emitted()
    offline([(11, i) for i in range(1, GROUP)])
    fresh(range(4, 12))
    running_until(ctx, lambda: sum("#offline" not in sid for sid in emitted()) == 12 * GROUP, "12 fresh groups")

    samples = emitted()
    assert max(samples.values()) == 1, samples  # nothing emitted twice, o10 included
    groups = [g for g in range(12) if any(sid.startswith(f"{old}/g{g}/") for sid in samples)]
    fed_order = list(range(10)) + [10, 11]
    assert groups == fed_order[: len(groups)]  # mixed in the order fed: none skipped
    assert all(sum(sid.startswith(f"{old}/g{g}/") for sid in samples) == GROUP for g in groups)  # whole groups
    offline_before = {sid for sid in before if "#offline" in sid}
    assert offline_before and len(offline_before) < len([sid for sid in samples if "#offline" in sid])
    assert {10, 11} <= set(groups), groups  # the split pair came through the restart, once each


def test_each_input_partition_mixes_in_its_own_share_of_the_offline_groups(
    log_target: dict[str, str], tmp_path, unique: str
) -> None:
    ctx = ComponentContext(parse_config(live_config(log_target, unique, partitions=2)), tmp_path, "stream")
    try:
        old = f"old{unique}"
        ctx.log.create_topic(TopicSpec(f"{old}.trajectories.main", partitions=1))
        for g in range(12):
            for i in range(GROUP):
                value = ctx.codec.encode(trajectory(old, g, i, float(i % 2), 300))
                ctx.producer.send(f"{old}.trajectories.main", value, key=f"{old}/g{g}".encode(), partition=0)
        for g in range(24):  # 12 fresh groups per input partition: more than either share can pay at weight 0.5
            for i, reward in enumerate([0.0, 1.0, 0.0, 1.0]):
                value = ctx.codec.encode(trajectory(ctx.config.run, g, i, reward, 0))
                ctx.producer.send(
                    ctx.topics.trajectories("main"), value, key=f"{ctx.config.run}/g{g}".encode(), partition=g % 2
                )
        ctx.producer.flush()

        def fresh_done() -> bool:
            samples = read(ctx, ctx.topics.samples("main"), TrainSample)
            return sum("#offline" not in s.sample_id for s in samples) == 24 * GROUP

        running_until(ctx, fresh_done, "24 fresh groups")
        samples = Counter(s.sample_id for s in read(ctx, ctx.topics.samples("main"), TrainSample))
        assert max(samples.values()) == 1
        mixed = {sid.split("/")[1] for sid in samples if "#offline" in sid}
        assert mixed == {f"g{g}" for g in range(12)}  # every offline group, once (the shares are disjoint)
        fed = [
            json.loads(Changelog.load(ctx.log, ctx.topics.stream_changelog("main"), p).table[state_key(0)])["fed"]
            for p in (0, 1)
        ]
        assert sum(fed) == 12 and min(fed) > 0, fed  # both input partitions mixed in a share of their own
    finally:
        ctx.close()
