"""Per-producer throughput and version lag (dashboard and ``astraflow stats``) from metric records."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.analysis.producer_stats import ProducerTally, producer_rows
from astraflow.analysis.stats import collect_stats
from astraflow.runtime.attach import open_run
from astraflow.schemas.records import Metric
from tests.unit.recorded_run import record_run


def rollout(name: str, value: float, ms: int, instance: str, **labels: str) -> Metric:
    return Metric("rollout", name, value, 0, ms, {"instance": instance, **labels})


def test_rows_per_producer() -> None:
    eu = {"region": "eu-west", "hardware": "a10g"}
    metrics = [
        rollout("rollout.trajectories", 64, 0, "rollout-eu", policy="main", **eu),
        rollout("rollout.version_lag", 2, 0, "rollout-eu", policy="main", **eu),
        rollout("rollout.trajectories", 128, 10_000, "rollout-eu", policy="main", **eu),
        rollout("rollout.version_lag", 0, 10_000, "rollout-eu", policy="main", **eu),
        rollout("rollout.trajectories", 640, 100_000, "rollout-eu", policy="main", **eu),
        rollout("rollout.trajectories", 16, 95_000, "rollout-us", policy="main", region="us", hardware="cpu"),
        rollout("rollout.trajectories", 8, 95_000, "rollout-us", policy="verifier", region="us", hardware="cpu"),
        rollout("rollout.trajectories", 32, 100_000, "rollout-us", policy="main", region="us", hardware="cpu"),
    ]
    rows = {row.producer: row for row in producer_rows(metrics, window_s=60)}
    eu_row, us_row = rows["rollout-eu"], rows["rollout-us"]
    assert (eu_row.region, eu_row.hardware, eu_row.trajectories) == ("eu-west", "a10g", 640)
    assert eu_row.per_s == pytest.approx(576 / 100)
    assert eu_row.recent_per_s == pytest.approx(512 / 90)  # from the last report before the window
    assert (eu_row.version_lag, eu_row.mean_version_lag) == (0, 1)
    assert us_row.trajectories == 40 and us_row.per_s == pytest.approx(16 / 5)  # policies summed


def test_tally_keeps_the_newest_scaler_decision() -> None:
    tally = ProducerTally()
    assert tally.desired is None
    for value, ms in ((3, 2_000), (2, 1_000)):
        tally.observe(Metric("scale", "scaler.desired_producers", value, 0, ms, {"rule": "up", "reason": "why"}))
    assert tally.desired == 3 and tally.decision.reason == "why"
    assert tally.rows() == []


def test_stats_show_the_producers_of_a_recorded_run(tmp_path: Path) -> None:
    recorded = record_run(tmp_path / "run")
    with open_run(recorded.run_dir) as run:
        rows = collect_stats(run).producers
    assert [(r.producer, r.version_lag, r.mean_version_lag) for r in rows] == [
        ("rollout-a", 0, 1 / 3),
        ("rollout-b", 1, 1),
    ]
