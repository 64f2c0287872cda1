"""Task feeder: dataset prompts → ``{run}.tasks.{workflow}``, within the staleness budget.

Back-pressure follows AReaL's staleness capacity (docs/algorithms.md): with B groups per trainer batch
and trainer version V, at most ``(max_staleness + V + 1) · B`` groups may have been submitted in
total, plus every group the stream processor dropped (zero variance or stale, reported on the
feedback topic with ``accepted = false``), because a dropped group never reaches the trainer and
would otherwise stall the run. With a replay ratio ρ in the stream pipeline only (1 − ρ) of each
batch is fresh, so n batches take n · B · (1 − ρ) + 1 fresh groups (``PolicyBudget.fresh_groups``:
the one more is for the replay share the first batch misses). The feeder learns V from the weights
topic's manifests.

With several policies the bound is computed per policy p, in tasks: one task yields g_p groups of
p (``Workflow.groups_per_task``), so n batches take ⌈fresh groups of p / g_p⌉ tasks and p's dropped
groups give back ⌈dropped_p / g_p⌉ tasks; the feeder submits up to the smallest bound, i.e. it
follows the slowest trainer. In ``mode: lockstep`` every max_staleness is 0, so the next batch is
released only once every trainer published the version trained on the previous one; each task
then records those versions (``version.<policy>`` in its metadata) for the producers to wait for.

The n-th candidate task is a pure function of n and the seed, and its task id is deterministic
(``{prompt_id}@{epoch}``). The curator (``stream.curator``, fed by the PromptStats on the feedback
topic) may skip a candidate; each submitted task records its candidate index n in its metadata
(``cursor``), so a restarted feeder reads the last task of each partition and continues after
it: no task is submitted twice, and no candidate is passed over without the curator's decision.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections import Counter
from dataclasses import dataclass

from astraflow.context import ComponentContext, now_ms
from astraflow.errors import AstraFlowError
from astraflow.log import TopicPartition
from astraflow.metric_names import FEEDER_SKIPPED, FEEDER_SUBMITTED
from astraflow.producers.curators import Curator, build_curator
from astraflow.producers.workflows.factory import build_run_workflow
from astraflow.schemas.records import PromptStats, RolloutTask
from astraflow.tasks.base import Problem
from astraflow.weights.follow import WeightFollower

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyBudget:
    """One policy's part of the back-pressure bound, in tasks."""

    max_staleness: int
    batch_groups: int
    """Groups in one trainer batch: ⌈B / g⌉ (the trainer cuts batches at whole groups)."""
    groups_per_task: int
    replay_ratio: float = 0.0

    def fresh_groups(self, batches: int) -> int:
        """Fresh groups that fill ``batches`` trainer batches with the replay mixer's share added.

        Each fresh group earns r / (1 - r) of its samples in replayed ones, paid in whole groups,
        and the first group of a run earns nothing (the buffer is empty): n batches need
        n ⌈B / g⌉ (1 - r) + 1 fresh groups with replay, n ⌈B / g⌉ without. Two earlier versions
        were wrong: ⌈B (1 - r) / g⌉ per batch left the first lockstep batch waiting for ever (45
        fresh groups and 18 replayed: 504 of 512 samples), and the first batch's count (46) for
        every batch fed 1.2 groups too many per version, so the trainer's backlog grew by ~14
        samples a version and it trained ever staler samples (staleness 3 by version 90).
        """
        if self.replay_ratio <= 0:
            return batches * self.batch_groups
        return math.ceil(batches * self.batch_groups * (1.0 - self.replay_ratio) + 1.0 - 1e-9)

    @property
    def tasks_per_batch(self) -> int:
        """Tasks of the first batch."""
        return -(-self.fresh_groups(1) // self.groups_per_task)

    def capacity(self, version: int, dropped_groups: int) -> int:
        """Tasks that may have been submitted in total at this policy's trainer version ``version``."""
        returned = -(-dropped_groups // self.groups_per_task)
        batches = self.max_staleness + max(version, 0) + 1
        return -(-self.fresh_groups(batches) // self.groups_per_task) + returned


def policy_budgets(config) -> dict[str, PolicyBudget]:
    """The budget of every policy of the run's workflow (``RunConfig``)."""
    workflow = build_run_workflow(config)
    budgets = {}
    for policy in workflow.policies:
        cfg = config.for_policy(policy)
        batch_groups = math.ceil(cfg.train.batch_samples / cfg.rollout.group_size)
        budgets[policy] = PolicyBudget(
            cfg.stream.max_staleness, batch_groups, workflow.groups_per_task(policy), cfg.stream.replay_ratio
        )
    return budgets


class FeedbackReader:
    """Reads the feedback topic from the start: counts dropped groups per policy and feeds the curator.

    A record that does not decode, or that the curator cannot take in, is dead-lettered and skipped."""

    def __init__(self, ctx: ComponentContext, curator: Curator) -> None:
        self.dropped: Counter[str] = Counter()
        self.curator = curator
        self._ctx = ctx
        self._codec = ctx.codec
        self._consumer = ctx.log.consumer(group_id=None)
        self._consumer.assign([TopicPartition(ctx.topics.feedback(), 0)])
        self._consumer.seek_to_beginning()

    def update(self) -> Counter[str]:
        for message in self._consumer.poll(max_records=1000, timeout=0.0):
            try:
                stats = self._codec.decode(message.value, expect=PromptStats)
            except AstraFlowError as exc:
                self._ctx.dead_letter(message, f"undecodable feedback: {exc}", exc)
                continue
            self.dropped[stats.policy] += not stats.accepted
            try:
                self.curator.observe(stats)
            except Exception as exc:  # one record the curator cannot take never stops the feeder
                self._ctx.dead_letter(message, f"feedback the curator rejects: {type(exc).__name__}: {exc}", exc)
        return self.dropped

    def close(self) -> None:
        self._consumer.close()


class TaskFeeder:
    """Submits tasks for one workflow from a list of dataset rows."""

    def __init__(self, ctx: ComponentContext, rows: list[Problem], seed: int = 0) -> None:
        if not rows:
            raise AstraFlowError("the task feeder got an empty dataset")
        self.ctx = ctx
        self.rows = rows
        self.seed = seed
        cfg = ctx.config
        self.budgets = policy_budgets(cfg)
        self.curator = build_curator(cfg.stream.curator)
        self.submitted = sum(ctx.log.end_offsets(ctx.topics.tasks()).values())
        self.cursor = self._resume_cursor()
        self.skipped = 0
        self._stalled = False
        self._orders: dict[int, list[int]] = {}

    def _resume_cursor(self) -> int:
        """The next candidate index: one past the ``cursor`` of the newest task on each partition."""
        ctx = self.ctx
        topic = ctx.topics.tasks()
        ends = {p: end for p, end in ctx.log.end_offsets(topic).items() if end > 0}
        if not ends:
            return 0
        cursor = self.submitted  # tasks written before cursors were recorded: one candidate each
        consumer = ctx.log.consumer(group_id=None)
        try:
            consumer.assign([TopicPartition(topic, p) for p in ends])
            for partition, end in ends.items():
                consumer.seek(TopicPartition(topic, partition), end - 1)
            for _ in range(20):
                for message in consumer.poll(max_records=len(ends), timeout=0.5):
                    ends.pop(message.partition, None)
                    try:
                        task = ctx.codec.decode(message.value, expect=RolloutTask)
                    except AstraFlowError as exc:
                        logger.error("undecodable task at %s/%d: %s", topic, message.offset, exc)
                        continue
                    cursor = max(cursor, int(task.metadata.get("cursor", -1)) + 1)
                if not ends:
                    return cursor
        finally:
            consumer.close()
        raise AstraFlowError(f"could not read the newest task of {topic} partitions {sorted(ends)} to resume")

    def task(self, n: int, versions: dict[str, int]) -> RolloutTask:
        """The n-th task of the run (deterministic in n and the seed)."""
        epoch, index = divmod(n, len(self.rows))
        if epoch not in self._orders:
            order = list(range(len(self.rows)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}
        row = self.rows[self._orders[epoch][index]]
        task_id = f"{row.prompt_id}@{epoch}"
        cfg = self.ctx.config
        metadata = {"cursor": str(n)}
        if cfg.mode == "lockstep":
            metadata.update({f"version.{policy}": str(max(v, 0)) for policy, v in versions.items()})
        return RolloutTask(
            task_id=task_id,
            prompt_id=row.prompt_id,
            group_id=task_id,
            workflow=cfg.workflow,
            prompt=row.prompt,
            reference=row.answer,
            group_size=cfg.rollout.group_size,
            submitted_version=max(min(versions.values()), 0),
            created_ms=now_ms(),
            metadata=metadata,
        )

    def _encoded(self, n: int, versions: dict[str, int]) -> tuple[RolloutTask, bytes] | None:
        """The n-th task and its record, or ``None`` (dead-lettered) when its row cannot make one that
        fits the tasks topic: a bad row is passed over like a curator's skip, never retried for ever."""
        ctx = self.ctx
        try:
            task = self.task(n, versions)
            value = ctx.codec.encode(task)
            problem = ctx.oversize(ctx.topics.tasks(), value)
        except Exception as exc:  # a row that cannot become a task is skipped, never the feeder
            problem, error = f"{type(exc).__name__}: {exc}", exc
        else:
            error = None
            if problem is None:
                return task, value
        ctx.dead_letter(None, f"dataset row of candidate {n} cannot be submitted: {problem}", error)
        return None

    def capacity(self, versions: dict[str, int], dropped: Counter[str]) -> int:
        """Tasks that may have been submitted in total at these trainer versions: the slowest policy's bound."""
        return min(budget.capacity(versions[policy], dropped[policy]) for policy, budget in self.budgets.items())

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        followers = {
            policy: WeightFollower(ctx.log, ctx.topics.weights(policy), payload=False).start()
            for policy in self.budgets
        }
        feedback = FeedbackReader(ctx, self.curator)
        try:
            while not stop.is_set():
                versions = {policy: follower.latest_version for policy, follower in followers.items()}
                version = min(versions.values())
                allowed = self.capacity(versions, feedback.update())
                sent = passed_over = 0
                while self.submitted < allowed and passed_over < len(self.rows):
                    candidate = self.cursor
                    self.cursor += 1
                    value = self._encoded(candidate, versions)
                    if value is None or not self.curator.admit(value[0].prompt_id):
                        self.skipped += 1
                        passed_over += 1
                        continue
                    task, encoded = value
                    ctx.producer.send(ctx.topics.tasks(), encoded, key=task.task_id.encode())
                    self.submitted += 1
                    sent += 1
                    passed_over = 0
                stalled = passed_over == len(self.rows)
                if stalled and not self._stalled:
                    logger.warning(
                        "the %s curator skipped a whole pass of the dataset; waiting for feedback", self.curator.name
                    )
                self._stalled = stalled
                if sent:
                    ctx.metric(FEEDER_SUBMITTED, self.submitted, max(version, 0))
                    ctx.metric(FEEDER_SKIPPED, self.skipped, max(version, 0), curator=self.curator.name)
                    ctx.producer.flush()
                    logger.info("submitted %d tasks (total %d, version %d)", sent, self.submitted, version)
                slowest = min(followers, key=lambda policy: versions[policy])
                # wake for a new version, or soon after for dropped groups to replace: with a small
                # staleness budget every refill round trip is on the trainer's critical path
                followers[slowest].wait_for(versions[slowest] + 1, timeout=0.05)
        finally:
            for follower in followers.values():
                follower.close()
            feedback.close()
