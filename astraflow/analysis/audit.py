"""``astraflow audit``: the fate of every trajectory of a run, from its log's records alone.

Every trajectory id on ``{run}.trajectories.{policy}`` should end in exactly one recorded fate.
Where each is recorded (audit reads records only: no checkpoint, no component's memory, no log
files, and none of the trainer's code):

- **trained into version v**: a ``step`` entry of ``{run}.ledger.{policy}`` on the *live lineage*
  names its sample. The trainer commits one entry per version with the version it was trained
  from (its parent); the live lineage is the chain of parents from the newest entry down to the
  base. Entries off it are versions a crash lost (published after the trainer's last valid
  checkpoint): their samples were trained again, or will be, into the live lineage. A trajectory
  whose (non-replayed) sample two live entries name is *trained twice*.
- **filtered**: a PromptStats on ``{run}.feedback.{workflow}`` with ``accepted`` false lists the
  group's trajectory ids and the reason (``<operator>: <detail>``; counted by operator).
- **dead-lettered**: a DeadLetter names the trajectory record's topic, partition and offset, or
  that of its sample on the samples topic (the trainer's dead letters). Only a letter its writer
  may write counts: one on the stream's ``{run}.deadletter.stream`` for a trajectory, on the
  trainer's for a sample (``runtime/control.py``); any other is listed as forged and decides nothing.
- **pending**: not decided yet - its sample lies at or beyond the newest entry's offsets, or only
  a lost version trained it (trainer); or its record lies at or beyond the stream processors'
  committed offset without a fate, or in a half-filled group of either stream runtime's changelog
  (stream), both of which commit past such records.
- **lost**: none of these, although the stream processors committed past its record, or the
  trainer's offsets passed its sample without an entry naming it, a dead letter, or an entry
  naming another copy of it.

On a live run the reads are ordered so that work done while the audit reads is never taken for a
loss: first the offsets the stream processors committed, then each ledger (the trainer's offsets),
then the changelogs of half-filled groups, and only then the fates - dead letters, feedback,
trajectories, samples. A stage commits a record's fate in the transaction that moves its offsets, so
every fate behind an offset read first is on the log when the fates are read; what happened after
is pending.

When several fates are recorded (a group re-processed after a crash) the first of that list wins.
A record that does not decode has no id: it is one item, named ``@partition:offset``. Replayed
copies (a replay mixer's ``#replayN`` samples, an offline mixer's ``#offlineN``) are counted apart,
since training them again is the mixer's intent. Each topic is read once, front to back, so the
cost is linear in the number of records.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from astraflow.log import TopicPartition
from astraflow.runtime.attach import AttachedRun, decode_snapshot, read_snapshot
from astraflow.runtime.control import read_control
from astraflow.schemas.records import DeadLetter, LedgerEntry, PromptStats, TrainSample, Trajectory


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
    """Samples the trainer read and dropped as copies of one the live lineage trained."""
    lost_versions: int = 0
    """Ledger entries off the live lineage: versions published after a checkpoint and lost in a crash."""
    retrained: int = 0
    """Trajectories trained into a lost version and again into the live lineage (not twice: once kept)."""
    epochs: int = 0
    """Trainer epochs in the ledger: starts of the policy's trainer."""
    fallbacks: list[str] = field(default_factory=list)
    """Restarts that went back further than ``train.checkpoint_every`` steps: a crash may cost the steps
    since the last committed checkpoint, never more (a failure, as a lost trajectory is)."""
    episodes_resumed: int = 0
    """Trajectories of episodes resumed from their recorded turns after their producer stopped."""
    episodes_finished_twice: list[str] = field(default_factory=list)
    """Episodes with more than one trajectory record. Exactly-once producers finish each once; copies
    come only from a topic written twice (mirrored, re-sent), which the stream drops as duplicates."""
    episodes_unfinished: int = 0
    """Episodes on the journal (``{run}.episodes.{policy}``) with turns recorded and no trajectory yet."""

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
    forged_letters: list[str] = field(default_factory=list)
    """Why each dead letter written by a role not allowed to write it was left out (it decides no fate)."""

    @property
    def ok(self) -> bool:
        return not any(p.lost or p.trained_twice or p.fallbacks for p in self.policies)

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


def live_lineage(entries: list[LedgerEntry]) -> tuple[LedgerEntry | None, set[tuple[int, int]]]:
    """The newest entry, and the (epoch, version) of every entry on the chain of parents from it."""
    by_key = {(entry.epoch, entry.version): entry for entry in entries}
    if not by_key:
        return None, set()
    head = max(by_key.values(), key=lambda entry: (entry.version, entry.epoch))
    live, entry = set(), head
    while entry is not None and (entry.epoch, entry.version) not in live:
        live.add((entry.epoch, entry.version))
        entry = by_key.get((entry.parent_epoch, entry.parent_version))
    return head, live


