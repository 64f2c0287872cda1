"""The version chain: how long each hop between processes takes, per weight version of a policy.

A version v of policy p goes round the loop once: the trainer **publishes** v, the producers
**apply** it, the feeder **releases** tasks at v, the producers **generate** their trajectories,
the stream processor turns the groups into **samples**, and the trainer **trains** the batch into
v + 1. Every time below is a record timestamp (``Message.timestamp_ms``), which both backends set
when the producing process *sends* the record: for the transactional records (tasks, trajectories,
samples, ledger entries) that is before the transaction commits and the record becomes visible.
So each hop also holds the sender's commit and the reader's poll. On Kafka the timestamps are
taken on the sending hosts (``CreateTime``): hops between hosts include their clock offset.

- **published**: the record timestamp of v's ``LedgerEntry``, sent in the transaction that makes
  v's manifest visible, right after the manifest (the ledger keeps every version; the weights topic
  only the last ``keep_versions``). The commit of that transaction falls in the next hops.
- **published -> applied**: the ``rollout.weights_applied_ms`` metrics of v (the producer's clock
  once its engine loaded v, minus the manifest's ``created_ms``, a fraction of a millisecond before
  ``published``: the commit, fetching and checking the chunks, waiting for the generation in hand
  to end, and the load), the first producer to apply it and, when several did, the last. A side
  branch: a producer generates a task released at v only once it holds v, so in lockstep the wait
  is inside released -> generated.
  A producer that starts (or restarts) late reports how long ago the version it caught up on was
  published, which shows in the last producer's p99.
- **published -> released**: the first task released at v (``mode: lockstep``: its metadata
  ``version.<policy>``; otherwise ``RolloutTask.submitted_version``) minus published.
- **released -> generated**: the first trajectory of a task released at v minus that release: the
  producer's poll, wait for v, generation of its batch and rewards (trajectories are sent after
  the whole batch is generated).
- **generated -> in samples**: the first sample of such a task minus the first trajectory: the
  producer's commit, the stream's poll, the group's completion and the stream's transaction.
- **in samples -> trained**: the publication of the version trained from v (the ledger entry whose
  parent is v) minus the first sample. Split into **first sample -> batch complete**, the newest
  record timestamp among the samples that version's entry consumed (its ``ranges``: the batch,
  with the stale and dead-lettered samples it passed over), which holds filling the batch,
  top-up tasks for the groups the stream dropped, and **batch complete -> trained**: the last
  samples' commit, the trainer's poll, the optimizer step (shown alone, ``train.step_seconds``),
  the checkpoint and the publication.
- **period**: published v -> published v + 1. Published -> released, released -> generated,
  generated -> in samples and in samples -> trained add up to it for every version, so their means
  add up to the period's mean (percentiles need not).

"First" makes the fixed latency of the pipe visible; the throughput-bound part of a version (the
whole batch going through) is in first sample -> batch complete. Only versions with the whole
chain count (every row is over them; the applied rows over those some producer reported); the
others are counted by reason in ``skipped``: a ``start`` entry (a trainer's start or restart,
whose tasks may be released before it), ``no next version`` (the newest one, or a lineage a
trainer restart left), or a stage without records (none retained, or none written yet). In
``mode: async`` several versions are in flight: v + 1 trains samples of tasks released at older
versions, so the same definitions are computed and still add up, but they are no critical path of
v (in samples -> trained, or first sample -> batch complete, may even be negative).
Percentiles are nearest-rank (p50 of 4 values is the 2nd smallest). Reads: the ledger and the
tasks are decoded; the samples are read without decoding (their key is the group id, and their
offsets are what ledger ranges name); the trajectories come from the pass ``stats`` makes anyway.
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TypeVar

from astraflow.core.metric_names import ROLLOUT_WEIGHTS_APPLIED_MS, TRAIN_STEP_SECONDS
from astraflow.log import Message
from astraflow.runtime.attach import AttachedRun, decode_snapshot, read_snapshot
from astraflow.schemas.records import LedgerEntry, Metric, RolloutTask

Record = TypeVar("Record")
APPLIED_FIRST = "published -> applied (first producer)"
APPLIED_LAST = "published -> applied (last producer)"
RELEASED = "published -> released"
GENERATED = "released -> generated"
SAMPLED = "generated -> in samples"
TRAINED = "in samples -> trained"
FILLED = "first sample -> batch complete"
STEPPED = "batch complete -> trained"
OPTIMIZER = "optimizer step"
PERIOD = "period (published -> next published)"
CHAIN = (RELEASED, GENERATED, SAMPLED, TRAINED)
"""The hops that add up to the period in lockstep."""
PART_OF = {FILLED: TRAINED, STEPPED: TRAINED, OPTIMIZER: STEPPED}


@dataclass(frozen=True)
class HopRow:
    hop: str
    versions: int
    """Versions the row is over."""
    p50_ms: float
    p99_ms: float
    mean_ms: float
    part_of: str | None = None
    """The hop this one is a part of (``batch complete -> trained`` is part of ``in samples -> trained``)."""


@dataclass
class VersionChain:
    policy: str
    lockstep: bool
    """In lockstep the hops are one version's critical path; in async versions overlap (module docstring)."""
    versions: int
    """Versions with the whole chain."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Versions of the ledger left out, by reason."""
    hops: list[HopRow] = field(default_factory=list)


