"""``astraflow audit``: the fate of every trajectory of a run, from its log and its trainer checkpoint.

Every trajectory id on ``{run}.trajectories.{policy}`` should end in exactly one recorded fate.
Where each is recorded (audit reads nothing else: no component's memory, no log files):

- **trained into version v**: its TrainSample (not a replayed copy) lies on ``{run}.samples.{policy}``
  below the offsets of the trainer's newest checkpoint, whose history says which version's batch
  held that offset. The trainer drops a sample id it already took since it (re)started, so a copy
  that a stream processor re-emitted after a crash is trained once - unless the trainer resumed
  from a checkpoint between the two copies: that trajectory is *trained twice*.
- **filtered**: a PromptStats on ``{run}.feedback.{workflow}`` with ``accepted`` false lists the
  group's trajectory ids and the reason (``<operator>: <detail>``; counted by operator).
- **dead-lettered**: a DeadLetter names the trajectory record's topic, partition and offset.
- **pending**: not decided yet - its sample lies at or beyond the checkpointed offsets (trainer),
  or its record at or beyond the stream processors' committed offset without a fate, or in a
  half-filled group of either stream runtime's changelog (stream), both of which commit past such records.
- **lost**: none of these, although the stream processors committed past its record.

When several fates are recorded (a group re-processed after a crash) the first of that list wins.
A record that does not decode has no id: it is one item, named ``@partition:offset``. Replayed
copies (a replay mixer's ``#replayN`` samples) are counted apart, since training them again is
the mixer's intent. The trainer forgets sample ids after ``BatchAssembler``'s ``remember``
(200,000); audit never forgets, which differs only for copies further apart than that.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from astraflow.attach import AttachedRun, decode_snapshot, read_snapshot
from astraflow.log import TopicPartition
from astraflow.rundir import RunDir
from astraflow.schemas.records import DeadLetter, PromptStats, TrainSample, Trajectory
from astraflow.training.checkpoint import TrainerState, read_latest_state

UNKNOWN_VERSION = -1
"""Version of a trained sample that the checkpoint's history does not cover (an older trainer)."""


@dataclass
class PolicyAudit:
    """Fates of the trajectories of one policy; every count is of trajectory ids (or undecodable records)."""

    policy: str
    records: int = 0
    """Records on the trajectories topic (redelivered copies included)."""
    trained: dict[int, int] = field(default_factory=dict)
    """Weight version → trajectories trained into it."""
    filtered: dict[str, int] = field(default_factory=dict)
    """Operator (drop kind) → trajectories of the groups it dropped."""
    dead_lettered: dict[str, int] = field(default_factory=dict)
    """Reason (kind) → trajectory records dead-lettered for it."""
    pending: dict[str, int] = field(default_factory=dict)
    """``stream`` or ``trainer`` → trajectories not decided yet."""
    lost: list[str] = field(default_factory=list)
    trained_twice: list[str] = field(default_factory=list)
    replays_trained: int = 0
    """Replayed copies trained (not counted as duplicates)."""
    copies_dropped: int = 0
    """Samples the trainer dropped as copies of one it had already taken."""

    @property
    def items(self) -> int:
        return (
            sum(self.trained.values())
            + sum(self.filtered.values())
            + sum(self.dead_lettered.values())
            + sum(self.pending.values())
            + len(self.lost)
        )

    @property
    def accounted(self) -> int:
        return sum(self.trained.values()) + sum(self.filtered.values()) + sum(self.dead_lettered.values())


@dataclass
class AuditReport:
    run: str
    policies: list[PolicyAudit]
    tasks_dead_lettered: dict[str, int] = field(default_factory=dict)
    """Dead letters of no log record (a workflow failed before any trajectory), by reason."""

    @property
    def ok(self) -> bool:
        return not any(p.lost or p.trained_twice for p in self.policies)

    def to_dict(self) -> dict:
        out = asdict(self)
        for entry, policy in zip(out["policies"], self.policies):
            entry.update(items=policy.items, accounted=policy.accounted)
        out["ok"] = self.ok
        return out


def reason_kind(letter: DeadLetter) -> str:
    """A dead letter's reason without the ids and numbers that make every one different."""
    head, _, detail = letter.reason.partition(": ")
    word = head.split(" ", 1)[0] or "unknown"
    if letter.error_type:
        return f"{word} ({letter.error_type})"
    return f"{word}: {re.sub(r'-?[0-9]+(?:[.][0-9]+)?', '#', detail)[:70]}"


