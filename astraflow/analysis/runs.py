"""``astraflow runs ls|show|rm``: runs as namespaces of topics, and as run directories.

Every topic of a run is named ``{run}.{kind}.{name}`` (``runtime/topics.py``), so a run on any log is the
set of topics before the first dot; ``_astraflow.schemas`` belongs to no run and is never removed.
On the embedded backend a run also has a directory (``runs/<run>`` by default) holding
``config.yaml``, ``log.sqlite``, ``metrics.jsonl``, ``summary.json``, checkpoints and logs.

A run's status: **live** when its metrics topic got a record in the last ``LIVE_S`` seconds (every
component reports metrics continuously), else **finished** when ``summary.json`` exists, else
**stopped**. ``remove_run`` deletes the run's topics, then its directory when that directory's
log holds no other run; it refuses a live run unless forced. On Kafka the run's consumer groups
keep their (now dangling) offsets: the Log API deletes topics, not groups.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.analysis.stats import GroupLag, group_lag
from astraflow.config import RunConfig, load_config, parse_config
from astraflow.config.log import KafkaSecurity, security_client_config
from astraflow.core.errors import ConfigError, LogError
from astraflow.core.rundir import RunDir
from astraflow.log import Log, open_log
from astraflow.runtime.attach import offsets_at, open_run_log_readonly

LIVE_S = 60.0
INTERNAL_PREFIX = "_"
"""Topics of no run, such as the schema topic ``_astraflow.schemas`` (and Kafka's own ``__*``)."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    retention_ms: int | None
    appended: int
    retained: int


@dataclass
class RunInfo:
    name: str
    backend: str
    status: str
    run_dir: Path | None = None
    topics: list[TopicInfo] = field(default_factory=list)
    groups: list[GroupLag] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)

    def appended(self, kind: str) -> int:
        return sum(t.appended for t in self.topics if t.name.startswith(f"{self.name}.{kind}."))


def namespaces(log: Log) -> dict[str, list[str]]:
    """Run name -> its topics, for every run on the log."""
    runs: dict[str, list[str]] = {}
    for topic in log.list_topics():
        if not topic.startswith(INTERNAL_PREFIX) and "." in topic:
            runs.setdefault(topic.split(".", 1)[0], []).append(topic)
    return runs


def run_dirs(root: Path) -> list[Path]:
    """The run directories directly under ``root``."""
    return sorted(d for d in root.iterdir() if RunDir(d).looks_like_run()) if root.is_dir() else []


def dir_config(run_dir: Path, bootstrap: str | None = None) -> RunConfig:
    """The run directory's saved config (the embedded default, named after the directory, if none)."""
    if RunDir(run_dir).config.exists():
        return load_config(RunDir(run_dir).config, {"log.bootstrap": bootstrap} if bootstrap else None)
    return parse_config({"run": run_dir.name}, source=str(run_dir))


def describe_run(log: Log, name: str, run_dir: Path | None, backend: str, details: bool = True) -> RunInfo:
    """Status and, with ``details``, topics with record counts and consumer-group lag."""
    topics = namespaces(log).get(name, [])
    info = RunInfo(name, backend, run_status(log, name, run_dir), run_dir)
    if run_dir is not None and RunDir(run_dir).summary.exists():
        info.summary = json.loads(RunDir(run_dir).summary.read_text())
    starts = {}
    for topic in topics:
        ends = log.end_offsets(topic)
        starts[topic] = offsets_at(log, topic) if details else {p: 0 for p in ends}
        spec = log.describe_topic(topic)
        retained = sum(ends[p] - starts[topic][p] for p in ends)
        info.topics.append(TopicInfo(topic, spec.partitions, spec.retention_ms, sum(ends.values()), retained))
    if details:
        info.groups = group_lag(log, starts)
    return info


