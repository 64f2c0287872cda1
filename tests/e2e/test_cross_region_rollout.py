"""Cross-region rollout: the only producer runs in a network namespace behind a slow link.

Trainer, stream processor and feeder run on the host against the real Kafka broker; one
``astraflow rollout`` runs in a ``RemoteRegion`` (``tc tbf`` at 20 Mbit/s each way, 150 ms added
each way by the delay proxy in front of the broker). The run must train on its trajectories alone,
each labelled with the region, and the producer must still leave cleanly on SIGTERM across the link.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from astraflow.chaos.netns import RemoteRegion
from astraflow.core.errors import LogError
from astraflow.log import Log, open_log
from astraflow.schemas.records import Trajectory
from astraflow.weights.follow import WeightFollower
from tests._broker import unavailable
from tests.e2e.conftest import ASTRAFLOW, stop_processes, write_config
from tests.e2e.test_elastic import TopicReader, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(1800)]


def has_leader(log: Log, topic: str) -> bool:
    """The topic exists and its partitions have a leader (a new Kafka topic has none for a moment)."""
    try:
        return topic in log.list_topics() and bool(log.end_offsets(topic))
    except LogError:
        return False


def test_remote_producer_feeds_the_trainer_over_a_slow_link(run_dir: Path, kafka_bootstrap: str, unique: str) -> None:
    reason = RemoteRegion.available()
    if reason is not None:
        unavailable(reason)
    run = f"xr{unique}"
    config = write_config(
        run_dir / "test.yaml",
        run=run,
        log={"backend": "kafka", "bootstrap": kafka_bootstrap, "partitions": 2},
        rollout={"prompts_per_generation": 16},
        train={"batch_samples": 128},
    )
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)

    def start(argv: list[str], tag: str) -> subprocess.Popen:
        return subprocess.Popen(argv, stdout=(logs / f"{tag}.out").open("wb"), stderr=subprocess.STDOUT)

    base = [str(config), "--run-dir", str(run_dir)]
    processes = {name: start([str(ASTRAFLOW), name, *base], name) for name in ("train", "stream", "feed")}
    with RemoteRegion("e2e", rate_mbit=20, delay_ms=150) as region, open_log("kafka", bootstrap=kafka_bootstrap) as log:
        try:
            address = region.expose(kafka_bootstrap)
            remote = [
                str(ASTRAFLOW),
                "rollout",
                *base,
                "--bootstrap",
                address,
                "--region",
                "remote-e2e",
                "--hardware",
                "cpu-netns",
            ]
            processes["rollout"] = start(region.argv(remote), "rollout")
            wait_until(lambda: has_leader(log, f"{run}.weights.main"), 180, "the run's topics and their leaders")
            versions = WeightFollower(log, f"{run}.weights.main", payload=False).start()
            assert versions.wait_for(3, timeout=600), "the trainer never reached version 3 on remote trajectories"
            versions.close()
            trajectories = TopicReader(log, f"{run}.trajectories.main", Trajectory)
            wait_until(lambda: len(trajectories.update()) > 0, 60, "the trajectories")
            processes["rollout"].send_signal(signal.SIGTERM)
            assert processes["rollout"].wait(timeout=120) == 0, "the remote producer did not leave cleanly"
        finally:
            stop_processes(processes.values())
    assert {(t.region, t.hardware) for t in trajectories.records} == {("remote-e2e", "cpu-netns")}
    assert max(int(t.token_versions.max()) for t in trajectories.records) >= 1, (
        "the remote producer never loaded a trained version"
    )
    assert "left the rollout pool" in (logs / "rollout.out").read_text()
