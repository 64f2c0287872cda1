"""A small recorded run for the analysis tools: real Avro records in an embedded log, known numbers.

Layout of run ``demo`` (``config.yaml`` + ``log.sqlite`` in the run directory):

- ``demo.trajectories.main``: 3 versions x 4 trajectories; version v has v+1 of 4 rewarded (1.0);
  ``demo.trajectories.verifier``: 2 trajectories of version 0, rewards 1.0 and 0.0.
- ``demo.samples.main``: 8 train samples; group ``demo.train.main`` committed 6 of them.
- group ``demo.stream.main`` committed 10 of the 12 main trajectories (lag 2).
- ``demo.metrics.{role}``, each metric on its writer's topic: staleness 0,0,1,2,1,0; cumulative
  drop counters (stale: 3 on one instance, 2 on another; zero_variance: 4); accuracy 0.2/0.4/0.6
  for versions 0-2; version lag per producer.
- ``demo.deadletter.stream``: two dead letters, reasons ``undecodable trajectory`` and ``invalid trajectory``.

Every record is stamped one second apart from an hour ago, except the last two main trajectories,
stamped 10 s ago: the only ones in a one-minute throughput window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from astraflow.config import dump_config, parse_config
from astraflow.log import Log, TopicPartition, open_log
from astraflow.runtime.control import metric_owner
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, Metric, TrainSample, Trajectory

RUN = "demo"
STREAM_GROUP = f"{RUN}.stream.main"
TRAIN_GROUP = f"{RUN}.train.main"


@dataclass
class RecordedRun:
    run_dir: Path
    trajectories: dict[str, list[Trajectory]]
    samples: list[TrainSample]
    metrics: list[Metric]

    def log(self) -> Log:
        return open_log("embedded", path=self.run_dir / "log.sqlite")


def trajectory(policy: str, group: str, index: int, version: int, reward: float, created_ms: int) -> Trajectory:
    n = 3 + index
    return Trajectory(
        trajectory_id=f"{policy}/{group}/{index}",
        episode_id=f"{group}/{index}",
        group_id=group,
        task_id=group,
        prompt_id=f"p-{group}",
        policy=policy,
        workflow="math",
        prompt_ids=np.arange(4, dtype=np.int32),
        response_ids=np.arange(n, dtype=np.int32) + 7,
        behaviour_logprobs=np.full(n, -0.25, dtype=np.float32),
        token_versions=np.full(n, version, dtype=np.int32),
        loss_mask=np.ones(n, dtype=np.uint8),
        reward=reward,
        reward_components={"correct": reward},
        response_text=f"answer {index}",
        group_size=4,
        producer_id=f"rollout-{index % 2}",
        created_ms=created_ms,
    )


def metric(name: str, value: float, step: int, instance: str, created_ms: int, **labels: str) -> Metric:
    return Metric(instance.split("-")[0], name, value, step, created_ms, {"instance": instance, **labels})


def record_run(run_dir: Path) -> RecordedRun:
    run_dir.mkdir(parents=True, exist_ok=True)
    config = parse_config({"run": RUN})
    dump_config(config, run_dir / "config.yaml")
    base = int(time.time() * 1000) - 3_600_000
    clock = iter(range(base, base + 10_000_000, 1000))
    main = [trajectory("main", f"g{v}", i, v, 1.0 if i <= v else 0.0, next(clock)) for v in range(3) for i in range(4)]
    now = int(time.time() * 1000) - 10_000
    main[-1].created_ms = main[-2].created_ms = now
    verifier = [trajectory("verifier", "v0", i, 0, 1.0 - i, next(clock)) for i in range(2)]
    samples = [
        TrainSample(f"s{i}", main[i], 0.5 - i / 10, 2, ["staleness", "grpo"], created_ms=next(clock)) for i in range(8)
    ]
    metrics = [metric("stream.staleness", s, 2, "stream-a", next(clock), policy="main") for s in (0, 0, 1, 2, 1, 0)]
    metrics += [
        metric("stream.dropped.stale", 1, 1, "stream-a", next(clock)),
        metric("stream.dropped.stale", 3, 2, "stream-a", next(clock)),
        metric("stream.dropped.stale", 2, 2, "stream-b", next(clock)),
        metric("stream.dropped.zero_variance", 4, 2, "stream-a", next(clock)),
    ]
    metrics += [metric("eval.accuracy", 0.2 * (v + 1), v, "evaluate-x", next(clock), policy="main") for v in range(3)]
    metrics += [
        metric("stream.group_reward", 0.25 * (v + 1), v, "stream-a", next(clock), policy="main") for v in range(3)
    ]
    metrics += [metric("train.version", v, v, "train-x", next(clock), policy="main") for v in range(3)]
    metrics += [
        metric("rollout.version_lag", lag, v, producer, next(clock), policy="main")
        for v in range(3)
        for producer, lag in (("rollout-a", v % 2), ("rollout-b", 1))
    ]
    metrics += [metric("rollout.samples_per_s", 20.0 + v, v, "rollout-a", next(clock), policy="main") for v in range(3)]
    letters = [
        DeadLetter(
            "stream-a",
            "undecodable trajectory: truncated",
            "SchemaError",
            f"{RUN}.trajectories.main",
            0,
            99,
            None,
            b"\x00",
            next(clock),
        ),
        DeadLetter(
            "stream-a",
            "invalid trajectory t9: reward is NaN",
            "",
            f"{RUN}.trajectories.main",
            1,
            7,
            b"g9",
            b"\x01",
            next(clock),
        ),
    ]
    topics = RunTopics(RUN, "math", ("main", "verifier"))
    codec = Codec()
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        topics.ensure(log, partitions=2)
        with log.producer() as producer:
            for record in main + verifier:
                producer.send(
                    topics.trajectories(record.policy),
                    codec.encode(record),
                    key=record.group_id.encode(),
                    timestamp_ms=record.created_ms,
                )
            for record in samples:
                producer.send(
                    topics.samples("main"),
                    codec.encode(record),
                    key=record.trajectory.group_id.encode(),
                    timestamp_ms=record.created_ms,
                )
            for record in metrics:
                producer.send(
                    topics.metrics(metric_owner(record.name) or "admin"),
                    codec.encode(record),
                    key=record.component.encode(),
                    timestamp_ms=record.created_ms,
                )
            for record in letters:
                producer.send(topics.deadletter("stream"), codec.encode(record), timestamp_ms=record.created_ms)
            producer.flush()
        _commit(log, STREAM_GROUP, topics.trajectories("main"), lag=2)
        _commit(log, TRAIN_GROUP, topics.samples("main"), lag=2)
    return RecordedRun(run_dir, {"main": main, "verifier": verifier}, samples, metrics)


def _commit(log: Log, group: str, topic: str, lag: int) -> None:
    """As a member of ``group``, commit every partition of ``topic`` to its end except ``lag``
    records of the fullest partition."""
    ends = log.end_offsets(topic)
    fullest = max(ends, key=ends.__getitem__)
    with log.consumer(group_id=group) as member:
        member.subscribe([topic])
        deadline = time.monotonic() + 10
        while len(member.assignment()) < len(ends) and time.monotonic() < deadline:
            member.poll(max_records=1, timeout=0.1)
        member.commit({TopicPartition(topic, p): end - (lag if p == fullest else 0) for p, end in ends.items()})
