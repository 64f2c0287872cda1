"""An over-size trajectory is dead-lettered with its task, on both backends (issue #8).

Sent as it is, the record would fail the rollout producer's flush (``RecordTooLargeError``) and so
its task: the producer would crash before committing, and its restart would redo the task and crash
again. ``send_outcome`` checks each trajectory against its topic's record limit before sending.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from astraflow.config import parse_config
from astraflow.episodes.workflows.base import TaskOutcome
from astraflow.log import TopicPartition
from astraflow.producers.rollout.component import send_outcome
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import DeadLetter, RolloutTask, Trajectory
from tests.unit.test_stream_operators import traj

LIMIT = 16 * 1024 * 1024
"""The trajectories topic's ``max_message_bytes`` (``RunTopics``)."""


def task(name: str) -> RolloutTask:
    return RolloutTask(name, name, name, "math", "1+1=", "2", group_size=2, submitted_version=0, created_ms=0)


def huge(group: str, index: int) -> Trajectory:
    """A trajectory of ~18 MB: 1.4 M response tokens."""
    n = 1_400_000
    return dataclasses.replace(
        traj(group, index, 1.0, size=2),
        response_ids=np.zeros(n, dtype=np.int32),
        behaviour_logprobs=np.zeros(n, dtype=np.float32),
        token_versions=np.zeros(n, dtype=np.int32),
        loss_mask=np.ones(n, dtype=np.uint8),
    )


def read_all(ctx: ComponentContext, topic: str) -> list:
    ends = ctx.log.end_offsets(topic)
    records = []
    with ctx.log.consumer() as consumer:
        consumer.assign([TopicPartition(topic, p) for p in ends])
        consumer.seek_to_beginning()
        while len(records) < sum(ends.values()):
            records += [ctx.codec.decode(m.value) for m in consumer.poll(max_records=100, timeout=2.0)]
    return records


def test_oversize_trajectory_dead_letters_its_task_and_the_rest_flow(
    log_target: dict[str, str], tmp_path: Path, unique: str
) -> None:
    log = {
        "backend": log_target["backend"],
        "partitions": 1,
        **({"bootstrap": log_target["bootstrap"]} if "bootstrap" in log_target else {}),
    }
    ctx = ComponentContext(
        parse_config({"run": f"big{unique}", "log": log, "rollout": {"group_size": 2}}), tmp_path, "rollout"
    )
    try:
        small = TaskOutcome(task("small"), [traj("small", 0, 1.0, size=2), traj("small", 1, 0.0, size=2)])
        big = TaskOutcome(task("big"), [traj("big", 0, 1.0, size=2), huge("big", 1)])
        assert len(ctx.codec.encode(big.trajectories[1])) > LIMIT
        sent = [send_outcome(ctx, outcome) for outcome in (small, big)]
        ctx.producer.flush()  # nothing over-size reached the producer: the flush succeeds
        trajectories = read_all(ctx, ctx.topics.trajectories("main"))
        [letter] = read_all(ctx, ctx.topics.deadletter(ctx.role))
    finally:
        ctx.close()
    assert [len(s) for s in sent] == [2, 0]
    # the big task's fitting member was not sent either, so its group never waits for the other
    assert sorted(t.trajectory_id for t in trajectories) == ["small/0", "small/1"]
    assert isinstance(letter, DeadLetter) and letter.error_type == "RecordTooLargeError"
    assert letter.reason.startswith("workflow failed for task big: trajectory big/1: record of ")
    assert f"topic '{ctx.topics.trajectories('main')}'" in letter.reason
