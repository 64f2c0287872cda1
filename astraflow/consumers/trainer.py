"""Trainer consumer: train samples → PPO-clip steps → weight versions on the log.

Steps of one version (the order is the guarantee):

1. Read samples of ``{run}.samples.{policy}`` in offset order (undecodable or duplicate samples are
   dead-lettered / dropped and counted) until the oldest complete groups hold ``batch_samples``.
2. One optimizer step on that batch (``astraflow.training.step``): version v → v + 1.
3. Every ``checkpoint_every`` versions: an atomic checkpoint of model, optimizer, version and the
   offset *after* the batch's last sample (``CheckpointStore``), with every version's offsets and
   the offsets this trainer resumed from (``astraflow audit`` reads which samples were trained).
4. Publish version v + 1 (chunks, then manifest) to ``{run}.weights.{policy}``: a sparse delta
   against version v in the transfer dtype, or a full version (``weights.*``, ``weights/publish.py``).
5. Commit the consumed offsets to the trainer's group (for ``lag``; resumption uses the checkpoint,
   so a commit that fails, e.g. while the broker restarts, is only logged).

A crash after 2 and before 3 redoes the steps since the last checkpoint from the same samples.
Because checkpoints precede publishing, a version that readers saw is always a checkpointed one
when ``checkpoint_every`` is 1; with larger intervals a redone version may be republished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from astraflow.context import ComponentContext
from astraflow.errors import AstraFlowError, LogError
from astraflow.log import Message, TopicPartition
from astraflow.metric_names import TRAIN_VERSION, train_metric
from astraflow.models.base import base_checkpoint_path
from astraflow.rundir import RunDir
from astraflow.schemas.records import TrainSample
from astraflow.training.checkpoint import RECALL_WINDOW, CheckpointStore, TrainerState
from astraflow.weights.publish import WeightPublisher

logger = logging.getLogger(__name__)


class BatchAssembler:
    """Cuts the sample stream into batches of whole groups, strictly in offset order."""

    def __init__(self, batch_samples: int, remember: int = 200_000) -> None:
        self.batch_samples = batch_samples
        self.buffer: list[tuple[TrainSample, Message]] = []
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self.duplicates = 0

    def remember(self, sample_id: str) -> bool:
        """Note ``sample_id`` as taken; False when it was already (a duplicate)."""
        if sample_id in self._seen:
            return False
        self._seen[sample_id] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        return True

    def add(self, sample: TrainSample, message: Message) -> None:
        if not self.remember(sample.sample_id):
            self.duplicates += 1
            return
        self.buffer.append((sample, message))

    def take(self) -> tuple[list[TrainSample], Message] | None:
        """The next batch and its last message, when the buffer's prefix holds enough whole groups."""
        remaining: dict[str, int] = {}
        for index, (sample, _) in enumerate(self.buffer):
            gid = sample.trajectory.group_id
            remaining[gid] = remaining.get(gid, sample.trajectory.group_size) - 1
            if remaining[gid] == 0:
                del remaining[gid]
            if index + 1 >= self.batch_samples and not remaining:
                batch, self.buffer = self.buffer[: index + 1], self.buffer[index + 1 :]
                return [s for s, _ in batch], batch[-1][1]
        return None