def run_status(log: Log, name: str, run_dir: Path | None) -> str:
    for metrics in (topic for topic in log.list_topics() if topic.startswith(f"{name}.metrics.")):
        recent = offsets_at(log, metrics, int((time.time() - LIVE_S) * 1000))
        if any(recent[p] < end for p, end in log.end_offsets(metrics).items()):
            return "live"
    if run_dir is not None and RunDir(run_dir).summary.exists():
        return "finished"
    return "stopped"


@dataclass(frozen=True)
class RunRef:
    """Where a run lives: its name, its directory (if it has one), and how to reach its log."""

    name: str
    run_dir: Path | None
    config: RunConfig | None
    bootstrap: str | None = None
    security: KafkaSecurity | None = None
    """How to log in to ``bootstrap`` when the run has no config here (``--security``)."""

    @property
    def backend(self) -> str:
        return self.config.log.backend if self.config is not None else "kafka"

    def open_log(self, component: str = "analysis") -> Log:
        """The run's log, on Kafka as ``component``'s principal (``analysis`` reads; deleting is ``admin``'s)."""
        if self.config is not None:
            return open_run_log_readonly(self.config, self.run_dir or Path("."), component)
        return open_log(
            "kafka", bootstrap=self.bootstrap, client_config=security_client_config(self.security, component)
        )


def resolve_run(run: str, root: Path, bootstrap: str | None = None, security: KafkaSecurity | None = None) -> RunRef:
    """``run`` as a run directory path, a directory name under ``root``, or (with ``bootstrap``) a
    run namespace on that Kafka cluster (logging in with ``security``)."""
    for candidate in (Path(run), root / run):
        if RunDir(candidate).looks_like_run():
            config = dir_config(candidate, bootstrap)
            return RunRef(config.run, candidate, config, bootstrap, security)
    if bootstrap:
        return RunRef(run, None, None, bootstrap, security)
    raise ConfigError(f"no run {run!r}: not a run directory, nor one under {root}; for a Kafka run give --bootstrap")


def list_runs(root: Path, bootstrap: str | None = None, security: KafkaSecurity | None = None) -> list[RunInfo]:
    """Every run directory under ``root`` (embedded ones with their topics), and with ``bootstrap``
    every run namespace on that cluster (reached with ``security``) that has no directory here."""
    infos = []
    for run_dir in run_dirs(root):
        ref = resolve_run(str(run_dir), root, bootstrap, security)
        if ref.backend == "embedded" or bootstrap:
            with ref.open_log() as log:
                infos.append(describe_run(log, ref.name, run_dir, ref.backend, details=False))
        else:
            info = RunInfo(
                ref.name, ref.backend, "finished" if RunDir(run_dir).summary.exists() else "unknown", run_dir
            )
            infos.append(info)
    if bootstrap:
        known = {info.name for info in infos if info.backend == "kafka"}
        with open_log("kafka", bootstrap=bootstrap, client_config=security_client_config(security, "analysis")) as log:
            infos += [
                describe_run(log, name, None, "kafka", details=False) for name in namespaces(log) if name not in known
            ]
    return infos


def show_run(ref: RunRef) -> RunInfo:
    with ref.open_log() as log:
        return describe_run(log, ref.name, ref.run_dir, ref.backend)


def remove_run(ref: RunRef, force: bool = False) -> list[str]:
    """Delete the run's topics, then its directory unless that directory's log holds another run;
    return what was removed. A live run is refused unless ``force``."""
    with ref.open_log(component="admin") as log:
        if run_status(log, ref.name, ref.run_dir) == "live" and not force:
            raise ConfigError(
                f"run {ref.name!r} is live (metrics in the last {LIVE_S:.0f} s); stop it first or pass --force"
            )
        removed = []
        for topic in namespaces(log).get(ref.name, []):
            log.delete_topic(topic)
            removed.append(topic)
        others = sorted(namespaces(log)) if ref.backend == "embedded" else []
    if ref.run_dir is not None:
        if others:
            raise LogError(f"{ref.run_dir}: kept, its log still holds the runs {', '.join(others)}")
        shutil.rmtree(ref.run_dir)
        removed.append(str(ref.run_dir))
    return removed
