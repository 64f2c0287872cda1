"""Bad input on the way in (issue #8): each ends in a dead letter or an error that names the cause.

A bad trajectory record is dead-lettered by the stream processor, and its group - which can never
have all its members now - is dropped as ``incomplete``, with its other members listed on the
feedback topic, instead of waiting forever and holding back the committed offset. A reward
function that raises or returns no finite number fails its task (dead-lettered by the producer).
The other bad inputs of the issue are tested where they are handled (see the report of issue #8).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from astraflow.config import parse_config
from astraflow.core.errors import RewardError
from astraflow.episodes.workflows.base import score
from astraflow.log import Message, TopicPartition
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, PromptStats
from astraflow.schemas.store import packaged_schemas
from astraflow.streams.runtimes.native import NativeStreamProcessor
from tests.unit.test_schemas import write_with
from tests.unit.test_stream_operators import traj

GOOD = Codec().encode(traj("g", 0, 1.0, size=2))


def incompatible(ctx: ComponentContext) -> bytes:
    """A Trajectory written by a producer whose schema made ``reward`` a string."""
    schema = json.loads(packaged_schemas()["astraflow.Trajectory"].text)
    for field in schema["fields"]:
        if field["name"] == "reward":
            field["type"] = "string"
    return write_with(schema, ctx.schemas, dataclasses.replace(traj("g", 0, 1.0, size=2), reward="high"))


def bad_trajectory(**changes: object) -> Callable[[ComponentContext], bytes]:
    return lambda ctx: Codec().encode(dataclasses.replace(traj("g", 0, 1.0, size=2), **changes))


@pytest.mark.parametrize(
    ("make", "error_type", "cause"),
    [
        (lambda ctx: b"\x00garbage\xff", "SchemaError", "not an Avro single-object record"),
        (lambda ctx: b"\xc3\x01" + b"\x11" * 8 + GOOD[10:], "UnknownSchemaError", "unknown writer schema"),
        (
            incompatible,
            "SchemaError",
            "does not resolve to this package's schema: Schema mismatch: string is not double",
        ),
        (bad_trajectory(reward=float("nan")), "", "reward: non-finite nan"),
        (bad_trajectory(reward=float("inf")), "", "reward: non-finite inf"),
        (bad_trajectory(policy="verifier"), "", "policy: 'verifier' is not 'main'"),
        (bad_trajectory(group_size=0), "", "group_size: 0 (an empty group)"),
    ],
    ids=[
        "garbage-bytes",
        "unknown-fingerprint",
        "incompatible-schema",
        "nan-reward",
        "inf-reward",
        "unknown-policy",
        "empty-group",
    ],
)
@pytest.mark.parametrize("bad_first", [True, False], ids=["bad-first", "bad-last"])
def test_bad_trajectory_is_dead_lettered_and_its_group_dropped_as_incomplete(
    tmp_path: Path, make: Callable[[ComponentContext], bytes], error_type: str, cause: str, bad_first: bool
) -> None:
    ctx = ComponentContext(parse_config({"rollout": {"group_size": 2}, "log": {"partitions": 1}}), tmp_path, "stream")
    try:
        processor = NativeStreamProcessor(ctx, "main")
        topic = ctx.topics.trajectories("main")
        bad, sibling = make(ctx), Codec().encode(traj("g", 1, 0.0, size=2))
        values = [bad, sibling] if bad_first else [sibling, bad]
        processor.transactions.begin()
        groups = [processor._add(Message(topic, 0, offset, b"g", value, 0)) for offset, value in enumerate(values)]
        assert groups[0] is None and groups[1] is not None and groups[1].failed
        assert processor._process(groups[1], 0) is False
        buffer = processor.states[0].buffer
        assert buffer.pending == {} and buffer.failed == {}  # nothing left waiting
        processor.transactions.commit()
        [letter] = read(ctx, ctx.topics.deadletter(ctx.role), DeadLetter)
        [stats] = read(ctx, ctx.topics.feedback(), PromptStats)
    finally:
        ctx.close()
    assert cause in letter.reason and letter.error_type == error_type
    assert (letter.topic, letter.partition, letter.offset, letter.payload) == (topic, 0, values.index(bad), bad)
    assert not stats.accepted and stats.drop_reason.startswith("incomplete: 1 member(s) dead-lettered")
    assert stats.trajectory_ids == ["g/1"] and processor.drops == {"incomplete": 1}


def read(ctx: ComponentContext, topic: str, record: type) -> list:
    consumer = ctx.log.consumer(group_id=None)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    records = [ctx.codec.decode(m.value, expect=record) for m in consumer.poll(max_records=100, timeout=0.0)]
    consumer.close()
    return records


def test_a_group_whose_every_member_is_bad_leaves_nothing_waiting(tmp_path: Path) -> None:
    ctx = ComponentContext(parse_config({"rollout": {"group_size": 2}, "log": {"partitions": 1}}), tmp_path, "stream")
    try:
        processor = NativeStreamProcessor(ctx, "main")
        topic = ctx.topics.trajectories("main")
        processor.transactions.begin()
        for index in range(2):
            value = Codec().encode(traj("g", index, float("nan"), size=2))
            assert processor._add(Message(topic, 0, index, b"g", value, 0)) is None
        assert processor.states[0].buffer.pending == {} and processor.states[0].buffer.failed == {}
        assert (
            processor._add(Message(topic, 0, 2, b"g", Codec().encode(traj("g", 0, 1.0, size=2)), 0)) is None
        )  # late: done
        processor.transactions.abort()
    finally:
        ctx.close()


def raising(text: str, reference: str) -> float:
    return {"a": 1.0}[text]


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (raising, "reward function 'raising' raised KeyError: 'b'"),
        (lambda text, reference: float("nan"), "returned nan, not a finite number"),
        (lambda text, reference: float("-inf"), "returned -inf, not a finite number"),
        (lambda text, reference: "1.0", "returned '1.0', not a finite number"),
        (lambda text, reference: None, "returned None, not a finite number"),
    ],
)
def test_a_reward_function_that_raises_or_returns_no_number_fails_the_task(reward: Callable, message: str) -> None:
    with pytest.raises(RewardError, match=None) as caught:
        score(reward, "b", "a")
    assert message in str(caught.value)


@pytest.mark.parametrize("value", [0.0, 1, True, 0.5])
def test_finite_rewards_pass_as_floats(value: float) -> None:
    assert score(lambda text, reference: value, "b", "a") == float(value)