class Trainer:
    """Trains one policy from its samples topic and publishes every version."""

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        import torch

        from astraflow.models.loading import load_policy
        from astraflow.training.learner import build_learner
        from astraflow.training.step import PolicyStepConfig

        cfg = ctx.config.train
        torch.set_num_threads(cfg.threads)
        self.ctx = ctx
        self.policy = policy
        model, self.tokenizer = load_policy(base_checkpoint_path(ctx.config, ctx.run_dir))
        step_config = PolicyStepConfig(
            lr=cfg.lr,
            lr_warmup_steps=cfg.lr_warmup_versions,
            lr_decay_steps=cfg.lr_decay_versions,
            min_lr_ratio=cfg.min_lr_ratio,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            temperature=ctx.config.rollout.temperature,
            eps_low=cfg.clip_low,
            eps_high=cfg.clip_high,
        )
        self.learner = build_learner(
            cfg.backend,
            model,
            self.tokenizer.pad_token_id,
            step_config,
            deepspeed=cfg.deepspeed,
            simulated=cfg.simulated,
        )
        logger.info(
            "trainer backend %s%s",
            cfg.backend,
            f" (ZeRO stage {cfg.deepspeed.zero_stage}, optimizer offload {cfg.deepspeed.offload_optimizer})"
            if cfg.backend == "deepspeed"
            else "",
        )
        self.checkpoints = CheckpointStore(RunDir(ctx.run_dir).checkpoints(policy))
        restored = self.checkpoints.restore(model, self.learner.optimizer)
        self.learner.version = restored.version if restored else 0
        self.offsets = restored.offsets if restored else {}
        self.trained_samples = restored.trained_samples if restored else 0
        self.history = restored.history if restored else []
        self.resumes = restored.resumes + [dict(restored.offsets)] if restored else []
        if restored:
            logger.info("resumed %s at version %d from offsets %s", policy, restored.version, self.offsets)
        self.publisher = WeightPublisher(
            ctx.producer, ctx.codec, ctx.topics.weights(policy), policy, ctx.config.weights, log=ctx.log
        )

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        topic = ctx.topics.samples(self.policy)
        consumer = ctx.log.consumer(group_id=f"{ctx.config.run}.train.{self.policy}")
        partitions = [TopicPartition(topic, p) for p in range(ctx.log.describe_topic(topic).partitions)]
        consumer.assign(partitions)
        assembler = BatchAssembler(ctx.config.train.batch_samples)
        self._recall_trained(partitions, assembler)
        for tp in partitions:
            consumer.seek(tp, self.offsets.get(tp.partition, 0))
        version = self.learner.version
        self.publisher.publish(self.learner.model.state_dict(), version)
        ctx.metric(TRAIN_VERSION, version, version, policy=self.policy)
        ctx.producer.flush()
        waited = 0.0
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                for message in consumer.poll(max_records=1024, timeout=0.5):
                    try:
                        assembler.add(ctx.codec.decode(message.value, expect=TrainSample), message)
                    except AstraFlowError as exc:
                        ctx.dead_letter(message, f"undecodable sample: {exc}", exc)
                waited += time.perf_counter() - t0
                taken = assembler.take()
                if taken is None:
                    continue
                batch, last = taken
                self._step(batch, last, waited)
                waited = 0.0
                try:
                    consumer.commit({TopicPartition(topic, last.partition): last.offset + 1})
                except LogError as exc:  # e.g. the broker restarting: only ``lag`` reads this commit
                    logger.warning("commit of the trainer's offsets failed (resumption uses the checkpoint): %s", exc)
        finally:
            consumer.close()

    def _recall_trained(
        self, partitions: list[TopicPartition], assembler: BatchAssembler, window: int = RECALL_WINDOW
    ) -> None:
        """After a restart, re-read the ids of the last ``window`` samples below the checkpointed offsets.

        A stream processor that crashed between emitting a group and committing its input emits the
        group again; the copy lands right after the original. Remembering the ids trained just before
        the checkpoint lets the dedup in ``BatchAssembler`` drop such a copy across trainer restarts too.
        """
        for tp in partitions:
            end = self.offsets.get(tp.partition, 0)
            if end == 0:
                continue
            reader = self.ctx.log.consumer()  # no group: reads without touching the trainer's offsets
            try:
                reader.assign([tp])
                reader.seek(tp, max(0, end - window))
                position = max(0, end - window)
                while position < end:
                    messages = reader.poll(max_records=1024, timeout=1.0)
                    if not messages:
                        break
                    for message in messages:
                        position = message.offset + 1
                        if message.offset < end:
                            try:
                                assembler.remember(self.ctx.codec.decode(message.value, expect=TrainSample).sample_id)
                            except AstraFlowError:
                                pass  # dead-lettered when it was first read
            finally:
                reader.close()

    def _step(self, batch: list[TrainSample], last: Message, waited: float) -> None:
        from astraflow.training.step import PolicyExample

        ctx = self.ctx
        learner = self.learner
        staleness = [learner.version - s.trajectory.min_version for s in batch]
        examples = [
            PolicyExample(
                s.trajectory.prompt_ids,
                s.trajectory.response_ids,
                s.trajectory.behaviour_logprobs,
                s.trajectory.loss_mask,
                s.advantage,
            )
            for s in batch
        ]
        stats = learner.step(examples)
        version = learner.version
        self.trained_samples += len(batch)
        self.offsets[last.partition] = last.offset + 1
        self.history.append((version, dict(self.offsets)))
        if version % ctx.config.train.checkpoint_every == 0:
            state = TrainerState(
                version, dict(self.offsets), self.trained_samples, list(self.history), list(self.resumes), RECALL_WINDOW
            )
            self.checkpoints.save(learner.model, learner.optimizer, state)
        manifest = self.publisher.publish(learner.model.state_dict(), version)
        changed = self.publisher.last_stats.changed / max(self.publisher.last_stats.elements, 1)
        figures = {
            "loss": stats.loss,
            "grad_norm": stats.grad_norm,
            "step_seconds": stats.seconds,
            "wait_seconds": waited,
            "staleness_max": max(staleness),
            "samples": self.trained_samples,
            "weights_bytes": manifest.total_bytes,
            "weights_changed_fraction": changed,
            **stats.loss_stats,
        }
        for name, value in figures.items():
            ctx.metric(train_metric(name), value, version, policy=self.policy)
        ctx.metric(TRAIN_VERSION, version, version, policy=self.policy)
        ctx.producer.flush()
        logger.info(
            "version %d: loss %.4f, grad norm %.3f, %d samples, %.2f s",
            version,
            stats.loss,
            stats.grad_norm,
            len(batch),
            stats.seconds,
        )