def _trained_version(state: TrainerState, partition: int, offset: int) -> int:
    ends = [offsets.get(partition, 0) for _, offsets in state.history]
    index = bisect_right(ends, offset)
    return state.history[index][0] if index < len(state.history) else UNKNOWN_VERSION


class _TrainerMemory:
    """The trainer's duplicate memory: ids taken in its current lifetime, plus after each restart
    the ids of the ``recall_window`` samples below the resumed offset (``Trainer._recall_trained``)."""

    def __init__(self, state: TrainerState, samples: list) -> None:
        self.state = state
        self.ids = {(m.partition, m.offset): s.sample_id for m, s in samples}
        self.lifetime: dict[int, int] = {}
        self.seen: dict[int, set[str]] = {}

    def take(self, partition: int, offset: int, sample_id: str) -> bool:
        starts = [resume.get(partition, 0) for resume in self.state.resumes]
        lifetime = bisect_right(starts, offset)
        if self.lifetime.get(partition) != lifetime:
            self.lifetime[partition] = lifetime
            start = starts[lifetime - 1] if lifetime else 0
            recalled = range(max(0, start - self.state.recall_window), start) if lifetime else range(0)
            self.seen[partition] = {self.ids[(partition, o)] for o in recalled if (partition, o) in self.ids}
        if sample_id in self.seen[partition]:
            return False
        self.seen[partition].add(sample_id)
        return True


def held_by_faust_table(run: AttachedRun, policy: str) -> set[str]:
    """Trajectory ids in half-filled groups of the faust runtime's table: the last entry per key of
    its changelog (layout in ``streams.faust_table``: ``{partition}␟m␟{group}␟{trajectory id}``)."""
    topic = f"{run.name}.stream.{policy}-pending-changelog"
    if topic not in run.log.list_topics():
        return set()
    latest = {message.key: message.value for message in read_snapshot(run.log, topic) if message.key}
    entries = (key.split(b"\x1f", 3) for key, value in latest.items() if value)  # an empty value deletes
    return {entry[3].decode() for entry in entries if len(entry) == 4 and entry[1] == b"m"}


def held_by_native_changelog(run: AttachedRun, policy: str) -> set[str]:
    """Trajectory ids in half-filled groups of the native runtime's changelog: the newest
    ``pending␟{partition}`` record of each input partition, a JSON list of
    ``[group id, first timestamp, [[trajectory id, offset], ...], [[member, size], ...]]``
    (layout in ``streams.changelog`` and ``streams.pending``)."""
    topic = f"{run.name}.stream.{policy}.changelog"
    if topic not in run.log.list_topics():
        return set()
    latest = {message.key: message.value for message in read_snapshot(run.log, topic) if message.key}
    held = set()
    for key, value in latest.items():
        if key.startswith(b"pending\x1f") and value:
            held |= {tid for _, _, members, _ in json.loads(value) for tid, _ in members}
    return held


def _audit_policy(
    run: AttachedRun,
    policy: str,
    letters: dict[tuple[str, int, int], DeadLetter],
    feedback: list[PromptStats],
    committed: dict[TopicPartition, int],
) -> PolicyAudit:
    result = PolicyAudit(policy)
    trajectories = f"{run.name}.trajectories.{policy}"
    items: dict[str, list[tuple[int, int]]] = defaultdict(list)  # id → (partition, offset) of its records
    dead: dict[str, str] = {}
    for message, record in decode_snapshot(run.log, trajectories):
        result.records += 1
        item = record.trajectory_id if isinstance(record, Trajectory) else f"@{message.partition}:{message.offset}"
        items[item].append((message.partition, message.offset))
        letter = letters.get((trajectories, message.partition, message.offset))
        if letter is not None:
            dead.setdefault(item, reason_kind(letter))
    filtered: dict[str, str] = {}
    for stats in feedback:
        if stats.policy == policy and not stats.accepted:
            for trajectory_id in stats.trajectory_ids:
                filtered[trajectory_id] = stats.drop_reason.partition(":")[0] or "unknown"

    state = read_latest_state(RunDir(run.run_dir).checkpoints(policy)) or TrainerState(0, {}, 0)
    trained: dict[str, list[int]] = defaultdict(list)
    beyond_checkpoint: set[str] = set()
    samples = sorted(
        ((m, s) for m, s in decode_snapshot(run.log, f"{run.name}.samples.{policy}") if isinstance(s, TrainSample)),
        key=lambda pair: (pair[0].partition, pair[0].offset),
    )  # others: dead-lettered by the trainer
    seen = _TrainerMemory(state, samples)
    for message, sample in samples:
        tid = sample.trajectory.trajectory_id
        if message.offset >= state.offsets.get(message.partition, 0):
            if not sample.replayed:
                beyond_checkpoint.add(tid)
            continue
        if not seen.take(message.partition, message.offset, sample.sample_id):
            result.copies_dropped += 1
            continue
        if sample.replayed:
            result.replays_trained += 1
        else:
            trained[tid].append(_trained_version(state, message.partition, message.offset))

    held = held_by_faust_table(run, policy) | held_by_native_changelog(run, policy)
    counts: dict[str, Counter] = {"trained": Counter(), "filtered": Counter(), "dead": Counter(), "pending": Counter()}
    for item, places in items.items():
        if trained[item]:
            counts["trained"][trained[item][0]] += 1
            if len(trained[item]) > 1:
                result.trained_twice.append(item)
        elif item in beyond_checkpoint:
            counts["pending"]["trainer"] += 1
        elif item in filtered:
            counts["filtered"][filtered[item]] += 1
        elif item in dead:
            counts["dead"][dead[item]] += 1
        elif item in held or any(offset >= committed.get(TopicPartition(trajectories, p), 0) for p, offset in places):
            counts["pending"]["stream"] += 1
        else:
            result.lost.append(item)
    result.trained = dict(sorted(counts["trained"].items()))
    result.filtered = dict(counts["filtered"].most_common())
    result.dead_lettered = dict(counts["dead"].most_common())
    result.pending = dict(counts["pending"].most_common())
    return result


