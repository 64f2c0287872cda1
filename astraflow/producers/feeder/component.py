"""Task feeder: dataset prompts → ``{run}.tasks.{workflow}``, within the staleness budget.

Back-pressure follows AReaL's staleness capacity (docs/algorithms.md): with B groups per trainer batch
and trainer version V, at most ``(max_staleness + V + 1) · B`` groups may have been submitted in
total, plus every group the stream processor or the trainer dropped (zero variance or stale,
reported on the feedback topic with ``accepted = false``), because a dropped group never reaches
the trainer and would otherwise stall the run. Each dropped group counts once, and a stale one not
at all where ``max_staleness`` is 0: there it was surplus (``feedback.py``). With a replay ratio ρ
in the stream pipeline only (1 − ρ) of each batch is fresh, so n batches take n · B · (1 − ρ) + 1
fresh groups (``PolicyBudget.fresh_groups``: the one more is for the replay share the first batch
misses); in lockstep, where a batch's leftover fresh groups go stale and the trainer takes at most
c replayed groups a batch, n · (B − c + 1). The feeder learns V from the weights topic's manifests.

Spare groups (``stream.spare_groups``, where a policy's ``max_staleness`` is 0). There the bound holds
exactly one batch, so every group the stream drops is replaced only after its feedback arrives: a round
trip feedback → feeder → producer → stream → trainer on each version's critical path. Instead the feeder
counts spares as if they were dropped already: with each version v it releases E_v spare groups,
``spare_groups`` times the groups a batch loses at the drop rate of the last four versions (B q / (1 − q)
for B groups a batch and a share q dropped), and the bound becomes
``capacity(V, D + W + max(0, E_V − d_V))``, where d_V is the drops reported since the feeder saw version V
(they use spares up before any replacement is released) and W the spares of earlier versions no drop used
(surplus: a group the trainer did not need goes stale at the next version and gives nothing back). Each
task records this state (``spares.<policy>``); a restarted feeder continues from it, and where the version
moved on since, counts the whole E of the recorded version as surplus: more than the truth at worst, so
the restart can over-release a few groups once but never leaves a batch short.

With several policies the bound is computed per policy p, in tasks: one task yields g_p groups of
p (``Workflow.groups_per_task``), so n batches take ⌈fresh groups of p / g_p⌉ tasks and p's dropped
groups give back ⌈dropped_p / g_p⌉ tasks; the feeder submits up to the smallest bound, i.e. it
follows the slowest trainer. In ``mode: lockstep`` every max_staleness is 0, so the next batch is
released only once every trainer published the version trained on the previous one; each task
then records those versions (``version.<policy>`` in its metadata) for the producers to wait for.

Steps of one submission round (what makes a restart submit what an uninterrupted feeder would):

1. Read the feedback that arrived (dropped groups give tasks back; the curator observes each
   PromptStats), and compute how many tasks may have been submitted by now.
2. Walk the candidates from the cursor: the n-th candidate task is a pure function of n and the
   seed, and its task id is deterministic (``{prompt_id}@{epoch}``). The curator (``stream.curator``)
   admits or skips each; a dataset row that cannot become a task is dead-lettered and skipped.
   Each admitted task records its candidate index n (``cursor``) and its submission number
   (``seq``) in its metadata. Tasks and dead letters go into an ``Outbox``; nothing is sent yet.
3. Write the round in one transaction of the producer with the transactional id
   ``{run}.feed.{workflow}`` (one feeder per workflow), and commit: the whole round becomes
   visible, or nothing of it after a crash. A round the log aborts is rolled back (cursor and
   counts) and its candidates decided again in the next round; ``FencedError`` means a newer feeder
   of the workflow took over, and ends this one. The feeder reads no input at committed offsets, so
   its transactions carry no offsets: where it stands is in the tasks it committed.

On start the feeder first opens that producer, which fences an older feeder still running and ends
its open round (on Kafka the transaction is aborted at once), then reads the newest task of each
tasks partition (``newest_tasks.py``) and continues after the highest ``cursor``, counting one
task more than the highest ``seq`` as submitted: no task is submitted twice, and no candidate passed
over without the curator's decision. End offsets do not count tasks: on Kafka transaction markers
take offsets too.

Curator statistics need no changelog topic. The curator's state is a pure function of the
PromptStats it observed, in log order (``curators.py``), and its decision on candidate n a pure
function of that state and (seed, prompt, n): GRESO's draws are hashed, not taken from a random
generator whose position a restart would lose. A starting feeder reads the whole feedback topic,
up to the end it has when the feeder starts, before its first round, so it holds the state the
crashed one held at that point of the feedback and decides each candidate it had not committed as
the crashed feeder would have, had that one read the same feedback first.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field

from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import AstraFlowError, TransactionAbortedError
from astraflow.core.metric_names import FEEDER_SKIPPED, FEEDER_SUBMITTED
from astraflow.episodes.workflows.factory import build_run_workflow
from astraflow.log import TransactionalProducer
from astraflow.producers.feeder.curators import build_curator
from astraflow.producers.feeder.feedback import FeedbackReader
from astraflow.producers.feeder.newest_tasks import newest_tasks
from astraflow.runtime.context import ComponentContext, now_ms
from astraflow.runtime.outbox import Outbox
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.base import Problem
from astraflow.weights.follow import follow_weights

logger = logging.getLogger(__name__)


SPARE_WINDOW = 4
"""Versions over which the feeder measures the drop rate it provides spares for."""
MAX_DROP_RATE = 0.9
"""Spares are sized for at most this drop rate (nine spares a kept group): more, and replacements do the rest."""


@dataclass
class Spares:
    """One policy's spare groups (module docstring, "Spare groups"), in groups."""

    factor: float
    batch: int
    """Fresh groups in one trainer batch."""
    version: int | None = None
    base: int = 0
    """The policy's dropped groups (the feedback's count) when ``version`` began."""
    target: int = 0
    """E: spare groups released with ``version``."""
    wasted: int = 0
    """W: spare groups of earlier versions that no drop used."""
    recent: list[tuple[int, int]] = field(default_factory=list)
    """(groups dropped, groups released) during each of the last ``SPARE_WINDOW`` versions."""
    restored: bool = False
    """Restored from a task and not yet compared with the version the restarted feeder reads."""

    def groups(self, version: int, dropped: int) -> int:
        """Groups to count as dropped on top of ``dropped`` at trainer version ``version``."""
        if version != self.version and self.restored:
            # the version moved on since the recorded state: how many of its spares drops used is unknown
            self.wasted += self.target
            self.version, self.base = version, dropped
        elif version != self.version:
            if self.version is not None:
                used = dropped - self.base
                self.wasted += max(0, self.target - used)
                self.recent = (self.recent + [(used, self.batch + max(used, self.target))])[-SPARE_WINDOW:]
            self.version, self.base = version, dropped
            if self.recent:
                # from the drop rate, not the drop count: spares are dropped at the same rate, so a count would
                # feed on itself
                rate = min(sum(d for d, _ in self.recent) / sum(r for _, r in self.recent), MAX_DROP_RATE)
                self.target = math.ceil(self.factor * self.batch * rate / (1.0 - rate) - 1e-9)
        self.restored = False
        return self.wasted + max(0, self.target - (dropped - self.base))

    def state(self) -> str:
        """What a task records of it (``spares.<policy>``)."""
        recent = ";".join(f"{d}:{r}" for d, r in self.recent)
        return f"{self.version},{self.base},{self.target},{self.wasted},{recent}"

    def restore(self, state: str) -> None:
        """Continue from a recorded ``state``: at the same version exactly; where the next ``groups`` reads a newer
        one, with the recorded version's spares all counted as surplus."""
        version, base, target, wasted, recent = state.split(",")
        self.version, self.base, self.target, self.wasted = int(version), int(base), int(target), int(wasted)
        self.recent = [(int(d), int(r)) for d, r in (pair.split(":") for pair in recent.split(";") if pair)]
        self.restored = True


