"""Rollout producer (Rollout-as-a-Service): tasks in, trajectories out, weights refreshed.

Steps of one iteration (what makes it lose nothing):

1. Take the newest complete weight version the background ``WeightFollower`` assembled, if any,
   and load it into the engine *between* generations: every token of one generation carries the
   same version, recorded per token in the trajectory.
2. Poll up to ``prompts_per_generation`` tasks from ``{run}.tasks.{workflow}`` as a member of the
   producers' consumer group (joining or leaving rebalances the partitions: elastic rollout).
3. Run the configured ``Workflow`` on the batch (``episodes/workflows``: generation, turns, rewards; a
   task whose reward raises is dead-lettered, never given a silent zero), and put its Trajectory
   records, keyed by group id, and its dead letters into the outbox of the task's partition
   (``task_batches.py``). Trajectory ids are ``{task_id}/{sample}``: deterministic, so a task redone
   yields the same ids. A task with a trajectory over its topic's record limit is dead-lettered
   whole (``send_outcome``).
4. Commit, per tasks partition of the batch, one transaction: the outbox's records and the offset
   after the partition's last task become visible together, or nothing of them (a crash, an abort,
   a newer owner of the partition). So each task's trajectories become visible exactly once: a
   task is redone only when nothing of it was committed. The transactional id is the partition's
   (``TaskBatches``): whoever owns the partition next fences this producer. A partition whose
   transaction is refused is handed back and its tasks are redone from the committed offset.

The producer holds one engine and one ``WeightFollower`` per policy the workflow involves, and
sends each trajectory to its own policy's topic. In ``mode: lockstep`` it waits, before step 3,
until each engine holds the version its tasks were released at. Metrics go through the
component's plain producer, flushed after each batch, outside the transactions.

Joining and leaving (elastic rollout): a producer started late first takes in every weight
version published before it started (``WeightFollower.wait_caught_up``; it waits as long as that
takes, or until it is stopped) and only then joins the task group, so its first generation
already uses the current version. A stop signal ends the loop after the current iteration: the
batch in hand is finished and committed (step 4), then the consumer leaves the group and its
partitions move to the remaining producers at their next poll. One exception: a batch still
waiting for the weights its tasks were released at (lockstep) is not run but left uncommitted, so
the partitions' next owner runs it; run with older weights its samples would be stale, dropped
by the stream, and (lockstep replaces no stale group) the trainer would wait for them for ever.
A transaction refused because of a rebalance hands the partition's tasks back: the new owner
redoes them, and nothing of the first attempt is visible.

Every trajectory records the producer id, its region and its hardware (``--region``,
``--hardware``); the per-batch metrics carry the same labels, plus the cumulative counters
``rollout.trajectories`` and ``rollout.busy_seconds`` from which ``stats``, the dashboard and
the scaler derive per-producer throughput and busy time.
"""

from __future__ import annotations

import logging
import platform
import re
import threading
import time

import numpy as np

from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import AstraFlowError, RecordTooLargeError
from astraflow.core.metric_names import (
    ROLLOUT_BUSY_SECONDS,
    ROLLOUT_EPISODES_RESUMED,
    ROLLOUT_MEAN_REWARD,
    ROLLOUT_RESUMED_SECONDS,
    ROLLOUT_SAMPLES_PER_S,
    ROLLOUT_TRAJECTORIES,
    ROLLOUT_TURNS_GENERATED,
    ROLLOUT_TURNS_RESUMED,
    ROLLOUT_VERSION_LAG,
    ROLLOUT_WEIGHTS_APPLIED_MS,
)
from astraflow.core.rundir import RunDir
from astraflow.engines import build_engine
from astraflow.episodes.workflows.base import Provenance, TaskOutcome
from astraflow.episodes.workflows.factory import build_run_workflow
from astraflow.producers.rollout.episode_journal import EpisodeJournal
from astraflow.producers.rollout.task_batches import TaskBatch, TaskBatches
from astraflow.runtime.base_checkpoint import base_checkpoint_path
from astraflow.runtime.context import SAMPLE_HEADROOM_BYTES, ComponentContext, now_ms
from astraflow.runtime.outbox import Outbox
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import RolloutTask, Trajectory
from astraflow.schemas.validation import clipped, id_problem
from astraflow.tasks.datasets import load_task_split
from astraflow.weights.follow import WeightFollower, follow_weights

