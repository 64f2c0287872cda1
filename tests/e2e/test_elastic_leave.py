"""Elastic rollout, joining late and leaving on SIGTERM, with heterogeneous producers.

A producer started once the trainer has published several versions must catch up before it
produces: every token it generates carries a version at least the one current when it started.
It runs with its own region, hardware label and batch size. On SIGTERM it finishes its batch,
commits and exits 0; the remaining producer takes over its partitions, no task it committed is
redone after it left, and every submitted task is sampled. ``astraflow stats`` then shows both
producers with their region and hardware.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from astraflow.analysis.stats import collect_stats
from astraflow.log import open_log
from astraflow.runtime.attach import open_run
from astraflow.schemas.records import RolloutTask, Trajectory
from astraflow.weights.follow import WeightFollower
from tests.e2e.conftest import ASTRAFLOW, stop_processes, write_config
from tests.e2e.test_elastic import TopicReader, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
RUN = "leave"


def test_late_producer_catches_up_and_leaves_cleanly(run_dir: Path) -> None:
    config = write_config(
        run_dir / "test.yaml", run=RUN, rollout={"prompts_per_generation": 16}, train={"batch_samples": 128}
    )
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)

    def start(component: str, tag: str, *extra: str) -> subprocess.Popen:
        out = (logs / f"{tag}.out").open("wb")
        argv = [str(ASTRAFLOW), component, str(config), "--run-dir", str(run_dir), *extra]
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    processes = {name: start(name, name) for name in ("train", "stream", "feed")}
    processes["rollout-a"] = start("rollout", "rollout-a")
    log = open_log("embedded", path=run_dir / "log.sqlite")
    try:
        wait_until(
            lambda: (run_dir / "log.sqlite").exists() and f"{RUN}.weights.main" in log.list_topics(),
            120,
            "the run's topics",
        )
        versions = WeightFollower(log, f"{RUN}.weights.main", payload=False).start()
        trajectories = TopicReader(log, f"{RUN}.trajectories.main", Trajectory)
        assert versions.wait_for(3, timeout=300), "the trainer never reached version 3"

        joined_at = versions.latest_version
        processes["rollout-b"] = start(
            "rollout", "rollout-b", "--region", "eu-west", "--hardware", "cpu-slow", "--batch", "4"
        )
        late = f"-{processes['rollout-b'].pid}"

        def from_late() -> list[Trajectory]:
            return [t for t in trajectories.update() if t.producer_id.endswith(late)]

        wait_until(lambda: len({t.task_id for t in from_late()}) >= 8, 300, "two batches from the producer that joined")
        processes["rollout-b"].send_signal(signal.SIGTERM)
        assert processes["rollout-b"].wait(timeout=60) == 0, "the producer did not leave cleanly on SIGTERM"
        left_ms = int(time.time() * 1000)
        assert "left the rollout pool" in (logs / "rollout-b.out").read_text()

        reached = versions.latest_version
        assert versions.wait_for(reached + 2, timeout=300), "training stopped after a producer left"
        processes["feed"].send_signal(signal.SIGTERM)
        assert processes["feed"].wait(timeout=60) == 0
        tasks = TopicReader(log, f"{RUN}.tasks.math", RolloutTask)
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
        read = -1
        while read != len(trajectories.records):  # the rest of the topic, now that nothing appends
            read = len(trajectories.records)
            trajectories.update()
        log.close()

    late_ones = [t for t in trajectories.records if t.producer_id.endswith(late)]
    assert min(int(t.token_versions.min()) for t in late_ones) >= joined_at, (
        "the late producer sampled before catching up"
    )
    assert {(t.region, t.hardware) for t in late_ones} == {("eu-west", "cpu-slow")}
    redone = {t.task_id for t in trajectories.records if not t.producer_id.endswith(late) and t.created_ms > left_ms}
    assert not redone & {t.task_id for t in late_ones}, "tasks the leaving producer committed were redone"

    with open_run(config, run_dir) as attached:
        rows = {row.producer: row for row in collect_stats(attached).producers}
    late_row = next(row for name, row in rows.items() if name.endswith(late))
    assert (late_row.region, late_row.hardware) == ("eu-west", "cpu-slow") and late_row.trajectories == len(late_ones)
    assert len(rows) == 2 and all(row.trajectories > 0 for row in rows.values())