class GroupClock:
    """The first record timestamp per group id (the key of every trajectory and sample record)."""

    def __init__(self) -> None:
        self.first: dict[bytes, int] = {}

    def note(self, message: Message) -> None:
        if message.key is not None and message.timestamp_ms < self.first.get(message.key, math.inf):
            self.first[message.key] = message.timestamp_ms


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)])


def hop_row(hop: str, values: list[float]) -> HopRow:
    if not values:
        return HopRow(hop, 0, 0.0, 0.0, 0.0, PART_OF.get(hop))
    mean = sum(values) / len(values)
    return HopRow(hop, len(values), percentile(values, 50), percentile(values, 99), mean, PART_OF.get(hop))


def version_chains(run: AttachedRun, metrics: list[Metric], trajectories: dict[str, GroupClock]) -> list[VersionChain]:
    """One ``VersionChain`` per policy with a ledger; ``trajectories``: the first trajectory per group
    of each policy (its ``GroupClock``), ``metrics``: the run's decoded metrics."""
    topics = set(run.log.list_topics())
    lockstep = run.config.mode == "lockstep"
    tasks = _decoded(run, f"{run.name}.tasks.{run.config.workflow}", topics, RolloutTask)
    chains = []
    for policy in run.config.policy_names():
        ledger = _decoded(run, f"{run.name}.ledger.{policy}", topics, LedgerEntry)
        if not ledger:
            continue
        samples = GroupClock()
        stamps: dict[int, tuple[int, array]] = {}
        if f"{run.name}.samples.{policy}" in topics:
            for message in read_snapshot(run.log, f"{run.name}.samples.{policy}"):
                samples.note(message)
                base, times = stamps.setdefault(message.partition, (message.offset, array("q")))
                times.extend([0] * (message.offset - base + 1 - len(times)))  # Kafka: gaps of markers
                times[message.offset - base] = message.timestamp_ms
        chains.append(
            _chain(policy, lockstep, ledger, tasks, trajectories.get(policy, GroupClock()), samples, stamps, metrics)
        )
    return chains


def _decoded(run: AttachedRun, topic: str, topics: set[str], kind: type[Record]) -> list[tuple[Message, Record]]:
    if topic not in topics:
        return []
    return [(message, record) for message, record in decode_snapshot(run.log, topic) if isinstance(record, kind)]