logger = logging.getLogger(__name__)
VERSION = re.compile(r"-?[0-9]{1,10}")
"""A version number as a task's metadata writes it."""
MAX_GROUP_SIZE = 1024
"""The largest ``group_size`` a task may ask for (``rollout.group_size``'s bound)."""
CATCH_UP_SECONDS = 60.0
"""How long to wait for a first weight version, and between "still catching up" warnings."""


class RolloutProducer:
    """Runs the configured workflow on tasks from the log and writes its trajectories."""

    def __init__(self, ctx: ComponentContext, region: str = "local", hardware: str | None = None) -> None:
        import torch

        cfg = ctx.config
        torch.set_num_threads(cfg.rollout.threads)
        self.ctx = ctx
        self.provenance = Provenance(
            ctx.instance, region, hardware or f"cpu:{platform.machine()}x{cfg.rollout.threads}"
        )
        self.workflow = build_run_workflow(cfg, RunDir(ctx.run_dir).data)
        load_task_split(cfg.task, ctx.run_dir, "train")  # some environments read the task's data (the search corpus)
        self.workflow.open()
        self.engines = {
            policy: build_engine(
                cfg.for_policy(policy).engine, base_checkpoint_path(cfg.for_policy(policy), ctx.run_dir)
            )
            for policy in self.workflow.policies
        }
        self.trajectories = {policy: 0 for policy in self.engines}
        self.busy_seconds = 0.0
        self.journal = None
        if self.workflow.resumes and cfg.agent.resume_episodes:  # episodes of turns: recorded as they complete
            (policy,) = self.workflow.policies
            self.journal = EpisodeJournal(ctx, policy, self.provenance, cfg.agent.max_resumes)
            self.workflow.journal = self.journal

    def _refresh(self, policy: str, follower: WeightFollower) -> None:
        pending = follower.take()
        if pending is None:
            return
        version, state = pending
        self.engines[policy].load_state_dict(state, version)
        self.ctx.metric(ROLLOUT_WEIGHTS_APPLIED_MS, now_ms() - follower.taken_published_ms, version, policy=policy)
        logger.info("applied weight version %d of %s", version, policy)

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        cfg = ctx.config
        followers = {policy: follow_weights(ctx, policy, payload=True) for policy in self.engines}
        if not self._catch_up(followers, stop):
            for follower in followers.values():
                follower.close()
            return
        journal = self.journal
        batches = TaskBatches(
            ctx,
            f"{cfg.run}.rollout.{cfg.workflow}",
            on_assigned=journal.load if journal else None,
            on_revoked=journal.forget if journal else None,
        )
        try:
            while not stop.is_set():
                for policy, follower in followers.items():
                    self._refresh(policy, follower)
                batch = batches.poll(cfg.rollout.prompts_per_generation, timeout=0.5)
                tasks = self._runnable(batch)
                if journal is not None:
                    journal.begin(batches, batch, {task.task_id: partition for task, partition in tasks})
                if tasks and not self._await_versions([task for task, _ in tasks], followers, stop):
                    # stopped before the engines held the versions the tasks wait for: samples of an
                    # older version would be stale, and lockstep replaces no stale group, so the
                    # tasks stay uncommitted for the partition's next owner to run
                    logger.info("stopped while waiting for weights; %d tasks handed back", len(batch.messages))
                    break
                if tasks:
                    self._produce(tasks, batch, followers)
                    if journal is not None:  # the recorded episodes' tombstones go with their trajectories
                        journal.tombstones(batch, [task for task, _ in tasks])
                if batch.messages:
                    crash_point("rollout.commit_batch")
                    committed = batches.commit(batch)
                    if journal is not None:
                        journal.committed(committed, [task for task, _ in tasks])
                    crash_point("rollout.flush_metrics")
                    ctx.producer.flush()  # the batch's metrics
        finally:
            for follower in followers.values():
                follower.close()
            batches.close()
        logger.info(
            "left the rollout pool: last batch committed, %d trajectories made in all",
            sum(self.trajectories.values()),
        )

    def _runnable(self, batch: TaskBatch) -> list[tuple[RolloutTask, int]]:
        """The batch's tasks that can be run, each with its tasks partition; the others are dead-lettered
        into the outbox of theirs (step 3)."""
        tasks = []
        for message in batch.messages:
            task, reason, error = runnable_task(
                self.ctx.codec, message.value, self.engines, self.ctx.config.rollout.group_size
            )
            if task is None:
                batch.outbox(message).dead_letter(message, reason, error)
            else:
                tasks.append((task, message.partition))
        return tasks

    def _await_versions(
        self, tasks: list[RolloutTask], followers: dict[str, WeightFollower], stop: threading.Event
    ) -> bool:
        """``mode: lockstep``: generate with at least the versions the feeder released the tasks at
        (``version.<policy>`` in their metadata), so no sample is born stale. ``False`` if stopped first."""
        for policy, follower in followers.items():
            needed = max((int(t.metadata.get(f"version.{policy}", -1)) for t in tasks), default=-1)
            while self.engines[policy].version < needed:
                if stop.is_set():
                    return False
                follower.wait_for(needed, timeout=0.5)
                self._refresh(policy, follower)
        return True

    def _catch_up(self, followers: dict[str, WeightFollower], stop: threading.Event) -> bool:
        """Take in every version published before this producer started; ``False`` if stopped first."""
        for policy, follower in followers.items():
            deadline = time.monotonic() + CATCH_UP_SECONDS
            while not follower.wait_for(0, timeout=1.0) and time.monotonic() < deadline and not stop.is_set():
                pass
            if follower.latest_version < 0 and not stop.is_set():
                logger.warning(
                    "no weight version of %s published yet; sampling with the base checkpoint as version 0", policy
                )
            deadline = time.monotonic() + CATCH_UP_SECONDS
            while not follower.wait_caught_up(timeout=1.0):
                if stop.is_set():
                    return False
                if time.monotonic() < deadline:
                    continue
                deadline = time.monotonic() + CATCH_UP_SECONDS
                logger.warning(
                    "still catching up on the weights of %s (at version %d of %d)",
                    policy,
                    follower.latest_version,
                    follower.newest_version,
                )
            self._refresh(policy, follower)
            logger.info("caught up on %s at version %d", policy, self.engines[policy].version)
        if not stop.is_set():
            logger.info("joining the rollout pool")
        return not stop.is_set()

    def _run(self, tasks: list[RolloutTask]) -> list[TaskOutcome]:
        """The workflow's outcomes of ``tasks``. Should the batch raise (a workflow bug, not a task's
        failure, which the outcome carries), each task is run alone, so only the tasks that raise fail."""
        try:
            return self.workflow.run_batch(self.engines, tasks, self.provenance)
        except Exception as exc:
            if len(tasks) == 1:
                return [TaskOutcome(tasks[0], [], exc)]
            logger.exception("the workflow failed on a batch of %d tasks; running them one by one", len(tasks))
        outcomes = []
        for task in tasks:
            try:
                outcomes += self.workflow.run_batch(self.engines, [task], self.provenance)
            except Exception as exc:
                outcomes.append(TaskOutcome(task, [], exc))
        return outcomes

    def _produce(
        self, tasks: list[tuple[RolloutTask, int]], batch: TaskBatch, followers: dict[str, WeightFollower]
    ) -> None:
        ctx = self.ctx
        started = time.perf_counter()
        rewards: dict[str, list[float]] = {policy: [] for policy in self.engines}
        partitions = {task.task_id: partition for task, partition in tasks}
        for outcome in self._run([task for task, _ in tasks]):
            outbox = batch.partition_outbox(partitions[outcome.task.task_id])
            try:
                sent = send_outcome(ctx, outcome, outbox)
            except Exception as exc:  # e.g. a trajectory the codec cannot encode: the task fails, not the producer
                outbox.dead_letter(None, f"workflow failed for task {outcome.task.task_id}: {exc}", exc)
                sent = []
            for trajectory in sent:
                rewards[trajectory.policy].append(trajectory.reward)
        elapsed = max(time.perf_counter() - started, 1e-6)
        self.busy_seconds += elapsed
        where = {"region": self.provenance.region, "hardware": self.provenance.hardware}
        ctx.metric(ROLLOUT_BUSY_SECONDS, self.busy_seconds, min(e.version for e in self.engines.values()), **where)
        for policy, values in rewards.items():
            version = self.engines[policy].version
            self.trajectories[policy] += len(values)
            labels = {"policy": policy, **where}
            ctx.metric(ROLLOUT_SAMPLES_PER_S, len(values) / elapsed, version, **labels)
            ctx.metric(ROLLOUT_TRAJECTORIES, self.trajectories[policy], version, **labels)
            ctx.metric(ROLLOUT_VERSION_LAG, max(followers[policy].newest_version, 0) - version, version, **labels)
            if values:
                ctx.metric(ROLLOUT_MEAN_REWARD, float(np.mean(values)), version, **labels)
            if self.journal is not None and self.journal.policy == policy:
                ctx.metric(ROLLOUT_TURNS_GENERATED, self.journal.turns_generated, version, **labels)
                ctx.metric(ROLLOUT_TURNS_RESUMED, self.journal.turns_resumed, version, **labels)
                ctx.metric(ROLLOUT_EPISODES_RESUMED, self.journal.episodes_resumed, version, **labels)
                ctx.metric(ROLLOUT_RESUMED_SECONDS, self.journal.resumed_seconds, version, **labels)


