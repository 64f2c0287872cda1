"""What ``astraflow report`` plots, gathered from a run's log (or its ``metrics.jsonl``).

The metrics topic gives accuracy, group reward, staleness and each producer's version lag; the
trajectories topics give reward by weight version and, with the samples topics, records/s over
time from record timestamps. Both are read as snapshots by assignment (``astraflow/runtime/attach.py``), so a run
that is still going is neither disturbed nor waited for. Without a log to attach to (an embedded
run directory whose ``log.sqlite`` was removed) the run monitor's ``metrics.jsonl`` is used alone.
Times are seconds since the run's first record.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.analysis.report import load_metrics
from astraflow.config import load_config
from astraflow.core.errors import ConfigError
from astraflow.core.rundir import RunDir
from astraflow.runtime.attach import AttachedRun, decode_snapshot, open_run, read_snapshot
from astraflow.runtime.control import read_control
from astraflow.schemas.records import Trajectory


@dataclass
class PolicyRewards:
    """One point per trajectory of a policy."""

    wall_s: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)


@dataclass
class ReportData:
    run: str
    source: str
    """Where the data came from: ``log`` or ``metrics.jsonl``."""
    metrics: dict[str, list[dict]]
    """Metric rows by name, as ``report.load_metrics`` returns them (``value``, ``step``, ``wall_s``, ``labels``)."""
    rewards: dict[str, PolicyRewards] = field(default_factory=dict)
    arrivals: dict[str, list[float]] = field(default_factory=dict)
    """Per trajectories / samples topic, the wall time of each record."""

    def latest(self, name: str) -> dict | None:
        rows = self.metrics.get(name, [])
        return max(rows, key=lambda r: (r["step"], r["wall_s"])) if rows else None


def from_log(run: AttachedRun) -> ReportData:
    """Everything the report shows, read from the run's topics."""
    metrics = read_control(run, letters=False).metrics
    trajectories: list[tuple[int, Trajectory]] = []
    stamps: dict[str, list[int]] = {}
    for topic in run.topics_of("trajectories"):
        stamps[topic] = []
        for message, record in decode_snapshot(run.log, topic):
            stamps[topic].append(message.timestamp_ms)
            if isinstance(record, Trajectory):
                trajectories.append((message.timestamp_ms, record))
    for topic in run.topics_of("samples"):
        stamps[topic] = [message.timestamp_ms for message in read_snapshot(run.log, topic)]
    firsts = [m.created_ms for m in metrics] + [min(s) for s in stamps.values() if s]
    start = min(firsts, default=0)
    rows: dict[str, list[dict]] = defaultdict(list)
    for m in metrics:
        rows[m.name].append(
            {
                "component": m.component,
                "name": m.name,
                "value": m.value,
                "step": m.step,
                "wall_s": (m.created_ms - start) / 1000,
                "labels": m.labels,
            }
        )
    rewards: dict[str, PolicyRewards] = defaultdict(PolicyRewards)
    for stamp, t in sorted(trajectories, key=lambda pair: pair[0]):
        points = rewards[t.policy]
        points.wall_s.append((stamp - start) / 1000)
        points.version.append(t.min_version)
        points.reward.append(t.reward)
    arrivals = {topic: [(ms - start) / 1000 for ms in sorted(values)] for topic, values in stamps.items()}
    return ReportData(run.name, "log", dict(rows), dict(rewards), arrivals)


def from_metrics_file(run: str, path: Path) -> ReportData:
    """The run monitor's ``metrics.jsonl`` alone: no per-trajectory reward, no throughput."""
    return ReportData(run, "metrics.jsonl", dict(load_metrics(path)))


def gather(target: Path, run_dir: Path | None = None, bootstrap: str | None = None) -> tuple[ReportData, Path]:
    """The report data of the run at ``target`` (see ``attach``) and its run directory; falls back to
    ``metrics.jsonl`` when an embedded run directory has no log left."""
    try:
        with open_run(target, run_dir, bootstrap=bootstrap) as run:
            return from_log(run), run.run_dir
    except ConfigError:
        directory = target if target.is_dir() else run_dir
        if directory is None or not RunDir(directory).metrics.exists() or not RunDir(directory).config.exists():
            raise
        return from_metrics_file(load_config(RunDir(directory).config).run, RunDir(directory).metrics), directory
