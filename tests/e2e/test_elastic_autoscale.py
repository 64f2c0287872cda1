"""Autoscaling locally: ``astraflow run`` with the scaler grows a starved producer pool.

One producer sampling two prompts per generation cannot keep a trainer of 256-sample batches
busy, so the trainer waits most of the time (w well above 0.10) and the scaler asks for more
producers; ``astraflow run`` starts them. The test reads what the run left behind: the decisions
on the metrics topic (``metrics.jsonl``), the producers' logs and ``summary.json``. The run is
stopped as soon as the second producer has delivered trajectories (or after 1.5 min).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from astraflow.chaos.faults import FaultError, FaultInjector
from tests.e2e.conftest import ASTRAFLOW, stop_processes, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def producers_reported(run_dir: Path) -> set[str]:
    """Producer instances that have reported trajectories so far (complete lines of ``metrics.jsonl``)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return {row["labels"]["instance"] for row in map(json.loads, lines) if row["name"] == "rollout.trajectories"}


def test_scaler_grows_a_starved_pool(run_dir: Path) -> None:
    config = write_config(
        run_dir / "test.yaml",
        run="autoscale",
        rollout={"producers": 1, "prompts_per_generation": 2},
        train={"batch_samples": 256},
        scaler={
            "enabled": True,
            "min_producers": 1,
            "max_producers": 2,
            "window_s": 10,
            "interval_s": 3,
            "cooldown_s": 10,
        },
        # the first decision comes after ~10 s of training; the cap leaves room for a loaded machine
        # (make test runs two end-to-end tests at a time), the test stops the run once it has its answer
        stop={"max_minutes": 4, "target_accuracy": None},
    )
    with (run_dir / "launcher.out").open("wb") as out:
        launcher = subprocess.Popen(
            [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # once the second producer has delivered, the test has what it checks:
        # stop the run (SIGTERM, as an operator would)
        try:
            FaultInjector(run_dir, launcher, timeout_s=600, poll_s=0.5).wait_for(
                "a second producer's trajectories", lambda: len(producers_reported(run_dir)) >= 2
            )
            launcher.send_signal(signal.SIGTERM)
        except FaultError:
            pass  # the run ended first (stop.max_minutes): the assertions below say whether the pool grew
        launcher.wait(timeout=300)
    finally:
        stop_processes([launcher])
    assert launcher.returncode == 0, (run_dir / "launcher.out").read_text()[-3000:]

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    decisions = [m for m in metrics if m["name"] == "scaler.desired_producers"]
    assert decisions, "the scaler wrote no decision"
    assert all(1 <= m["value"] <= 2 and m["labels"]["reason"] for m in decisions)
    ups = [m for m in decisions if m["labels"]["rule"] == "up"]
    assert ups and float(ups[0]["labels"]["wait_fraction"]) > 0.10
    assert max(m["value"] for m in decisions) == 2
    assert (run_dir / "logs" / "rollout-1.out").exists(), "the pool did not start the second producer"
    producers = {m["labels"]["instance"] for m in metrics if m["name"] == "rollout.trajectories"}
    assert len(producers) == 2, producers
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["producer_seconds"] < 2 * summary["wall_seconds"]