def _chain(
    policy: str,
    lockstep: bool,
    ledger: list[tuple[Message, LedgerEntry]],
    tasks: list[tuple[Message, RolloutTask]],
    trajectories: GroupClock,
    samples: GroupClock,
    stamps: dict[int, tuple[int, array]],
    metrics: list[Metric],
) -> VersionChain:
    released: dict[int, int] = {}
    group_version: dict[bytes, int] = {}
    for message, task in tasks:
        mark = task.metadata.get(f"version.{policy}") if lockstep else None
        version = task.submitted_version if mark is None else int(mark)
        group_version.setdefault(task.group_id.encode(), version)
        released[version] = min(released.get(version, message.timestamp_ms), message.timestamp_ms)
    generated, sampled = _first_by_version(trajectories, group_version), _first_by_version(samples, group_version)
    applied: dict[int, list[float]] = defaultdict(list)
    steps: dict[int, float] = {}
    for m in metrics:
        if m.name == ROLLOUT_WEIGHTS_APPLIED_MS and m.labels.get("policy") == policy:
            applied[m.step].append(m.value)
        elif m.name == TRAIN_STEP_SECONDS and m.labels.get("policy") == policy:
            steps[m.step] = m.value * 1000
    entries: dict[int, tuple[int, LedgerEntry]] = {}
    following: dict[tuple[int, int], tuple[int, LedgerEntry]] = {}
    for message, entry in ledger:
        entries.setdefault(entry.version, (message.timestamp_ms, entry))
        if entry.kind == "step":
            following.setdefault((entry.parent_epoch, entry.parent_version), (message.timestamp_ms, entry))
    values: dict[str, list[float]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    several = False  # more than one producer reported applying a version counted
    for version, (published, entry) in sorted(entries.items()):
        after = following.get((entry.epoch, version))
        complete = _batch_complete(after[1], stamps) if after else None
        reason = (
            "start" if entry.kind == "start"
            else "no next version" if after is None
            else "no task released" if version not in released
            else "no trajectory" if version not in generated
            else "no sample" if version not in sampled
            else "batch not retained" if complete is None
            else None
        )  # fmt: skip
        if reason is not None:
            skipped[reason] += 1
            continue
        assert after is not None and complete is not None
        stages = (published, released[version], generated[version], sampled[version], after[0])
        for hop, start, end in zip(CHAIN, stages, stages[1:]):
            values[hop].append(end - start)
        values[FILLED].append(complete - sampled[version])
        values[STEPPED].append(after[0] - complete)
        values[PERIOD].append(after[0] - published)
        if after[1].version in steps:
            values[OPTIMIZER].append(steps[after[1].version])
        if applied.get(version):
            values[APPLIED_FIRST].append(min(applied[version]))
            values[APPLIED_LAST].append(max(applied[version]))
            several = several or len(applied[version]) > 1
    order = [APPLIED_FIRST, APPLIED_LAST, *CHAIN, FILLED, STEPPED, OPTIMIZER, PERIOD]
    rows = [hop_row(hop, values[hop]) for hop in order if hop != APPLIED_LAST or several]
    return VersionChain(policy, lockstep, len(values[PERIOD]), dict(skipped), rows)


def _first_by_version(clock: GroupClock, group_version: dict[bytes, int]) -> dict[int, int]:
    """The first record per release version, over the groups of ``clock`` whose task is known."""
    first: dict[int, int] = {}
    for key, stamp in clock.first.items():
        version = group_version.get(key)
        if version is not None and stamp < first.get(version, math.inf):
            first[version] = stamp
    return first


def _batch_complete(entry: LedgerEntry, stamps: dict[int, tuple[int, array]]) -> int | None:
    """The newest record timestamp among the samples ``entry`` consumed; ``None`` when any is not retained."""
    newest = 0
    for span in entry.ranges:
        base, times = stamps.get(span.partition, (0, array("q")))
        if span.start < base or span.end - base > len(times):
            return None
        newest = max(newest, max(times[span.start - base : span.end - base], default=0))
    return newest if entry.ranges else None