def fallbacks(entries: list[LedgerEntry], checkpoint_every: int) -> list[str]:
    """Each trainer start that resumed more than ``checkpoint_every`` optimizer steps behind the newest
    version published before it: the steps on the chain of parents from that version back to the
    checkpoint the start restored (all of them when it restored none, i.e. the base)."""
    by_key = {(entry.epoch, entry.version): entry for entry in entries}
    found = []
    for start in sorted((e for e in entries if e.kind == "start"), key=lambda e: (e.epoch, e.version)):
        before = [entry for entry in entries if entry.epoch < start.epoch]
        if not before:
            continue
        head = max(before, key=lambda entry: (entry.version, entry.epoch))
        restored, steps, seen = (start.parent_epoch, start.parent_version), 0, set()
        entry: LedgerEntry | None = head
        while (
            entry is not None and (entry.epoch, entry.version) != restored and (entry.epoch, entry.version) not in seen
        ):
            seen.add((entry.epoch, entry.version))
            steps += entry.kind == "step"
            entry = by_key.get((entry.parent_epoch, entry.parent_version))
        if steps > checkpoint_every:
            origin = "the base" if restored == (-1, -1) else f"version {restored[1]} of epoch {restored[0]}"
            found.append(
                f"epoch {start.epoch} resumed from {origin}, {steps} steps behind version {head.version}"
                f" (train.checkpoint_every {checkpoint_every})"
            )
    return found


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
    entries: list[LedgerEntry],
    held: set[str],
    topics: set[str],
) -> PolicyAudit:
    result = PolicyAudit(policy)
    trajectories = f"{run.name}.trajectories.{policy}"
    items: dict[str, list[tuple[int, int]]] = defaultdict(list)  # id → (partition, offset) of its records
    dead: dict[str, str] = {}
    resumed: set[str] = set()
    for message, record in decode_snapshot(run.log, trajectories):
        result.records += 1
        item = record.trajectory_id if isinstance(record, Trajectory) else f"@{message.partition}:{message.offset}"
        items[item].append((message.partition, message.offset))
        if isinstance(record, Trajectory) and record.resumes:
            resumed.add(item)
        letter = letters.get((trajectories, message.partition, message.offset))
        if letter is not None:
            dead.setdefault(item, reason_kind(letter))
    filtered: dict[str, str] = {}
    for stats in feedback:
        if stats.policy == policy and not stats.accepted:
            for trajectory_id in stats.trajectory_ids:
                filtered[trajectory_id] = stats.drop_reason.partition(":")[0] or "unknown"

    samples_topic = f"{run.name}.samples.{policy}"
    samples = [(m, s) for m, s in decode_snapshot(run.log, samples_topic) if isinstance(s, TrainSample)]
    of_sample = {sample.sample_id: sample for _, sample in samples}  # others: dead-lettered by the trainer
    head, live = live_lineage(entries)
    result.epochs = len({entry.epoch for entry in entries})
    result.lost_versions = len(entries) - len(live)
    result.fallbacks = fallbacks(entries, run.config.for_policy(policy).train.checkpoint_every)
    trained: dict[str, list[int]] = defaultdict(list)  # trajectory id → live versions that trained it
    live_ids: Counter[str] = Counter()  # sample id → live entries that name it
    in_lost_version: set[str] = set()
    for entry in entries:
        is_live = (entry.epoch, entry.version) in live
        for sample_id in entry.sample_ids:
            sample = of_sample.get(sample_id)
            replayed = sample is None or sample.replayed  # None: an offline sample of another run
            if is_live:
                live_ids[sample_id] += 1
                if replayed:
                    result.replays_trained += 1
                else:
                    trained[sample.trajectory.trajectory_id].append(entry.version)
            elif not replayed:
                in_lost_version.add(sample.trajectory.trajectory_id)
    result.retrained = len(in_lost_version & set(trained))
    consumed = {int(p): offset for p, offset in head.offsets.items()} if head is not None else {}
    records_of: Counter[str] = Counter()  # live-trained sample id → its records the trainer consumed
    beyond_trainer: set[str] = set()
    passed_over: set[str] = set()  # consumed by the trainer, yet no entry names it and no dead letter
    for message, sample in samples:
        tid = sample.trajectory.trajectory_id
        letter = letters.get((samples_topic, message.partition, message.offset))
        if message.offset >= consumed.get(message.partition, 0):
            if not sample.replayed:
                beyond_trainer.add(tid)
        elif sample.sample_id in live_ids:
            records_of[sample.sample_id] += 1
        elif letter is not None:
            if not sample.replayed:
                dead.setdefault(tid, reason_kind(letter))
        elif not sample.replayed:
            passed_over.add(tid)
    result.copies_dropped = sum(max(0, count - live_ids[sid]) for sid, count in records_of.items())
    pending_trainer = beyond_trainer | (in_lost_version - set(trained))
    counts: dict[str, Counter] = {"trained": Counter(), "filtered": Counter(), "dead": Counter(), "pending": Counter()}
    for item, places in items.items():
        if trained[item]:
            counts["trained"][trained[item][0]] += 1
            if len(trained[item]) > 1:
                result.trained_twice.append(item)
        elif item in pending_trainer:
            counts["pending"]["trainer"] += 1
        elif item in filtered:
            counts["filtered"][filtered[item]] += 1
        elif item in dead:
            counts["dead"][dead[item]] += 1
        elif item in passed_over:
            result.lost.append(item)
        elif item in held or any(offset >= committed.get(TopicPartition(trajectories, p), 0) for p, offset in places):
            counts["pending"]["stream"] += 1
        else:
            result.lost.append(item)
    result.trained = dict(sorted(counts["trained"].items()))
    result.filtered = dict(counts["filtered"].most_common())
    result.dead_lettered = dict(counts["dead"].most_common())
    result.pending = dict(counts["pending"].most_common())
    result.episodes_resumed = len(resumed)
    result.episodes_finished_twice = sorted(item for item, places in items.items() if len(places) > 1)
    journal = f"{run.name}.episodes.{policy}"
    result.episodes_unfinished = unfinished_episodes(run, journal) if journal in topics else 0
    return result