def audit_run(run: AttachedRun) -> AuditReport:
    """Reconcile every policy's trajectories of ``run`` with the fates recorded for them."""
    topics = set(run.run_topics())
    letters: dict[tuple[str, int, int], DeadLetter] = {}
    tasks: Counter[str] = Counter()
    if f"{run.name}.deadletter" in topics:
        for _, letter in decode_snapshot(run.log, f"{run.name}.deadletter"):
            if isinstance(letter, DeadLetter):
                letters[(letter.topic, letter.partition, letter.offset)] = letter
                if not letter.topic:
                    tasks[reason_kind(letter)] += 1
    feedback = [
        stats
        for topic in run.topics_of("feedback")
        for _, stats in decode_snapshot(run.log, topic)
        if isinstance(stats, PromptStats)
    ]
    committed: dict[TopicPartition, int] = {}
    groups = run.log.group_offsets()
    policies = sorted(topic.rsplit(".", 1)[1] for topic in run.topics_of("trajectories"))
    for policy in policies:
        committed.update(groups.get(f"{run.name}.stream.{policy}", {}))
    return AuditReport(
        run.name, [_audit_policy(run, p, letters, feedback, committed) for p in policies], dict(tasks.most_common())
    )


def format_report(report: AuditReport, versions: bool = False) -> str:
    """The report as text: one block per policy, fates with their counts, then the verdict."""
    lines = [f"audit of run {report.run}"]
    for p in report.policies:
        trained = sum(p.trained.values())
        span = [v for v in p.trained if v != UNKNOWN_VERSION]
        where = f"versions {min(span)}..{max(span)}" if span else "no recorded version"
        lines += [
            f"policy {p.policy}: {p.items} trajectories in {p.records} records",
            (
                f"  trained        {trained:>7}  ({where}; replayed copies trained {p.replays_trained}, "
                f"copies dropped {p.copies_dropped})"
            ),
            f"  filtered       {sum(p.filtered.values()):>7}  {_listing(p.filtered)}",
            f"  dead-lettered  {sum(p.dead_lettered.values()):>7}  {_listing(p.dead_lettered)}",
            f"  pending        {sum(p.pending.values()):>7}  {_listing(p.pending)}",
            f"  lost           {len(p.lost):>7}  {' '.join(p.lost[:5])}",
            f"  trained twice  {len(p.trained_twice):>7}  {' '.join(p.trained_twice[:5])}",
            f"  accounted      {p.accounted:>7}  of {p.items}",
        ]
        if versions:
            lines += [f"    version {v}: {n}" for v, n in p.trained.items()]
    if report.tasks_dead_lettered:
        lines.append(f"tasks dead-lettered before any trajectory: {_listing(report.tasks_dead_lettered)}")
    lost = sum(len(p.lost) for p in report.policies)
    twice = sum(len(p.trained_twice) for p in report.policies)
    lines.append(
        "OK: nothing lost, nothing trained twice" if report.ok else f"FAIL: {lost} lost, {twice} trained twice"
    )
    return "\n".join(lines)


def _listing(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in counts.items())