def runnable_task(
    codec: Codec, value: bytes, engines: dict, group_size: int | None
) -> tuple[RolloutTask | None, str, Exception | None]:
    """The task a tasks record holds, if a producer of ``engines``' policies can run it: ``(task, "", None)``;
    else ``(None, reason, error)``, what its dead letter says (undecodable, or ``task_problem``'s problem)."""
    try:
        task = codec.decode(value, expect=RolloutTask)
    except AstraFlowError as exc:
        return None, f"undecodable task: {exc}", exc
    problem = task_problem(task, engines, group_size)
    if problem is not None:
        return None, invalid_task(task, problem), None
    return task, "", None


def invalid_task(task: RolloutTask, problem: str) -> str:
    """The dead-letter reason of a task ``task_problem`` rejects: its id clipped, since the id may be what
    is wrong (a MiB of id would push the problem's field past the reason's ``REASON_CHARS``)."""
    return f"invalid task {clipped(task.task_id)}: {problem}"


def task_problem(task: RolloutTask, engines: dict, group_size: int | None = None) -> str | None:
    """Why a task record cannot be run, or ``None``: its ids (``schemas.validation.id_problem``: its
    trajectories would carry them); its group size, within bounds and, when ``group_size`` (the policy's
    ``rollout.group_size``) is given, equal to it (the stream would reject each of its trajectories); and
    the versions it waits for - ASCII digits (``int`` takes ``"²"`` for no number and raises later)
    within int32, the width of every version a record holds (a task waiting for a version beyond it
    would hold its partition for ever)."""
    for name in ("task_id", "prompt_id", "group_id", "workflow"):
        problem = id_problem(getattr(task, name))
        if problem is not None:
            return f"{name}: {problem}"
    if not 1 <= task.group_size <= MAX_GROUP_SIZE:
        return f"group_size: {task.group_size} is not in 1..{MAX_GROUP_SIZE}"
    if group_size is not None and task.group_size != group_size:
        return f"group_size: {task.group_size}, but the policy's rollout.group_size is {group_size}"
    for policy in engines:
        version = task.metadata.get(f"version.{policy}", "-1")
        if VERSION.fullmatch(version) is None or not -1 <= int(version) < 2**31:
            return f"metadata: version.{policy} is {clipped(version)!r}, not a version number"
    return None