def unfinished_episodes(run: AttachedRun, topic: str) -> int:
    """Episodes whose newest record on the journal ``topic`` holds turns, not a tombstone
    (``producers/rollout/episode_journal.py``)."""
    newest: dict[bytes | None, bool] = {}
    for message in read_snapshot(run.log, topic):
        newest[message.key] = bool(message.value)
    return sum(newest.values())


def audit_run(run: AttachedRun) -> AuditReport:
    """Reconcile every policy's trajectories of ``run`` with the fates recorded for them."""
    topics = set(run.run_topics())
    policies = sorted(topic.rsplit(".", 1)[1] for topic in run.topics_of("trajectories"))
    groups = run.log.group_offsets()  # the reads' order matters on a live run (module docstring)
    committed: dict[TopicPartition, int] = {}
    for policy in policies:
        committed.update(groups.get(f"{run.name}.stream.{policy}", {}))
    ledgers = [f"{run.name}.ledger.{policy}" for policy in policies]
    entries = {
        p: [e for _, e in decode_snapshot(run.log, t) if isinstance(e, LedgerEntry)]
        for p, t in zip(policies, ledgers)
        if t in topics
    }
    held = {policy: held_by_faust_table(run, policy) | held_by_native_changelog(run, policy) for policy in policies}
    letters: dict[tuple[str, int, int], DeadLetter] = {}
    tasks: Counter[str] = Counter()
    control = read_control(run, metrics=False)
    for letter in control.letters:
        letters[(letter.topic, letter.partition, letter.offset)] = letter
        if not letter.topic:
            tasks[reason_kind(letter)] += 1
    feedback = [
        stats
        for topic in run.topics_of("feedback")
        for _, stats in decode_snapshot(run.log, topic)
        if isinstance(stats, PromptStats)
    ]
    return AuditReport(
        run.name,
        [_audit_policy(run, p, letters, feedback, committed, entries.get(p, []), held[p], topics) for p in policies],
        dict(tasks.most_common()),
        control.forged,
    )


def format_report(report: AuditReport, versions: bool = False) -> str:
    """The report as text: one block per policy, fates with their counts, then the verdict."""
    lines = [f"audit of run {report.run}"]
    for p in report.policies:
        trained = sum(p.trained.values())
        where = f"versions {min(p.trained)}..{max(p.trained)}" if p.trained else "no version"
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
            (
                f"  ledger: {p.epochs} trainer epoch(s), {p.lost_versions} version(s) lost in crashes,"
                f" {p.retrained} trajectories of them trained again"
            ),
            f"  fall-backs     {len(p.fallbacks):>7}  {'; '.join(p.fallbacks[:3])}",
            (
                f"  episodes: {p.episodes_resumed} resumed from recorded turns, {len(p.episodes_finished_twice)}"
                f" finished twice {' '.join(p.episodes_finished_twice[:5])}, {p.episodes_unfinished} unfinished"
                " on the journal"
            ),
        ]
        if versions:
            lines += [f"    version {v}: {n}" for v, n in p.trained.items()]
    if report.tasks_dead_lettered:
        lines.append(f"tasks dead-lettered before any trajectory: {_listing(report.tasks_dead_lettered)}")
    if report.forged_letters:
        lines.append(f"forged dead letters, deciding no fate: {len(report.forged_letters)}")
        lines += [f"  {reason}" for reason in report.forged_letters[:5]]
    lost = sum(len(p.lost) for p in report.policies)
    twice = sum(len(p.trained_twice) for p in report.policies)
    behind = sum(len(p.fallbacks) for p in report.policies)
    lines.append(
        "OK: nothing lost, nothing trained twice, no fall-back behind a committed checkpoint"
        if report.ok
        else f"FAIL: {lost} lost, {twice} trained twice, {behind} fall-back(s) behind a committed checkpoint"
    )
    return "\n".join(lines)


def _listing(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in counts.items())
