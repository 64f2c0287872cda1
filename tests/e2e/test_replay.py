"""Offline replay end to end: a run's logged trajectories train a fresh base model.

The math example's recorded run (the ``math_run`` fixture, shared with ``test_learning``) is the source;
``astraflow replay`` then copies its trajectory topic into a new run and trains the warmed-up base on it
with off-policy GRPO
(``examples/math/replay.yaml``), with the stream processor, trainer and evaluator as processes.
The source's consumer groups must not notice.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from astraflow.infra.launch.monitor import gain_over_base
from astraflow.log import open_log
from astraflow.streams.runtimes.changelog import Changelog
from astraflow.streams.runtimes.offline import state_key
from tests.e2e.conftest import ASTRAFLOW, EXAMPLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

REPLAY_EXAMPLE = EXAMPLE.with_name("replay.yaml")


def astraflow(*args: str, timeout: float) -> None:
    result = subprocess.run([str(ASTRAFLOW), *args, "--no-dashboard"], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def replay_math_run(math_run: Path, tmp_path: Path) -> tuple[Path, dict, dict[int, float]]:
    """``astraflow replay`` of the recorded math run into a fresh base: its directory, its summary and
    its held-out accuracy by version, after the checks every replay must pass."""
    run_dir = math_run  # the recorded run of tests/e2e/test_learning.py
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        groups = log.group_offsets()
        recorded = sum(log.end_offsets("learn.trajectories.main").values())

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
    accuracy = {int(row["step"]): row["value"] for row in rows if row["name"] == "eval.accuracy"}
    assert len(accuracy) >= 3 and summary["versions"] >= 10, summary
    assert (replay_dir / "report.png").stat().st_size > 10_000
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        assert log.group_offsets() == groups  # the source run's consumer groups are untouched
    return replay_dir, summary, accuracy


def test_replay_trains_a_fresh_base_from_a_recorded_run(math_run: Path, tmp_path: Path) -> None:
    """Only logged data, no new rollouts: every recorded trajectory is copied, the stream and trainer
    run on it until it is used up, the evaluator scores the versions, the source is left untouched."""
    replay_math_run(math_run, tmp_path)


@pytest.mark.long
def test_a_fresh_base_learns_from_a_whole_replayed_run(math_run: Path, tmp_path: Path) -> None:
    """The fresh base learns from the source run's trajectories, on the mean of its last two
    evaluations (the run stops when the replayed data is used up, never on the accuracy asserted).

    Not reliable yet, so out of ``make test``: off-policy GRPO on the whole 80-version run rises and
    then falls as the data grows more off-policy (a CI run: 0.38, 0.5 at version 15, 0.47 at 25,
    0.4 at 60, 0.255 at 80 - mean of the last two 0.30); other runs held 0.48 and more to the end."""
    _, _, accuracy = replay_math_run(math_run, tmp_path)
    assert gain_over_base(accuracy) >= 0.10, accuracy


def test_a_recorded_topic_mixes_into_an_online_run(math_run: Path, run_dir: Path) -> None:
    """The mixer's offline source: a new online run takes a third of its samples from the
    recorded run's trajectory topic, read from that run's log, which it never writes to; its
    position there is journaled in the new run's stream changelog."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw.update(run="mixed", stop={"max_minutes": 3, "max_versions": 6})
    raw["stream"] = {
        "max_staleness": 0,
        "pipeline": [
            {"op": "staleness"},
            {"op": "grpo"},
            {"op": "zero_variance"},
            {"op": "offline", "topic": "learn.trajectories.main", "source": str(math_run), "weight": 0.33},
        ],
    }
    config = run_dir / "mixed.yaml"
    config.write_text(yaml.safe_dump(raw))
    with open_log("embedded", path=math_run / "log.sqlite") as log:
        groups = {name: offsets for name, offsets in log.group_offsets().items() if name.startswith("learn.")}
    astraflow("run", str(config), "--run-dir", str(run_dir), timeout=600)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["versions"] >= 6, summary
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fed = {}  # each input partition's source counts the groups of its share
    for row in rows:
        if row["name"] == "stream.offline_groups":
            key = (row["component"], row["labels"]["partition"])
            fed[key] = max(fed.get(key, 0.0), row["value"])
    offline = sum(fed.values())
    accepted = max(row["value"] for row in rows if row["name"] == "stream.accepted_groups")
    assert 0.25 <= offline / (offline + accepted) <= 0.45, (offline, accepted)  # fed groups ≈ a third of all
    with open_log("embedded", path=math_run / "log.sqlite") as log:
        after = {name: offsets for name, offsets in log.group_offsets().items() if name.startswith("learn.")}
        assert after == groups  # the recorded run's own consumer groups are untouched
        assert not any(name.startswith("mixed.") for name in log.group_offsets())  # and it was only read
    topic = "mixed.stream.main.changelog"
    with open_log("embedded", path=run_dir / "log.sqlite") as log:  # the sources' positions: in this run's changelog
        tables = [Changelog.load(log, topic, p).table for p in range(log.describe_topic(topic).partitions)]
    states = [json.loads(table[state_key(0)]) for table in tables if state_key(0) in table]  # one per input partition
    fed_committed = sum(state["fed"] for state in states)
    assert 0 < fed_committed <= offline, states  # the metric may lead its commit
    assert states and all(sum(state["next"].values()) > 0 for state in states), states
