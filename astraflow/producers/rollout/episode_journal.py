"""Episodes across a producer crash: each completed turn recorded, an unfinished episode resumed.

A rollout producer commits a task's trajectories with the task's offset, so a producer killed in the
middle of a batch has committed nothing of it, and whoever owns the task next plays it again. For a
multi-turn episode (tool calls, a sandbox, a slow environment) that is most of its cost. So, for a
workflow whose episodes take turns (``Workflow.resumes``; ``agent.resume_episodes``), the producer
also records every turn as it completes, on the compacted topic ``{run}.episodes.{policy}``:

- **What**: after every round of ``episodes.loop.play``, each episode still going is written whole so
  far - a Trajectory record with ``finish_reason`` empty: prompt ids, response ids, behaviour
  log-probs, per-token versions, loss mask, turns, the producer, its producers if it was resumed
  before, ``resumes``, generation and tool time - keyed by episode (``{task_id}/{index}``), to the
  partition of the task's own tasks partition. Compaction keeps the newest record of each episode.
- **When**: one transaction per tasks partition and round, by the partition's transactional producer
  (``TaskBatches.journal``), without offsets: the turns become durable as they complete. The task's
  offset is committed only once all its episodes are finished, in the batch's transaction, together
  with its trajectories and each recorded episode's tombstone (an empty value: ``TopicSpec.compacted``),
  so an episode is either unfinished on the journal or finished on the trajectories topic, never both
  and never neither.
- **Resume**: whoever is assigned a tasks partition (the producer restarted, or another one after a
  rebalance) opens the partition's transactional producer - fencing the old owner and ending its open
  transaction - and then reads the journal's partition to its end (``load``). The tasks it polls
  from the group's committed offset are the unfinished ones; an episode the journal holds is resumed
  from its last completed turn (``episodes.loop.resume``: the environment is given the recorded
  actions again and must answer alike), with the weights the producer has now. The resume is itself
  recorded (``resumes`` + 1, this producer added to ``producers``) before any token is generated, so
  an episode whose resumption kills its producer counts: one that would be resumed more than
  ``agent.max_resumes`` times fails its task, which is dead-lettered, instead of crash-looping every
  producer in turn.
- **Staleness**: recorded turns keep the versions they were sampled with; the trajectory's per-token
  versions tell the stream's staleness filter (oldest policy token) and the decoupled loss the truth.

A transaction of the journal refused (a newer owner of the partition, a rebalance) hands the partition
back exactly as a refused batch commit does (``task_batches.py``). An undecodable journal record is
dead-lettered and its episode played from its start.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from astraflow.core.errors import AstraFlowError
from astraflow.episodes.loop import Episode
from astraflow.episodes.workflows.base import Provenance, make_trajectory
from astraflow.log import TopicPartition
from astraflow.producers.rollout.task_batches import TaskBatch, TaskBatches
from astraflow.runtime.context import SAMPLE_HEADROOM_BYTES, ComponentContext
from astraflow.schemas.records import RolloutTask, Trajectory

logger = logging.getLogger(__name__)


class EpisodeResumedTooOftenError(AstraFlowError):
    """An episode was resumed ``agent.max_resumes`` times already: its task is dead-lettered."""


def episode_id(task: RolloutTask, index: int) -> str:
    """The journal's key of episode ``index`` of ``task``: its trajectory id."""
    return f"{task.task_id}/{index}"


