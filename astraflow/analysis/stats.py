"""``astraflow stats``: one snapshot of a run's dataflow, taken from its log alone.

What each number is made of:

- **throughput** per topic: records ever appended (sum of end offsets), records still retained,
  records/s over the run (appended / span of the metrics topic's timestamps) and over the last
  ``window_s`` (counted from ``seek_to_timestamp``, so nothing is read);
- **lag** per consumer group of the run and topic: end offset minus the group's committed offset,
  summed over partitions, from ``Log.group_offsets`` (read-only: the group is never joined);
- **staleness histogram**: the ``stream.staleness`` metric, one value per group the stream
  processor judged (trainer version minus the group's oldest token version);
- **reward by policy and version**: every retained trajectory, keyed by its ``min_version``;
- **drop reasons**: the stream processors' cumulative ``stream.dropped.<reason>`` counters (the
  newest value per processor instance, summed), plus dead letters by ``reason_kind``;
- **forged**: metrics and dead letters written by a role not allowed to write them, left out of
  every figure above (``runtime/control.py``);
- **producers**: throughput and version lag per rollout producer, with its region and hardware,
  from the producers' metrics (``producer_stats.py``);
- **version chain**: per policy, p50/p99/mean of each hop a weight version goes through, from its
  publication to the publication of the version trained from it (``hops.py``), over the same read
  of the trajectories as the rewards.

All reads are snapshots by assignment (see ``astraflow/runtime/attach.py``), so the run is not disturbed.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from astraflow.analysis.hops import GroupClock, VersionChain, version_chains
from astraflow.analysis.producer_stats import ProducerRow, producer_rows
from astraflow.core.metric_names import STREAM_DROPPED_PREFIX, STREAM_STALENESS
from astraflow.log import Log
from astraflow.runtime.attach import AttachedRun, decode_snapshot, offsets_at
from astraflow.runtime.control import read_control
from astraflow.schemas.records import Metric, Trajectory


@dataclass(frozen=True)
class TopicThroughput:
    topic: str
    appended: int
    """Records ever appended (sum of the partitions' end offsets)."""
    retained: int
    """Records still in the log (retention may have deleted older ones)."""
    per_s: float
    """Appended records per second over the span of the run's metrics (0 without metrics)."""
    recent_per_s: float
    """Records per second appended within the last ``RunStats.window_s`` seconds."""


@dataclass(frozen=True)
class GroupLag:
    group: str
    topic: str
    committed: int
    """Sum over partitions of the group's committed next-offset."""
    lag: int
    """Records appended but not yet committed by the group."""


@dataclass(frozen=True)
class RewardCell:
    policy: str
    version: int
    """The trajectories' ``min_version`` (oldest weight version among their trained tokens)."""
    trajectories: int
    mean_reward: float
    pass_rate: float
    """Share of trajectories with reward > 0."""


@dataclass
class RunStats:
    run: str
    taken_ms: int
    window_s: float
    span_s: float
    """Seconds between the first and the newest metric record of the run."""
    throughput: list[TopicThroughput] = field(default_factory=list)
    lag: list[GroupLag] = field(default_factory=list)
    staleness: dict[int, int] = field(default_factory=dict)
    rewards: list[RewardCell] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    forged: int = 0
    """Metrics and dead letters left out: their writer's role may not write them (``runtime/control.py``)."""
    producers: list[ProducerRow] = field(default_factory=list)
    version_chain: list[VersionChain] = field(default_factory=list)
    """Per policy, the latency of each hop of the version chain (``hops.py``)."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def collect_stats(run: AttachedRun, window_s: float = 60.0) -> RunStats:
    """Take the snapshot described in the module docstring."""
    now = int(time.time() * 1000)
    control = read_control(run)
    metrics = control.metrics
    span_s = (max(m.created_ms for m in metrics) - min(m.created_ms for m in metrics)) / 1000 if metrics else 0.0
    stats = RunStats(run.name, now, window_s, span_s)
    starts: dict[str, dict[int, int]] = {}
    for topic in run.run_topics():
        ends = run.log.end_offsets(topic)
        starts[topic] = offsets_at(run.log, topic, None)
        recent = offsets_at(run.log, topic, now - int(window_s * 1000))
        appended = sum(ends.values())
        stats.throughput.append(
            TopicThroughput(
                topic=topic,
                appended=appended,
                retained=sum(ends[p] - starts[topic][p] for p in ends),
                per_s=appended / span_s if span_s > 0 else 0.0,
                recent_per_s=sum(ends[p] - recent[p] for p in ends) / window_s,
            )
        )
    stats.lag = group_lag(run.log, starts)
    stats.staleness = dict(sorted(Counter(int(m.value) for m in metrics if m.name == STREAM_STALENESS).items()))
    stats.drops = _drops(metrics)
    stats.producers = producer_rows(metrics, window_s)
    first_trajectories: dict[str, GroupClock] = defaultdict(GroupClock)
    stats.rewards = _rewards(run, first_trajectories)
    stats.version_chain = version_chains(run, metrics, first_trajectories)
    letters = Counter(reason_kind(letter.reason) for letter in control.letters)
    stats.dead_letters = dict(letters.most_common())
    stats.forged = len(control.forged)
    return stats


def reason_kind(reason: str) -> str:
    """A dead-letter reason without its details and record ids: the text before the first ``:``,
    less words holding a digit, ``/`` or ``@`` (``invalid trajectory g3/1: ...`` -> ``invalid trajectory``)."""
    words = reason.split(":", 1)[0].split()
    return " ".join(w for w in words if not any(c.isdigit() or c in "/@" for c in w)) or "unknown"


def group_lag(log: Log, starts: dict[str, dict[int, int]]) -> list[GroupLag]:
    """Lag of every group on the topics of ``starts`` (topic -> oldest retained offset per partition);
    a partition the group never committed counts from its oldest retained record."""
    rows = []
    for group, offsets in sorted(log.group_offsets().items()):
        by_topic: dict[str, dict[int, int]] = defaultdict(dict)
        for tp, offset in offsets.items():
            if tp.topic in starts:
                by_topic[tp.topic][tp.partition] = offset
        for topic, committed in sorted(by_topic.items()):
            ends = log.end_offsets(topic)
            done = {p: committed.get(p, starts[topic][p]) for p in ends}
            rows.append(GroupLag(group, topic, sum(done.values()), sum(max(0, ends[p] - done[p]) for p in ends)))
    return rows


def _drops(metrics: list[Metric]) -> dict[str, int]:
    """Newest cumulative count per (instance, reason), summed over instances."""
    newest: dict[tuple[str, str], Metric] = {}
    for metric in metrics:
        if metric.name.startswith(STREAM_DROPPED_PREFIX):
            key = (metric.labels.get("instance", metric.component), metric.name.removeprefix(STREAM_DROPPED_PREFIX))
            if key not in newest or metric.created_ms >= newest[key].created_ms:
                newest[key] = metric
    totals: Counter[str] = Counter()
    for (_, reason), metric in newest.items():
        totals[reason] += int(metric.value)
    return dict(totals.most_common())


def _rewards(run: AttachedRun, first: dict[str, GroupClock]) -> list[RewardCell]:
    """Reward by policy and version; notes in ``first`` each policy's first trajectory per group."""
    sums: dict[tuple[str, int], list[float]] = defaultdict(list)
    for topic in run.topics_of("trajectories"):
        clock = first[topic.removeprefix(f"{run.name}.trajectories.")]
        for message, record in decode_snapshot(run.log, topic):
            if isinstance(record, Trajectory):
                clock.note(message)
                sums[(record.policy, record.min_version)].append(record.reward)
    return [
        RewardCell(policy, version, len(values), sum(values) / len(values), sum(v > 0 for v in values) / len(values))
        for (policy, version), values in sorted(sums.items())
    ]
