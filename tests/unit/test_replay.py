"""Offline replay's parts on a recorded run (``recorded_run.py``): the span, the byte-exact copy
that leaves the source's groups alone, the config checks, the replay pipeline and its stop rule."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np
import pytest
from fastavro import schemaless_writer

from astraflow.config import dump_config, load_config, parse_config
from astraflow.core.errors import ConfigError
from astraflow.infra.launch.replay import IDLE_S, ReplayMonitor, check_compatible, parse_time_ms, replay_config
from astraflow.infra.launch.replay_source import ORIGIN_HEADER, ReplaySource, ReplaySpan, plan_span
from astraflow.log import TopicPartition, TopicSpec, open_log
from astraflow.runtime.attach import open_run
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import MAGIC
from astraflow.schemas.store import writer_schema
from astraflow.streams.operators.advantage import sft_advantages
from astraflow.streams.operators.base import Group
from astraflow.streams.operators.pipeline import build_pipeline
from tests.unit.recorded_run import RUN, RecordedRun, record_run, trajectory

TOPIC = f"{RUN}.trajectories.main"


@pytest.fixture
def recorded(tmp_path: Path) -> RecordedRun:
    return record_run(tmp_path / "runs" / RUN)


def _read_all(log, topic: str) -> list:
    ends = log.end_offsets(topic)
    with log.consumer() as consumer:
        partitions = [TopicPartition(topic, p) for p in ends]
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        messages = []
        while len(messages) < sum(ends.values()):
            messages += consumer.poll(max_records=1000, timeout=1.0)
    return messages


def _copy(recorded: RecordedRun, target_path: Path, span: ReplaySpan) -> ReplaySource:
    with recorded.log() as source, open_log("embedded", path=target_path) as target:
        RunTopics("copy", "math", ("main",)).ensure(target, partitions=2)
        copier = ReplaySource(source, span, target, "copy.trajectories.main")
        copier.run(threading.Event())
    return copier


def test_span_bounds(recorded: RecordedRun) -> None:
    created = sorted(t.created_ms for t in recorded.trajectories["main"])
    with recorded.log() as log:
        ends = log.end_offsets(TOPIC)
        assert plan_span(log, TOPIC) == ReplaySpan(TOPIC, {p: 0 for p in ends}, ends)
        assert plan_span(log, TOPIC, from_offset=4).start == {p: min(4, end) for p, end in ends.items()}
        recent = plan_span(log, TOPIC, since_ms=created[-2])  # the two records stamped 10 s ago
        older = plan_span(log, TOPIC, until_ms=created[-2])
        with pytest.raises(ConfigError, match="at most one start"):
            plan_span(log, TOPIC, from_offset=1, since_ms=1)
    assert recent.total == 2 and older.total == 10 and older.end == recent.start


def test_copy_is_byte_exact_and_leaves_the_source_groups_alone(recorded: RecordedRun, tmp_path: Path) -> None:
    with recorded.log() as log:
        groups_before = log.group_offsets()
        span = plan_span(log, TOPIC)
        originals = _read_all(log, TOPIC)
    copier = _copy(recorded, tmp_path / "copy.sqlite", span)
    assert copier.finished.is_set() and copier.error is None and copier.copied == 12
    with open_log("embedded", path=tmp_path / "copy.sqlite") as target:
        copies = _read_all(target, "copy.trajectories.main")
    by_origin = {dict(m.headers)[ORIGIN_HEADER].decode(): m for m in copies}
    assert sorted(by_origin) == sorted(f"{TOPIC}/{m.partition}/{m.offset}" for m in originals)
    for original in originals:
        copy = by_origin[f"{TOPIC}/{original.partition}/{original.offset}"]
        assert (copy.value, copy.key) == (original.value, original.key)
    with recorded.log() as log:
        assert log.group_offsets() == groups_before


def test_copy_brings_an_unknown_writer_schema_along(recorded: RecordedRun, tmp_path: Path) -> None:
    extra = writer_schema(
        {
            "type": "record",
            "name": "Extra",
            "namespace": "astraflow",
            "fields": [{"name": "x", "type": "int", "doc": "a number"}],
        }
    )
    body = io.BytesIO()
    schemaless_writer(body, extra.parsed, {"x": 7})
    with recorded.log() as log:
        with LogSchemaStore(log) as schemas:
            schemas.add(extra)
        log.create_topic(TopicSpec("extra"))
        with log.producer() as producer:
            producer.send("extra", MAGIC + extra.fingerprint + body.getvalue())
        span = plan_span(log, "extra")
    _copy(recorded, tmp_path / "copy.sqlite", span)
    with open_log("embedded", path=tmp_path / "copy.sqlite") as target, LogSchemaStore(target) as schemas:
        assert schemas.get(extra.fingerprint).name == "astraflow.Extra"


def _config(**raw: object):
    return parse_config({"run": "again", **raw})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"run": RUN}, "run: the replay needs its own run name"),
        ({"policy": "solver"}, "policy: the source run has no topic demo.trajectories.solver"),
        ({"rollout": {"temperature": 0.7}}, "rollout.temperature: must equal the source run's"),
        ({"task": {"heldout_size": 100}}, "task: must equal the source run's"),
    ],
)
def test_incompatible_replay_configs_fail(recorded: RecordedRun, tmp_path: Path, raw: dict, message: str) -> None:
    with open_run(recorded.run_dir) as source, pytest.raises(ConfigError, match=message):
        check_compatible(_config(**raw), tmp_path / "new", source)


def test_replay_into_the_source_directory_fails(recorded: RecordedRun, tmp_path: Path) -> None:
    with open_run(recorded.run_dir) as source:
        assert check_compatible(_config(), tmp_path / "new", source) == TOPIC
        with pytest.raises(ConfigError, match="the source run's directory"):
            check_compatible(_config(), recorded.run_dir, source)


def test_source_backend_override_and_time_parsing(recorded: RecordedRun) -> None:
    with pytest.raises(ConfigError, match="bootstrap is required"):
        open_run(recorded.run_dir, backend="kafka")
    with open_run(recorded.run_dir) as source:
        assert source.name == RUN
    assert parse_time_ms("1970-01-01T00:00:01+00:00", "--since") == 1000
    with pytest.raises(ConfigError, match="--until: 'yesterday'"):
        parse_time_ms("yesterday", "--until")


@pytest.mark.parametrize(
    ("stream", "ops"),
    [
        ({}, ["grpo", "zero_variance"]),
        ({"advantage": "rloo", "drop_zero_variance": False}, ["rloo"]),
        ({"pipeline": [{"op": "staleness", "max_staleness": 4}, {"op": "grpo"}, {"op": "edf"}]}, ["grpo", "edf"]),
        ({"pipeline": [{"op": "reward_range", "low": 0.01}, {"op": "sft"}]}, ["reward_range", "sft"]),
    ],
)
def test_replay_pipeline_has_no_staleness_filter(tmp_path: Path, stream: dict, ops: list[str]) -> None:
    config = replay_config(_config(stream=stream))
    assert [spec.op for spec in config.stream.operators()] == ops
    dump_config(config, tmp_path / "config.yaml")  # the children load what was saved
    assert [spec.op for spec in load_config(tmp_path / "config.yaml").stream.operators()] == ops


@pytest.mark.parametrize(
    ("rewards", "min_reward", "expected"),
    [
        ([1.0, 0.0, 1.0, 0.0], 1.0, [1, 0, 1, 0]),
        ([0.2, 0.5, 0.9], 0.5, [0, 1, 1]),
        ([0.0, 0.0], 1.0, [0, 0]),
    ],
)
def test_sft_advantages(rewards: list[float], min_reward: float, expected: list[int]) -> None:
    assert sft_advantages(np.asarray(rewards), min_reward).tolist() == expected


def test_sft_pipeline_imitates_rewarded_groups_only() -> None:
    pipeline = build_pipeline(_config(stream={"pipeline": [{"op": "reward_range", "low": 0.01}, {"op": "sft"}]}).stream)
    solved = Group("g", [trajectory("main", "g", i, 0, float(i % 2), 0) for i in range(4)])
    unsolved = Group("h", [trajectory("main", "h", i, 0, 0.0, 0) for i in range(4)])
    assert pipeline.process(solved, trainer_version=50) is None  # version 50 vs token version 0: no staleness here
    assert solved.advantages.tolist() == [0, 1, 0, 1]
    assert pipeline.process(unsolved, trainer_version=0).startswith("reward_range")


class _FinishedSource:
    def __init__(self) -> None:
        self.finished = threading.Event()
        self.finished.set()
        self.error = None
        self.copied = 12


def test_monitor_stops_once_the_trainer_cannot_take_another_batch(tmp_path: Path) -> None:
    config = _config(train={"batch_samples": 4}, eval={"every_versions": 5})
    topics = RunTopics(config.run, config.workflow, (config.policy,))
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        topics.ensure(log, partitions=1)
        with log.producer() as producer:
            for topic in (topics.trajectories("main"), topics.samples("main")):
                for i in range(6):
                    producer.send(topic, b"x", key=b"g")
        monitor = ReplayMonitor(config, tmp_path, log, topics, _FinishedSource())
        assert monitor.left() == (6, 6) and monitor.done() is None
        with log.consumer(group_id="again.stream.main") as member:
            member.assign([TopicPartition(topics.trajectories("main"), 0)])
            member.commit({TopicPartition(topics.trajectories("main"), 0): 6})
        with log.consumer(group_id="again.train.main") as member:
            member.assign([TopicPartition(topics.samples("main"), 0)])
            member.commit({TopicPartition(topics.samples("main"), 0): 4})
        assert monitor.left() == (0, 2)
        assert monitor.done() is None  # used up; the last version's metrics get one more refresh
        monitor.version, monitor.accuracy = 7, {0: 0.3}
        assert monitor.done() is None  # version 7 is not scored yet (every 5 versions: 5 or later)
        monitor.accuracy[5] = 0.5
        assert monitor.done().startswith("replayed data used up: 12 trajectories copied")
        monitor.drain()


def test_monitor_takes_a_standing_stream_lag_for_cut_groups(tmp_path: Path) -> None:
    clock = [1000.0]
    config = _config(train={"batch_samples": 4})
    topics = RunTopics(config.run, config.workflow, (config.policy,))
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        topics.ensure(log, partitions=1)
        with log.producer() as producer:
            for i in range(6):
                producer.send(topics.trajectories("main"), b"x", key=b"g")
        monitor = ReplayMonitor(config, tmp_path, log, topics, _FinishedSource(), clock=lambda: clock[0])
        monitor.source.copied, monitor.accuracy = 6, {0: 0.3}
        assert monitor.done() is None
        clock[0] += IDLE_S + 1
        assert monitor.done() is None  # the stream processor has not committed anything yet: still starting
        with log.consumer(group_id="again.stream.main") as member:
            member.assign([TopicPartition(topics.trajectories("main"), 0)])
            member.commit({TopicPartition(topics.trajectories("main"), 0): 4})  # the last group was cut
        assert monitor.done() is None
        clock[0] += IDLE_S + 1
        assert monitor.done() is None  # used up; one more refresh for the last metrics
        assert monitor.done().startswith("replayed data used up: 6 trajectories copied, 2 left in cut groups")
        monitor.drain()