class EpisodeJournal:
    """One policy's episode journal, for one rollout producer (module docstring)."""

    def __init__(self, ctx: ComponentContext, policy: str, provenance: Provenance, max_resumes: int) -> None:
        self._ctx = ctx
        self.policy = policy
        self.topic = ctx.topics.episodes(policy)
        self._provenance = provenance
        self._max_resumes = max_resumes
        self._batches: TaskBatches | None = None
        self._batch: TaskBatch | None = None
        self._partition_of: dict[str, int] = {}
        self._recorded: dict[int, dict[str, Trajectory]] = {}
        """Per tasks partition this producer owns: the episodes the journal holds, as committed."""
        self.turns_generated = 0
        self.turns_resumed = 0
        self.episodes_resumed = 0
        self.resumed_seconds = 0.0
        """Generation and tool seconds of the recorded turns taken up: what resuming saved."""

    # --- partitions ------------------------------------------------------------------------------

    def load(self, partition: int) -> None:
        """Read the journal's ``partition`` to its end (``TaskBatches``' ``on_assigned``)."""
        log = self._ctx.log
        end = log.end_offsets(self.topic).get(partition, 0)
        table: dict[str, Trajectory] = {}
        reader = log.range_reader()
        try:
            for message in reader.read_range(TopicPartition(self.topic, partition), 0, end):
                key = (message.key or b"").decode("utf-8", "replace")
                if not message.value:
                    table.pop(key, None)  # a finished episode's tombstone
                    continue
                try:
                    table[key] = self._ctx.codec.decode(message.value, expect=Trajectory)
                except AstraFlowError as exc:
                    table.pop(key, None)
                    self._ctx.dead_letter(message, f"undecodable episode record (played from its start): {exc}", exc)
        finally:
            reader.close()
        self._recorded[partition] = table
        if table:
            logger.info("episode journal %s[%d]: %d unfinished episodes to resume", self.topic, partition, len(table))

    def forget(self, partition: int) -> None:
        """The partition moved to another producer (``TaskBatches``' ``on_revoked``)."""
        self._recorded.pop(partition, None)

    # --- one batch -------------------------------------------------------------------------------

    def begin(self, batches: TaskBatches, batch: TaskBatch, partitions: dict[str, int]) -> None:
        """The batch about to be played; ``partitions``: its runnable tasks' tasks partitions, by task id."""
        self._batches, self._batch = batches, batch
        self._partition_of = dict(partitions)

    def recorded(self, task: RolloutTask, index: int) -> Trajectory | None:
        """``EpisodeJournal.recorded`` of ``episodes.loop``: the episode's recorded turns, if any."""
        record = self._recorded.get(self._partition_of[task.task_id], {}).get(episode_id(task, index))
        if record is not None and record.resumes >= self._max_resumes:
            producers = ", ".join(record.producers) or record.producer_id
            raise EpisodeResumedTooOftenError(
                f"episode {episode_id(task, index)} was resumed {record.resumes} times already "
                f"(producers {producers}), the most agent.max_resumes allows: its task is not played again"
            )
        return record

    def resumed(self, tasks: Sequence[RolloutTask], episodes: list[Episode]) -> None:
        """Record the resumption of ``episodes`` before any of their turns is generated (those whose
        environment did not answer alike start over, but count as resumed: ``agent.max_resumes``)."""
        taken = [episode for episode in episodes if episode.resumed_turns]
        self.episodes_resumed += len(taken)
        self.turns_resumed += sum(episode.resumed_turns for episode in taken)
        self.resumed_seconds += sum(episode.generate_ms / 1000 + episode.tool_seconds for episode in taken)
        self.record(tasks, episodes)

    def record(self, tasks: Sequence[RolloutTask], episodes: list[Episode]) -> None:
        """Commit the turns so far of ``episodes`` (each still going), one transaction per tasks partition."""
        by_partition: dict[int, list[Trajectory]] = {}
        for episode in episodes:
            task = tasks[episode.task_pos]
            record = self._partial(task, episode)
            by_partition.setdefault(self._partition_of[task.task_id], []).append(record)
        for partition, records in sorted(by_partition.items()):
            sent = []
            for record in records:
                value = self._ctx.codec.encode(record)
                too_large = self._ctx.oversize(self.topic, value, SAMPLE_HEADROOM_BYTES)
                if too_large is not None:  # recorded no further: a crash replays it from its start
                    logger.warning("episode %s is not recorded further: %s", record.trajectory_id, too_large)
                    continue
                sent.append((record, value))
            if not sent:
                continue
            assert self._batches is not None and self._batch is not None
            writes = [(self.topic, value, record.trajectory_id.encode()) for record, value in sent]
            if self._batches.journal(self._batch, partition, writes):
                table = self._recorded.setdefault(partition, {})
                table.update({record.trajectory_id: record for record, _ in sent})

    def finished(self, episodes: list[Episode]) -> None:
        """Count the turns of the batch's episodes, all played now (``rollout.turns_generated``)."""
        self.turns_generated += sum(episode.policy_turns - episode.resumed_turns for episode in episodes)

    def tombstones(self, batch: TaskBatch, tasks: Sequence[RolloutTask]) -> None:
        """Put the tombstone of every recorded episode of ``tasks`` (whatever their outcome) into the outbox
        of its tasks partition: it goes with the task's trajectories and offset."""
        for task in tasks:
            partition = self._partition_of[task.task_id]
            table = self._recorded.get(partition, {})
            for index in range(task.group_size):
                if episode_id(task, index) in table:
                    key = episode_id(task, index).encode()
                    batch.partition_outbox(partition).send(self.topic, b"", key=key, partition=partition)

    def committed(self, partitions: list[int], tasks: Sequence[RolloutTask]) -> None:
        """The batch's transactions of ``partitions`` committed: their tasks' episodes are finished."""
        for task in tasks:
            partition = self._partition_of.get(task.task_id)
            if partition in partitions:
                table = self._recorded.get(partition, {})
                for index in range(task.group_size):
                    table.pop(episode_id(task, index), None)

    def _partial(self, task: RolloutTask, episode: Episode) -> Trajectory:
        """The episode so far as a journal record: a Trajectory without a reward or a finish reason."""
        return make_trajectory(
            task,
            episode.index,
            self.policy,
            episode.transcript,
            {"reward": 0.0},
            "",
            "",
            self._provenance,
            generate_ms=episode.generate_ms,
            reward_ms=episode.tool_seconds * 1000,
            producers=episode.producers,
            resumes=episode.resumes,
        )
