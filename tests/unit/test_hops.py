"""The version chain of ``astraflow stats`` (``analysis/hops.py``) on a synthetic run whose hops are known.

Run ``chain`` (policy ``main``, one samples partition) publishes versions 0-4; every record is
stamped by hand (ms):

- v0 (start entry, 1000): its tasks released before it, at 500 and 900 -> skipped as ``start``;
- v1 (2000): tasks g1a 2010, g1b 2030; trajectories g1b 2090, g1a 2100; samples g1b 2300 (offset 2),
  g1a 2500 and 2450 (offsets 3-4); v2's entry consumed offsets 2-5, newest 2500; applied by two
  producers after 30 and 50 ms; v2's optimizer step 0.45 s;
- v2 (3000): task 3020, trajectory 3200, samples 3300 and 3700; v3 (4500) consumed them; applied
  after 40 ms by one producer; v3's step 0.7 s;
- v3 (4500): a task at 4520 and nothing generated -> skipped, ``no trajectory``;
- v4 (5000): the newest -> skipped, ``no next version``.

So v1's hops are 10, 80, 210, 700 (200 + 500), period 1000; v2's 20, 180, 100, 1200 (400 + 800),
period 1500.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astraflow.analysis.hops import HopRow, percentile
from astraflow.analysis.stats import collect_stats
from astraflow.cli import app
from astraflow.config import dump_config, parse_config
from astraflow.log import open_log
from astraflow.runtime.attach import open_run
from astraflow.runtime.control import metric_owner
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import LedgerEntry, Metric, OffsetRange, RolloutTask, TrainSample
from tests.unit.recorded_run import trajectory

RUN = "chain"
PUBLISHED = {0: 1000, 1: 2000, 2: 3000, 3: 4500, 4: 5000}
TASKS = [("g0a", 0, 500), ("g0b", 0, 900), ("g1a", 1, 2010), ("g1b", 1, 2030), ("g2a", 2, 3020), ("g3a", 3, 4520)]
TRAJECTORIES = [("g0a", 0, 1200), ("g0b", 0, 1300), ("g1a", 1, 2100), ("g1b", 1, 2090), ("g1a", 1, 2150)]
TRAJECTORIES += [("g2a", 2, 3200)]
SAMPLES = [("g0a", 1400), ("g0b", 1450), ("g1b", 2300), ("g1a", 2500), ("g1a", 2450), ("g2a", 3300), ("g2a", 3700)]
CONSUMED = {1: (0, 2), 2: (2, 5), 3: (5, 7), 4: (7, 7)}
"""Samples offsets the entry of each step version consumed."""

EXPECTED = [
    HopRow("published -> applied (first producer)", 2, 30, 40, 35),
    HopRow("published -> applied (last producer)", 2, 40, 50, 45),
    HopRow("published -> released", 2, 10, 20, 15),
    HopRow("released -> generated", 2, 80, 180, 130),
    HopRow("generated -> in samples", 2, 100, 210, 155),
    HopRow("in samples -> trained", 2, 700, 1200, 950),
    HopRow("first sample -> batch complete", 2, 200, 400, 300, "in samples -> trained"),
    HopRow("batch complete -> trained", 2, 500, 800, 650, "in samples -> trained"),
    HopRow("optimizer step", 2, 450, 700, 575, "batch complete -> trained"),
    HopRow("period (published -> next published)", 2, 1000, 1500, 1250),
]


def write_chain(run_dir: Path, mode: str) -> None:
    """The run of the module docstring. In lockstep each task's ``submitted_version`` is 0, so only
    its ``version.main`` says when it was released; in async mode it is the other way round."""
    run_dir.mkdir(parents=True)
    dump_config(parse_config({"run": RUN, "mode": mode}), run_dir / "config.yaml")
    topics = RunTopics(RUN, "math", ("main",))
    codec = Codec()
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        topics.ensure(log, partitions=2)
        with log.producer() as producer:

            def send(topic: str, record: object, key: str, at: int) -> None:
                producer.send(topic, codec.encode(record), key=key.encode(), timestamp_ms=at)

            for group, version, at in TASKS:
                lockstep = mode == "lockstep"
                task = RolloutTask(group, f"p-{group}", group, "math", "1+1", "2", 4, 0 if lockstep else version, at)
                task.metadata = {"version.main": str(version)} if lockstep else {}
                send(topics.tasks(), task, group, at)
            for index, (group, version, at) in enumerate(TRAJECTORIES):
                send(topics.trajectories("main"), trajectory("main", group, index, version, 1.0, at), group, at)
            for index, (group, at) in enumerate(SAMPLES):
                sample = TrainSample(f"s{index}", trajectory("main", group, index, 0, 1.0, at), 0.5, 1, created_ms=at)
                send(topics.samples("main"), sample, group, at)
            for version, at in PUBLISHED.items():
                kind, parent = ("start", -1) if version == 0 else ("step", version - 1)
                ranges = [OffsetRange(0, *CONSUMED[version])] if version in CONSUMED else []
                send(topics.ledger("main"), LedgerEntry("main", kind, 1, version, 1, parent, ranges), str(version), at)
            metrics = [
                ("rollout.weights_applied_ms", 30, 1, "rollout-a"),
                ("rollout.weights_applied_ms", 50, 1, "rollout-b"),
                ("rollout.weights_applied_ms", 40, 2, "rollout-a"),
                ("train.step_seconds", 0.45, 2, "train-x"),
                ("train.step_seconds", 0.7, 3, "train-x"),
            ]
            for name, value, step, instance in metrics:
                labels = {"instance": instance, "policy": "main"}
                record = Metric(instance, name, value, step, 6000, labels)
                send(topics.metrics(metric_owner(name)), record, instance, 6000)
            producer.flush()


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_hops_of_a_known_chain(tmp_path: Path, mode: str) -> None:
    write_chain(tmp_path / RUN, mode)
    with open_run(tmp_path / RUN) as run:
        (chain,) = collect_stats(run).version_chain
    assert (chain.policy, chain.lockstep, chain.versions) == ("main", mode == "lockstep", 2)
    assert chain.skipped == {"start": 1, "no trajectory": 1, "no next version": 1}
    assert chain.hops == EXPECTED


def test_one_producer_gets_no_last_producer_row_and_a_run_without_ledger_no_chain(tmp_path: Path) -> None:
    write_chain(tmp_path / RUN, "lockstep")
    with open_log("embedded", path=tmp_path / RUN / "log.sqlite") as log:
        for topic in RunTopics(RUN, "math", ("main",)).metrics_topics():
            log.delete_topic(topic)
    with open_run(tmp_path / RUN) as run:
        (chain,) = collect_stats(run).version_chain
        hops = {row.hop: row for row in chain.hops}
        assert "published -> applied (last producer)" not in hops
        assert hops["published -> applied (first producer)"].versions == 0
        assert hops["optimizer step"].versions == 0 and hops["published -> released"].versions == 2
        run.log.delete_topic(f"{RUN}.ledger.main")
        assert collect_stats(run).version_chain == []


def test_stats_cli_shows_the_chain(tmp_path: Path) -> None:
    write_chain(tmp_path / RUN, "lockstep")
    runner = CliRunner()
    shown = runner.invoke(app, ["stats", str(tmp_path / RUN)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.output.split())
    assert "version chain (ms) of main: 2 versions" in words
    assert "skipped 1 start, 1 no trajectory, 1 no next version." in words
    line = next(line for line in shown.output.splitlines() if "in samples -> trained" in line)
    assert [cell.strip() for cell in line.split("│")[2:6]] == ["700", "1200", "950", "2"]
    assert "    optimizer step " in shown.output
    dumped = runner.invoke(app, ["stats", str(tmp_path / RUN), "--json"])
    (chain,) = json.loads(dumped.output)["version_chain"]
    assert chain["hops"][-1] == {
        "hop": "period (published -> next published)",
        "versions": 2,
        "p50_ms": 1000,
        "p99_ms": 1500,
        "mean_ms": 1250,
        "part_of": None,
    }


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    assert (percentile([7.0], 99), percentile([1.0, 2.0, 3.0, 4.0], 50)) == (7, 2)