@dataclass(frozen=True)
class PolicyBudget:
    """One policy's part of the back-pressure bound, in tasks."""

    max_staleness: int
    batch_groups: int
    """Groups in one trainer batch: ⌈B / g⌉ (the trainer cuts batches at whole groups)."""
    groups_per_task: int
    replay_ratio: float = 0.0
    lockstep_replays: int | None = None
    """Replayed groups a lockstep batch takes (``StreamConfig.lockstep_replays``); ``None``: not lockstep
    with replay."""

    def fresh_groups(self, batches: int) -> int:
        """Fresh groups that fill ``batches`` trainer batches with the replay mixer's share added.

        Each fresh group earns r / (1 - r) of its samples in replayed ones, paid in whole groups,
        and the first group of a run earns nothing (the buffer is empty): n batches need
        n ⌈B / g⌉ (1 - r) + 1 fresh groups with replay, n ⌈B / g⌉ without, what one batch leaves
        over filling the next. In lockstep with replay nothing fresh is left over (a fresh group
        the batch did not take is stale at the next version) and the trainer takes at most c
        replayed groups a batch (``lockstep_replays``), so each batch gets ⌈B / g⌉ - c + 1 fresh
        groups: one more than it needs when the replays are there, covering a replay the mixers'
        rounding held back. With the average count there, the fraction a batch lacked was lost
        each time and the run waited for ever (the data-algorithm benchmark's replay arms, at
        versions 64 and 19). Two earlier versions were wrong: ⌈B (1 - r) / g⌉ per batch left the
        first lockstep batch waiting for ever (45 fresh groups and 18 replayed: 504 of 512
        samples), and the first batch's count (46) for every batch fed 1.2 groups too many per
        version, so the trainer's backlog grew by ~14 samples a version and it trained ever staler
        samples (staleness 3 by version 90).
        """
        if self.lockstep_replays is not None:
            return batches * (self.batch_groups - self.lockstep_replays + 1)
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
            cfg.stream.max_staleness,
            batch_groups,
            workflow.groups_per_task(policy),
            cfg.stream.replay_ratio,
            cfg.stream.lockstep_replays(batch_groups, cfg.log.partitions),
        )
    return budgets


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
        self.transactional_id = f"{cfg.run}.feed.{cfg.workflow}"
        self.submitted = 0
        self.cursor = 0
        self.skipped = 0
        self._stalled = False
        self._orders: dict[int, list[int]] = {}
        self.spares = {
            policy: Spares(cfg.for_policy(policy).stream.spare_groups, budget.fresh_groups(1))
            for policy, budget in self.budgets.items()
            if budget.max_staleness == 0 and cfg.for_policy(policy).stream.spare_groups > 0
        }

    def resume(self) -> None:
        """Continue after the newest task of each tasks partition (module docstring). Call it once
        older feeders are fenced, as ``run`` does."""
        ctx = self.ctx
        newest = newest_tasks(ctx.log, ctx.codec, ctx.topics.tasks()).values()
        if not newest:
            return
        # tasks written before ``seq`` and ``cursor`` were recorded: counted by offsets, one candidate each
        counted = sum(ctx.log.end_offsets(ctx.topics.tasks()).values())
        self.submitted = max(int(t.metadata["seq"]) + 1 if "seq" in t.metadata else counted for t in newest)
        self.cursor = max(self.submitted, *(int(t.metadata.get("cursor", -1)) + 1 for t in newest))
        last = max(newest, key=lambda t: int(t.metadata.get("seq", -1)))
        for policy, spares in self.spares.items():
            if f"spares.{policy}" in last.metadata:
                spares.restore(last.metadata[f"spares.{policy}"])

    def task(self, n: int, versions: dict[str, int], seq: int | None = None) -> RolloutTask:
        """The n-th candidate task of the run (deterministic in n and the seed); ``seq``: its submission number."""
        epoch, index = divmod(n, len(self.rows))
        if epoch not in self._orders:
            order = list(range(len(self.rows)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}
        row = self.rows[self._orders[epoch][index]]
        task_id = f"{row.prompt_id}@{epoch}"
        cfg = self.ctx.config
        metadata = {"cursor": str(n)}
        if seq is not None:
            metadata["seq"] = str(seq)
        if cfg.mode == "lockstep":
            metadata.update({f"version.{policy}": str(max(v, 0)) for policy, v in versions.items()})
        metadata.update({f"spares.{p}": s.state() for p, s in self.spares.items() if s.version is not None})
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

    def _encoded(self, n: int, versions: dict[str, int], outbox: Outbox) -> tuple[RolloutTask, bytes] | None:
        """The n-th task and its record, or ``None`` (dead-lettered) when its row cannot make one that
        fits the tasks topic: a bad row is passed over like a curator's skip, never retried for ever."""
        ctx = self.ctx
        try:
            task = self.task(n, versions, seq=self.submitted)
            value = ctx.codec.encode(task)
            problem = ctx.oversize(ctx.topics.tasks(), value)
        except Exception as exc:  # a row that cannot become a task is skipped, never the feeder
            problem, error = f"{type(exc).__name__}: {exc}", exc
        else:
            error = None
            if problem is None:
                return task, value
        outbox.dead_letter(None, f"dataset row of candidate {n} cannot be submitted: {problem}", error)
        return None

    def capacity(self, versions: dict[str, int], dropped: Counter[str]) -> int:
        """Tasks that may have been submitted in total at these trainer versions: the slowest policy's bound, spare
        groups included (module docstring)."""
        extra = {policy: spares.groups(versions[policy], dropped[policy]) for policy, spares in self.spares.items()}
        return min(
            budget.capacity(versions[policy], dropped[policy] + extra.get(policy, 0))
            for policy, budget in self.budgets.items()
        )

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        with ExitStack() as stack:
            # opening the producer fences an older feeder (step 3), so the tasks read next are final
            producer = stack.enter_context(ctx.log.transactional_producer(self.transactional_id))
            self.resume()
            replace_stale = {policy: budget.max_staleness > 0 for policy, budget in self.budgets.items()}
            feedback = FeedbackReader(ctx, self.curator, replace_stale)
            stack.callback(feedback.close)
            feedback.catch_up()
            followers = {}
            for policy in self.budgets:
                followers[policy] = follow_weights(ctx, policy, payload=False)
                stack.callback(followers[policy].close)
            while not stop.is_set():
                versions = {policy: follower.latest_version for policy, follower in followers.items()}
                version = min(versions.values())
                sent = self._round(producer, versions, self.capacity(versions, feedback.update()))
                if sent:
                    ctx.metric(FEEDER_SUBMITTED, self.submitted, max(version, 0))
                    ctx.metric(FEEDER_SKIPPED, self.skipped, max(version, 0), curator=self.curator.name)
                    crash_point("feeder.flush_metrics", self.submitted)
                    ctx.producer.flush()
                    logger.info("submitted %d tasks (total %d, version %d)", sent, self.submitted, version)
                slowest = min(followers, key=lambda policy: versions[policy])
                # wake for a new version, or soon after for dropped groups to replace: with a small
                # staleness budget every refill round trip is on the trainer's critical path
                followers[slowest].wait_for(versions[slowest] + 1, timeout=0.05)

    def _round(self, producer: TransactionalProducer, versions: dict[str, int], allowed: int) -> int:
        """Steps 2 and 3: decide candidates until ``allowed`` tasks are submitted in all, or a whole pass
        of the dataset was skipped, and commit them; the number of tasks this round submitted."""
        before = (self.cursor, self.submitted, self.skipped)
        outbox = Outbox(self.ctx)
        sent = passed_over = 0
        while self.submitted < allowed and passed_over < len(self.rows):
            candidate = self.cursor
            self.cursor += 1
            value = self._encoded(candidate, versions, outbox)
            if value is None or not self.curator.admit(value[0].prompt_id, candidate):
                self.skipped += 1
                passed_over += 1
                continue
            task, encoded = value
            outbox.send(self.ctx.topics.tasks(), encoded, key=task.task_id.encode())
            self.submitted += 1
            sent += 1
            passed_over = 0
        stalled = passed_over == len(self.rows)
        if stalled and not self._stalled:
            logger.warning(
                "the %s curator skipped a whole pass of the dataset; waiting for feedback", self.curator.name
            )
        self._stalled = stalled
        if not outbox.records:
            return 0
        try:
            producer.begin()
            outbox.write(producer)
            crash_point("feeder.commit", self.submitted)  # the round's tasks (and its dead letters)
            producer.commit()
        except TransactionAbortedError as exc:
            logger.warning("the log aborted a round of %d tasks; it is decided again: %s", sent, exc)
            self.cursor, self.submitted, self.skipped = before
            return 0
        return sent
