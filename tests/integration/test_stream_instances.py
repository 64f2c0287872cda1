"""Two native stream processor instances of one policy, as ``astraflow stream --instance K`` processes, on both logs.

The instances share the trajectories topic's two partitions in the policy's consumer group, one
each. Every group's first two members come first: each instance journals the half-filled groups of
its partition in that partition's changelog and commits past them. Then every group's third member
arrives, and the instance that holds the second partition is killed (SIGKILL) as soon as it has
committed some of them (on Kafka, often with a transaction open). Then the fourth members arrive.
The surviving instance is given the dead one's partition, restores its three-member groups from
the changelog as last committed, reads on from the committed offsets, and finishes: every group is
reported once, every sample of the accepted groups is emitted once, and every record is committed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from astraflow.config import load_config
from astraflow.log import Log, TopicPartition
from astraflow.runtime.context import open_run_log
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.records import PromptStats, TrainSample
from tests.integration.test_faust_runtime import CODEC, GROUP, member

pytestmark = pytest.mark.timeout(300)
GROUPS = 400
"""Groups of ``member`` (every fifth with equal rewards, dropped; the others accepted)."""


class Instances:
    """A run's config and log, and its ``astraflow stream`` instances."""

    def __init__(self, log_target: dict[str, str], tmp_path: Path, unique: str) -> None:
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir()
        log = {"backend": log_target["backend"], "partitions": 2}
        if log_target["backend"] == "kafka":
            log["bootstrap"] = log_target["bootstrap"]
        self.config_path = self.run_dir / "config.yaml"
        raw = {
            "run": f"inst{unique}",
            "log": log,
            "rollout": {"group_size": GROUP},
            "stream": {"runtime": "native", "instances": 2},
        }
        self.config_path.write_text(yaml.safe_dump(raw))
        config = load_config(self.config_path)
        self.log: Log = open_run_log(config, self.run_dir)
        self.topics = RunTopics(config.run, "math", ("main",))
        self.topics.ensure(self.log, 2)
        self.source = self.topics.trajectories("main")
        self.group = f"{config.run}.stream.main"
        self.producer = self.log.producer()
        self.processes: dict[int, subprocess.Popen] = {}

    def produce(self, records: list[tuple[bytes, bytes]]) -> None:
        for key, value in records:
            self.producer.send(self.source, value, key=key)
        self.producer.flush()

    def start(self, instance: int) -> subprocess.Popen:
        out = (self.run_dir / f"instance-{instance}.out").open("wb")
        argv = [sys.executable, "-m", "astraflow.cli", "stream", str(self.config_path)]
        argv += ["--run-dir", str(self.run_dir), "--instance", str(instance)]
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.processes[instance] = process
        return process

    def output(self, instance: int) -> str:
        return (self.run_dir / f"instance-{instance}.out").read_text(errors="replace")

    def holds(self, instance: int) -> set[int]:
        """The input partitions ``instance`` holds, from what it logged taking and giving up."""
        held: set[int] = set()
        for line in self.output(instance).splitlines():
            words = line.split()
            if "took input partition" in line:
                held.add(int(words[words.index("partition") + 1]))
            elif "gave up input partition" in line or "dropped its state of input partition" in line:
                held.discard(int(words[words.index("partition") + 1]))
        return held

    def committed(self) -> dict[int, int]:
        offsets = self.log.group_offsets().get(self.group, {})
        return {tp.partition: offset for tp, offset in offsets.items() if tp.topic == self.source}

    def read(self, topic: str, record: type) -> list:
        consumer = self.log.consumer(group_id=None)
        partitions = [TopicPartition(topic, p) for p in range(self.log.describe_topic(topic).partitions)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        ends = self.log.end_offsets(topic)
        records = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends.get(tp.partition, 0) for tp in partitions):
            assert time.monotonic() < deadline, f"reading {topic} did not reach its end"
            records += [CODEC.decode(m.value, expect=record) for m in consumer.poll(max_records=10_000, timeout=0.5)]
        consumer.close()
        return records

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        self.producer.close()
        self.log.close()


def wait_for(condition: Callable[[], bool], timeout: float, what: str, instances: Instances, *alive: int) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for instance in alive:
            process = instances.processes[instance]
            assert process.poll() is None, (
                f"instance {instance} exited with {process.returncode} while waiting for {what}:\n"
                + instances.output(instance)[-3000:]
            )
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}:\n" + "\n".join(
            f"instance {instance}: ...{instances.output(instance)[-1500:]}" for instance in alive
        )
        time.sleep(0.05)


@pytest.fixture
def instances(log_target: dict[str, str], tmp_path: Path, unique: str):
    made = Instances(log_target, tmp_path, unique)
    yield made
    made.close()


def test_two_instances_split_the_partitions_and_one_finishes_what_the_other_left(instances: Instances) -> None:
    run = instances
    run.produce([member(g, i) for g in range(GROUPS) for i in (0, 1)])
    half = run.log.end_offsets(run.source)
    assert all(half.get(p, 0) > 0 for p in (0, 1)), half  # both partitions hold groups
    run.start(0)
    run.start(1)
    wait_for(lambda: sorted(map(len, map(run.holds, (0, 1)))) == [1, 1], 120, "one partition each", run, 0, 1)
    (victim,) = run.holds(1)
    assert run.holds(0) == {1 - victim}
    wait_for(lambda: run.committed() == half, 120, "both partitions committed past the half-filled groups", run, 0, 1)
    assert run.read(run.topics.feedback(), PromptStats) == []  # every group is half full, held in the changelogs

    run.produce([member(g, 2) for g in range(GROUPS)])
    wait_for(lambda: run.committed()[victim] > half[victim], 120, "instance 1 to commit third members", run, 0, 1)
    run.processes[1].send_signal(signal.SIGKILL)
    run.processes[1].wait()
    run.produce([member(g, 3) for g in range(GROUPS)])

    ends = run.log.end_offsets(run.source)
    wait_for(lambda: run.committed() == ends, 150, "instance 0 to commit every record of both partitions", run, 0)
    assert run.holds(0) == {0, 1}  # it took the dead instance's partition over
    run.processes[0].send_signal(signal.SIGTERM)
    assert run.processes[0].wait(timeout=60) == 0, run.output(0)[-3000:]

    reported = Counter(s.group_id for s in run.read(run.topics.feedback(), PromptStats))
    assert set(reported) == {f"g{g}" for g in range(GROUPS)} and max(reported.values()) == 1
    emitted = Counter(s.sample_id for s in run.read(run.topics.samples("main"), TrainSample))
    assert set(emitted) == {f"g{g}/{i}" for g in range(GROUPS) if g % 5 for i in range(GROUP)}
    assert max(emitted.values()) == 1
