"""The rollout producer commits a batch's trajectories with its task offsets (issue #21), on both backends.

A producer that dies between sending a batch's trajectories and committing leaves none of them
visible, and the producer that takes over writes each task's trajectories exactly once; a zombie
(an older owner of a tasks partition whose batch outlived its group membership) commits nothing
once the newer owner opened the partition's transactional producer. ``RolloutProducer.run`` runs
for real; only its engine (a script) and its weight follower (no weights) stand in.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from astraflow.engines.base import Generation
from astraflow.log.embedded import groups as embedded_groups
from astraflow.producers.rollout import component as rollout
from astraflow.producers.rollout.component import RolloutProducer
from astraflow.schemas.records import RolloutTask, Trajectory
from tests.integration.crashes import Death, DyingLog, Killed, committed, context, read_all, running, wait_for

TASKS = 6
RAW = {"rollout": {"group_size": 2, "prompts_per_generation": 2}}


class ScriptedEngine:
    """Answers every prompt with "2"; ``hold`` (if given) is waited on in the first generation."""

    def __init__(self, hold: threading.Event | None = None, version: int = 0) -> None:
        self.hold = hold
        self.version = version
        self.generating = threading.Event()

    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float) -> list[list[Generation]]:
        self.generating.set()
        if self.hold is not None:
            self.hold.wait()
            self.hold = None
        ids = np.array([5, 1], dtype=np.int32)
        answer = Generation(np.array([3, 4], dtype=np.int32), ids, np.full(2, -0.5, dtype=np.float32), "2", "stop")
        return [[answer] * n for _ in prompts]


class NoWeights:
    """A weight follower of a topic where nothing is published: the base weights are version 0."""

    latest_version = newest_version = 0
    taken_published_ms = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def start(self) -> "NoWeights":
        return self

    def take(self) -> None:
        return None

    def wait_for(self, version: int, timeout: float) -> bool:
        return version <= self.latest_version

    def wait_caught_up(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass


def producer(ctx, monkeypatch: pytest.MonkeyPatch, region: str, engine: ScriptedEngine) -> RolloutProducer:
    monkeypatch.setattr(rollout, "follow_weights", lambda ctx, policy, payload: NoWeights())
    monkeypatch.setattr(rollout, "base_checkpoint_path", lambda config, run_dir: run_dir)
    monkeypatch.setattr(rollout, "build_engine", lambda config, checkpoint: engine)
    return RolloutProducer(ctx, region=region)


def submit_tasks(ctx, ids: list[str], partition: int | None = None, version: int | None = None) -> list[str]:
    """Tasks of ``ids``; with ``version``, released at that version of main, as a lockstep feeder releases them."""
    metadata = {} if version is None else {"version.main": str(version)}
    for task_id in ids:
        task = RolloutTask(task_id, task_id[:-2], task_id, "math", "1+1=", "2", 2, 0, 0, metadata)
        ctx.producer.send(ctx.topics.tasks(), ctx.codec.encode(task), key=task_id.encode(), partition=partition)
    ctx.producer.flush()
    return ids


def wait_until_every_task_is_committed(ctx, raised: list[BaseException]) -> None:
    group, topic = f"{ctx.config.run}.rollout.math", ctx.topics.tasks()
    ends = {p: end for p, end in ctx.log.end_offsets(topic).items() if end > 0}
    wait_for(lambda: committed(ctx, group, topic) == ends or bool(raised), f"{group} commits {ends}")


def run_until_every_task_is_committed(ctx, rollout_producer: RolloutProducer) -> None:
    stop = threading.Event()
    with running(lambda: rollout_producer.run(stop)) as raised:
        wait_until_every_task_is_committed(ctx, raised)
        stop.set()
    assert raised == []


def trajectories(ctx) -> list[Trajectory]:
    return read_all(ctx, ctx.topics.trajectories("main"))


def test_a_batch_killed_before_its_commit_is_never_seen_and_redone_exactly_once(
    log_target: dict[str, str], backend: str, tmp_path: Path, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = context(log_target, tmp_path, "rollout", {**RAW, "run": f"rkill{unique}"})
    try:
        ids = submit_tasks(ctx, [f"p{i}@0" for i in range(TASKS)])
        log, death = ctx.log, Death()
        ctx.log = DyingLog(log, death)
        with pytest.raises(Killed):
            producer(ctx, monkeypatch, "first", ScriptedEngine()).run(threading.Event())
        topic = ctx.topics.trajectories("main")
        if backend == "embedded":  # the log writes a transaction only at its commit
            assert sum(log.end_offsets(topic).values()) == 0, "the killed batch's trajectories were written"
        else:  # they reached the broker, in a transaction left open; read_all below reads every
            # committed record, and finds none of them: the restart's producer aborted it
            wait_for(lambda: sum(log.end_offsets(topic).values()) > 0, "the killed batch on the broker")
        run_until_every_task_is_committed(ctx, producer(ctx, monkeypatch, "second", ScriptedEngine()))
        seen = trajectories(ctx)
    finally:
        ctx.close()
    assert sorted(t.trajectory_id for t in seen) == sorted(f"{task}/{i}" for task in ids for i in range(2))
    assert {t.region for t in seen} == {"second"}


def test_a_zombie_producer_commits_nothing_once_a_newer_one_owns_its_partition(
    log_target: dict[str, str], backend: str, tmp_path: Path, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = {**RAW, "run": f"rzombie{unique}"}
    zombie_ctx, ctx = (context(log_target, tmp_path, "rollout", raw) for _ in range(2))
    stall_too_long(backend, monkeypatch, [zombie_ctx, ctx])
    try:
        ids = submit_tasks(ctx, [f"p{i}@0" for i in range(TASKS)])
        hold = threading.Event()
        engine = ScriptedEngine(hold)
        zombie, stop_zombie = producer(zombie_ctx, monkeypatch, "zombie", engine), threading.Event()
        with running(lambda: zombie.run(stop_zombie)) as zombie_raised:
            engine.generating.wait(timeout=60)
            # the zombie's generation outlasts its membership: the group gives its partitions to the
            # newer producer, which opens their transactional producers and redoes every task
            run_until_every_task_is_committed(ctx, producer(ctx, monkeypatch, "newer", ScriptedEngine()))
            # the zombie's batch is done at last: its commit fails, and back in the group it goes on
            # from what the newer producer committed, with the next task of each partition
            later = [submit_tasks(ctx, [f"q{p}@0"], partition=p)[0] for p in (0, 1)]
            hold.set()
            wait_until_every_task_is_committed(ctx, zombie_raised)
            stop_zombie.set()
        assert zombie_raised == [], "a fenced producer hands its tasks back and goes on"
        seen = trajectories(ctx)
    finally:
        zombie_ctx.close()
        ctx.close()
    assert sorted(t.trajectory_id for t in seen) == sorted(f"{task}/{i}" for task in ids + later for i in range(2))
    assert {t.region for t in seen if t.task_id in ids} == {"newer"}


def test_a_producer_stopped_while_waiting_for_weights_hands_its_tasks_back(
    log_target: dict[str, str], backend: str, tmp_path: Path, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lockstep: the tasks were released at version 1, which this producer has not taken in when it is
    # stopped. Run at version 0 their samples would be stale and dropped, and lockstep replaces no stale
    # group (the trainer would wait for them for ever): they stay uncommitted for the next owner instead
    ctx = context(log_target, tmp_path, "rollout", {**RAW, "run": f"rwait{unique}"})
    try:
        ids = submit_tasks(ctx, [f"p{i}@0" for i in range(TASKS)], version=1)
        waiting = threading.Event()

        class Behind(NoWeights):
            def wait_for(self, version: int, timeout: float) -> bool:
                if version > self.latest_version:  # not the catch-up's wait for version 0
                    waiting.set()
                return super().wait_for(version, timeout)

        monkeypatch.setattr(rollout, "base_checkpoint_path", lambda config, run_dir: run_dir)
        monkeypatch.setattr(rollout, "build_engine", lambda config, checkpoint: ScriptedEngine())
        behind, stop = RolloutProducer(ctx, region="behind"), threading.Event()
        monkeypatch.setattr(rollout, "follow_weights", lambda ctx, policy, payload: Behind())
        with running(lambda: behind.run(stop)) as raised:
            wait_for(waiting.is_set, "the producer waiting for version 1")
            stop.set()
        assert raised == []
        assert committed(ctx, f"{ctx.config.run}.rollout.math", ctx.topics.tasks()) == {}
        assert trajectories(ctx) == []
        run_until_every_task_is_committed(ctx, producer(ctx, monkeypatch, "next", ScriptedEngine(version=1)))
        seen = trajectories(ctx)
    finally:
        ctx.close()
    assert sorted(t.trajectory_id for t in seen) == sorted(f"{task}/{i}" for task in ids for i in range(2))
    assert {t.region for t in seen} == {"next"} and {int(t.token_versions.min()) for t in seen} == {1}


class ShortSessions:
    """``log`` whose group members hold their partitions for 1 s after their last heartbeat, not 10 s."""

    def __init__(self, log) -> None:
        self._log = log

    def __getattr__(self, name: str):
        return getattr(self._log, name)

    def consumer(self, group_id: str | None = None, auto_offset_reset: str = "earliest", session_timeout_s: float = 10):
        return self._log.consumer(group_id, auto_offset_reset, session_timeout_s=1.0)


def stall_too_long(backend: str, monkeypatch: pytest.MonkeyPatch, contexts: list) -> None:
    """Make a member that has not polled for 2 s (not 5 minutes) lose its partitions a second later, as a
    producer whose generation took too long would: the embedded log's heartbeat stops, librdkafka
    leaves the group."""
    for ctx in contexts:
        ctx.log = ShortSessions(ctx.log)
    if backend == "embedded":
        monkeypatch.setattr(embedded_groups, "MAX_POLL_INTERVAL_S", 2.0)
        return
    from astraflow.log.kafka import log as kafka
    from astraflow.log.kafka.consumer import KafkaConsumer

    def stalling(config: dict, **kwargs: object) -> KafkaConsumer:
        return KafkaConsumer({**config, "max.poll.interval.ms": 2000}, **kwargs)

    monkeypatch.setattr(kafka, "KafkaConsumer", stalling)
