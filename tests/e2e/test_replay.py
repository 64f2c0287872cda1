"""Offline replay end to end: a run's logged trajectories train a fresh base model.

A short ``astraflow run`` of the math example records the source; ``astraflow replay`` then copies
its trajectory topic into a new run and trains the warmed-up base on it with off-policy GRPO
(``examples/math/replay.yaml``), with the stream processor, trainer and evaluator as processes.
The source's consumer groups must not notice.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from astraflow.log import open_log
from tests.e2e.conftest import ASTRAFLOW, EXAMPLE, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

REPLAY_EXAMPLE = EXAMPLE.with_name("replay.yaml")


def astraflow(*args: str, timeout: float) -> None:
    result = subprocess.run([str(ASTRAFLOW), *args, "--no-dashboard"], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def test_replay_trains_a_fresh_base_from_a_recorded_run(run_dir: Path, tmp_path: Path) -> None:
    source = write_config(run_dir / "source.yaml", run="recorded", stop={"max_minutes": 3})
    astraflow("run", str(source), "--run-dir", str(run_dir), timeout=600)
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        groups = log.group_offsets()
        recorded = sum(log.end_offsets("recorded.trajectories.main").values())

    raw = yaml.safe_load(REPLAY_EXAMPLE.read_text())
    raw.update(run="replayed", stop={"max_minutes": 5})
    config = tmp_path / "replay.yaml"
    config.write_text(yaml.safe_dump(raw))
    replay_dir = tmp_path / "replay"
    astraflow("replay", str(config), "--source", str(run_dir), "--run-dir", str(replay_dir), timeout=600)

    summary = json.loads((replay_dir / "summary.json").read_text())
    section = summary["replay"]
    assert section["copied"] == section["planned"] == recorded > 0, section
    assert section["stop_reason"].startswith("replayed data used up"), section
    assert section["pipeline"] == ["grpo", "zero_variance"]
    rows = [json.loads(line) for line in (replay_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = {row["step"]: row["value"] for row in rows if row["name"] == "eval.accuracy"}
    assert len(accuracy) >= 3 and summary["versions"] >= 10, summary
    # only logged data, no new rollouts: the fresh base learns from the source run's trajectories
    assert summary["best_accuracy"] >= summary["base_accuracy"] + 0.10, accuracy
    assert (replay_dir / "report.png").stat().st_size > 10_000
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        assert log.group_offsets() == groups  # the source run's consumer groups are untouched
