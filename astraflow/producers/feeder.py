"""Task feeder: dataset prompts → ``{run}.tasks.{workflow}``, within the staleness budget.

Back-pressure follows AReaL's staleness capacity (ALGORITHMS.md): with B groups per trainer batch
and trainer version V, at most ``(max_staleness + V + 1) · B`` groups may have been submitted in
total, plus every group the stream processor dropped (zero variance or stale, reported on the
feedback topic with ``accepted = false``), because a dropped group never reaches the trainer and
would otherwise stall the run. The feeder learns V from the weights topic's manifests.

Task ids are deterministic (``{prompt_id}@{epoch}``) and the n-th task is a pure function of n and
the seed, so a restarted feeder counts the tasks already on the topic and continues the same
sequence: no task is submitted twice and none is skipped.
"""

from __future__ import annotations

import logging
import math
import random
import threading

from astraflow.context import ComponentContext, now_ms
from astraflow.errors import AstraFlowError
from astraflow.log import TopicPartition
from astraflow.schemas.records import PromptStats, RolloutTask
from astraflow.tasks.arithmetic import Problem
from astraflow.weights.follow import WeightFollower

logger = logging.getLogger(__name__)


class DropCounter:
    """Counts groups the stream processor dropped, from the feedback topic (read from the start)."""

    def __init__(self, ctx: ComponentContext) -> None:
        self.dropped = 0
        self._codec = ctx.codec
        self._consumer = ctx.log.consumer(group_id=None)
        self._consumer.assign([TopicPartition(ctx.topics.feedback(), 0)])
        self._consumer.seek_to_beginning()

    def update(self) -> int:
        for message in self._consumer.poll(max_records=1000, timeout=0.0):
            try:
                stats = self._codec.decode(message.value, expect=PromptStats)
            except AstraFlowError as exc:
                logger.error("undecodable feedback record at offset %d: %s", message.offset, exc)
                continue
            self.dropped += not stats.accepted
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
        self.groups_per_batch = math.ceil(cfg.train.batch_samples / cfg.rollout.group_size)
        self.submitted = sum(ctx.log.end_offsets(ctx.topics.tasks()).values())
        self._orders: dict[int, list[int]] = {}

    def task(self, n: int, version: int) -> RolloutTask:
        """The n-th task of the run (deterministic in n and the seed)."""
        epoch, index = divmod(n, len(self.rows))
        if epoch not in self._orders:
            order = list(range(len(self.rows)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}
        row = self.rows[self._orders[epoch][index]]
        task_id = f"{row.prompt_id}@{epoch}"
        cfg = self.ctx.config
        return RolloutTask(
            task_id=task_id,
            prompt_id=row.prompt_id,
            group_id=task_id,
            workflow=cfg.workflow,
            prompt=row.prompt,
            reference=row.answer,
            group_size=cfg.rollout.group_size,
            submitted_version=version,
            created_ms=now_ms(),
        )

    def capacity(self, version: int, dropped: int) -> int:
        """Groups that may have been submitted in total at trainer version ``version``."""
        return (self.ctx.config.stream.max_staleness + max(version, 0) + 1) * self.groups_per_batch + dropped

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        follower = WeightFollower(ctx.log, ctx.topics.weights(ctx.config.policy), payload=False).start()
        drops = DropCounter(ctx)
        try:
            while not stop.is_set():
                version = follower.latest_version
                allowed = self.capacity(version, drops.update())
                sent = 0
                while self.submitted < allowed:
                    task = self.task(self.submitted, version)
                    ctx.producer.send(ctx.topics.tasks(), ctx.codec.encode(task), key=task.task_id.encode())
                    self.submitted += 1
                    sent += 1
                if sent:
                    ctx.metric("feeder.submitted", self.submitted, max(version, 0))
                    ctx.producer.flush()
                    logger.info("submitted %d tasks (total %d, version %d)", sent, self.submitted, version)
                follower.wait_for(version + 1, timeout=0.5)
        finally:
            follower.close()
            drops.close()
