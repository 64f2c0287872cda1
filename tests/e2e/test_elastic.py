"""Elastic rollout: a producer joins mid-run and takes tasks; killing one loses no task.

The components run as separate ``astraflow`` processes on one embedded log. The test only
watches the log (weights manifests, trajectory records) and waits on conditions with deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from astraflow.log import Log, TopicPartition, open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import RolloutTask, Trajectory
from astraflow.weights.follow import WeightFollower
from tests.e2e.conftest import ASTRAFLOW, stop_processes, write_config

# a cold warm-up (no cached base checkpoint) is part of the first test that needs it
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"


class TopicReader:
    """Reads every record of a topic so far, incrementally, decoded."""

    def __init__(self, log: Log, topic: str, record_type: type) -> None:
        self.codec = Codec()
        self.record_type = record_type
        self.records: list = []
        self.consumer = log.consumer()
        partitions = [TopicPartition(topic, p) for p in range(log.describe_topic(topic).partitions)]
        self.consumer.assign(partitions)
        self.consumer.seek_to_beginning(partitions)

    def update(self) -> list:
        for message in self.consumer.poll(max_records=5000, timeout=0.2):
            self.records.append(self.codec.decode(message.value, expect=self.record_type))
        return self.records


def test_producer_joins_and_a_killed_producer_loses_no_task(run_dir: Path) -> None:
    config = write_config(run_dir / "test.yaml", run="elastic", rollout={"prompts_per_generation": 16})
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)

    def start(component: str, tag: str) -> subprocess.Popen:
        out = (logs / f"{tag}.out").open("wb")
        return subprocess.Popen(
            [str(ASTRAFLOW), component, str(config), "--run-dir", str(run_dir)], stdout=out, stderr=subprocess.STDOUT
        )

    processes = {name: start(name, name) for name in ("train", "stream", "feed")}
    processes["rollout-a"] = start("rollout", "rollout-a")
    log = open_log("embedded", path=run_dir / "log.sqlite")
    try:
        wait_until(
            lambda: (run_dir / "log.sqlite").exists() and "elastic.weights.main" in log.list_topics(),
            120,
            "the run's topics",
        )
        versions = WeightFollower(log, "elastic.weights.main", payload=False).start()
        trajectories = TopicReader(log, "elastic.trajectories.main", Trajectory)
        assert versions.wait_for(2, timeout=300), "the trainer never reached version 2"

        processes["rollout-b"] = start("rollout", "rollout-b")
        joined = f"-{processes['rollout-b'].pid}"
        wait_until(
            lambda: any(t.producer_id.endswith(joined) for t in trajectories.update()),
            300,
            "trajectories from the producer that joined",
        )

        os.kill(processes["rollout-a"].pid, signal.SIGKILL)
        processes["rollout-a"].wait()
        reached = versions.latest_version
        assert versions.wait_for(reached + 3, timeout=300), "training stopped after a producer was killed"

        processes["feed"].send_signal(signal.SIGTERM)
        assert processes["feed"].wait(timeout=60) == 0
        tasks = TopicReader(log, "elastic.tasks.math", RolloutTask)
        wait_until(
            lambda: len(tasks.update()) > 0 and not any(tasks.consumer.lag().values()), 60, "all submitted tasks"
        )
        submitted = {task.task_id for task in tasks.records}
        wait_until(
            lambda: submitted <= {t.task_id for t in trajectories.update()}, 300, "every submitted task to be sampled"
        )
        versions.close()
    finally:
        stop_processes(processes.values())
        log.close()
    producers = {t.producer_id.rsplit("-", 1)[-1] for t in trajectories.records}
    assert {str(processes["rollout-a"].pid), str(processes["rollout-b"].pid)} <= producers