def send_outcome(ctx: ComponentContext, outcome: TaskOutcome, outbox: Outbox | None = None) -> list[Trajectory]:
    """Send a task's trajectories to their policies' topics and return them; or dead-letter the task
    (its workflow failed, or one of its trajectories is over its topic's record limit) and return none.

    The records go to ``outbox``, to be committed with the task's offset; without one, straight to
    the component's producer. A task is dead-lettered whole so that no group waits for a member that
    never comes, and an over-size trajectory never reaches the commit, where it would fail the batch
    at every restart.
    """
    send = ctx.producer.send if outbox is None else outbox.send
    dead_letter = ctx.dead_letter if outbox is None else outbox.dead_letter
    if outcome.error is not None:
        dead_letter(None, f"workflow failed for task {outcome.task.task_id}: {outcome.error}", outcome.error)
        return []
    records = [(trajectory, ctx.codec.encode(trajectory)) for trajectory in outcome.trajectories]
    for trajectory, value in records:
        too_large = ctx.oversize(ctx.topics.trajectories(trajectory.policy), value, SAMPLE_HEADROOM_BYTES)
        if too_large is not None:
            reason = f"trajectory {trajectory.trajectory_id}: {too_large}"
            dead_letter(None, f"workflow failed for task {outcome.task.task_id}: {reason}", RecordTooLargeError(reason))
            return []
    for trajectory, value in records:
        send(ctx.topics.trajectories(trajectory.policy), value, key=trajectory.group_id.encode())
    return [trajectory for trajectory, _ in records]
