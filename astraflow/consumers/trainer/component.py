"""Trainer consumer: train samples → PPO-clip steps → weight versions on the log.

At start, before anything else, the trainer opens its transactional producer
(``{run}.train.{policy}``), which fences an older trainer of the policy: that one can commit
nothing more and exits at its next version without writing a checkpoint. It then reads its ledger
(``ledger.py``: its epoch, which checkpoints are valid, the next version id), restores the
newest valid checkpoint and publishes the weights it starts from (a ``start`` entry).

Steps of one version (the order is the guarantee):

1. Read samples of ``{run}.samples.{policy}`` in offset order until the oldest complete groups
   hold ``batch_samples``. A duplicate sample is dropped and counted; one that does not decode or
   that the model cannot train on is dead-lettered, and a stale group is dropped and reported
   (``sample_checks.py`` says which and why). Samples the trainer reads again after a crash, below
   the offsets of the newest version it had published (versions lost with their checkpoint), are
   trained whatever their age, as the lost versions trained them.
2. One optimizer step on that batch (``astraflow.training.step``): version v → v + 1. A step
   whose loss or gradient is not finite changes nothing: the batch is dead-lettered, no version
   is published, the offsets move past it, and it is counted (``train.skipped_steps``).
3. Every ``checkpoint_every`` versions, before the version is visible (so with ``checkpoint_every``
   1 every version readers can see has its checkpoint on disk): first a transaction that commits
   only the offsets already committed - where a fenced trainer learns it was fenced
   (``FencedError``) and exits without writing a checkpoint - then an atomic checkpoint of model,
   optimizer, version, epoch and, per samples partition, the offset after the batch's last sample
   there (``CheckpointStore``). The checkpoint stays out of the version's transaction, which so
   stays short however large the model (Kafka aborts a transaction open longer than
   ``transaction.timeout.ms``).
4. Begin the version's transaction; publish version v + 1 to ``{run}.weights.{policy}``: the chunks
   (a sparse delta against version v in the transfer dtype, or a full version - always at a
   checkpoint, so its ledger entry's sha256 is of the checkpoint's weights, which a restore checks;
   ``weights/publish.py``) flushed outside it, the manifest in it.
5. Send the version's ``LedgerEntry`` to ``{run}.ledger.{policy}`` in it: epoch, version, the
   version it was trained from, the samples partitions' ranges consumed since the last version,
   the sample ids, the payload's sha256; and the feedback of the stale groups dropped since the
   last version (step 1).
6. Send the offsets after the batch as the trainer group's offsets in it (a fenced trainer that
   skipped step 3 learns it here, having written nothing the log shows).
7. Commit: manifest, ledger entry and offsets become visible together, or none of them.
8. Once a commit makes a new checkpoint one the ledger names, retention deletes older ones
   (``CheckpointStore.prune``): never the newest named one, whatever crashes left above it.

On a stop signal the trainer finishes its step and, when its version is not checkpointed yet and
it is not fenced (step 3's probe), checkpoints it, so the run's final version is on disk
(``astraflow run`` exports it to ``final/<policy>``) and a restart redoes nothing.

A crash after 2 and before 7 leaves nothing of the version visible; a checkpoint it wrote is not
in the ledger and is passed over. A crash after versions published since the last checkpoint (with
``checkpoint_every`` above one) loses those versions: the restarted trainer publishes the
checkpoint's weights under the next unused version id and trains the samples since the
checkpoint again, into new versions; the ledger keeps both lineages apart.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from astraflow.consumers.trainer.batch_assembler import BatchAssembler, policy_examples, recall_trained
from astraflow.consumers.trainer.figures import version_figures
from astraflow.consumers.trainer.ledger import TrainerLedger, consumed_ranges
from astraflow.consumers.trainer.rank_learner import build_rank_learner, check_restored, restore_leader
from astraflow.consumers.trainer.sample_checks import sample_problem, stale_feedback, stale_groups
from astraflow.consumers.trainer.seals import CheckpointSeals
from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import FencedError, NonFiniteStepError
from astraflow.core.metric_names import (
    TRAIN_REJECTED_SAMPLES,
    TRAIN_SKIPPED_STEPS,
    TRAIN_STALE_SAMPLES,
    TRAIN_VERSION,
    train_metric,
)
from astraflow.core.rundir import RunDir
from astraflow.log import Consumer, Message, TopicPartition
from astraflow.runtime.base_checkpoint import base_checkpoint_path, model_limits
from astraflow.runtime.context import ComponentContext, now_ms
from astraflow.schemas.records import LedgerEntry, PromptStats, TrainSample
from astraflow.schemas.validation import Limits
from astraflow.training.checkpoint import (
    RECALL_WINDOW,
    CheckpointStore,
    TrainerState,
)
from astraflow.training.distributed import SINGLE, CommandChannel, Ranks
from astraflow.weights.publish import WeightPublisher

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

WAIT_WARNING_S = 60.0
"""A trainer that has waited this long for a batch says so, and again after as long each time."""


def waiting_message(waited: float, version: int, assembler: BatchAssembler, oldest_version: int | None) -> str:
    """What a trainer waiting for its next batch logs: how long, and what it holds of the batch."""
    held, stale = assembler.held(oldest_version)
    return (
        f"no batch for {waited:.0f} s after version {version}: {held} of {assembler.batch_samples} samples held"
        + (f" ({stale} more in stale groups)" if stale else "")
        + "; if the producers and the stream processor are idle too, the run is stalled: compare the feeder's "
        "submitted tasks with the stream's accepted and dropped groups (astraflow stats)"
    )


class Trainer:
    """Trains one policy from its samples topic and publishes every version."""

    def __init__(self, ctx: ComponentContext, policy: str, ranks: Ranks = SINGLE) -> None:
        if not ranks.leader:
            raise ValueError(
                f"rank {ranks.rank} runs a TrainerRank; only rank 0 is the Trainer, which writes to the log"
            )
        self.ctx = ctx
        self.policy = policy
        self.ranks = ranks
        base = base_checkpoint_path(ctx.config, ctx.run_dir)
        self.learner, self.tokenizer = build_rank_learner(ctx.config, ctx.run_dir, ranks)
        self.commands = CommandChannel(ranks)
        """Rank 0's instructions to the other ranks (``training/distributed.py``); nothing in a world of one."""
        vocab_size, context_length = model_limits(base)
        self.limits = Limits(group_size=None, vocab_size=vocab_size, context_length=context_length)
        self.rejected = 0
        self.skipped_steps = 0
        self.transactional_id = f"{ctx.config.run}.train.{policy}"
        self.transactions = ctx.log.transactional_producer(self.transactional_id)  # fences an older trainer
        self.ledger = ledger = TrainerLedger.read(ctx.log, ctx.codec, ctx.topics.ledger(policy))
        """What the ledger names, kept up to date with every entry this trainer commits (retention)."""
        self.epoch = ledger.next_epoch
        self.checkpoints = CheckpointStore(RunDir(ctx.run_dir).checkpoints(policy))
        restored, checkpointed = restore_leader(policy, self.learner, self.checkpoints, ledger, self.commands)
        self.restored = restored
        """The state of the checkpoint this trainer resumed from (``None``: the base)."""
        self.checkpointed = checkpointed
        """The newest checkpointed version (0: the base, which needs none)."""
        self.parent = (restored.epoch, restored.version) if restored else (-1, -1)
        """(epoch, version) of the ledger entry the next version is trained from."""
        self.offsets = restored.offsets if restored else {}
        self.committed = dict(self.offsets)
        """The offsets committed with the last version: where the next ledger entry's ranges start."""
        self.trained_samples = restored.trained_samples if restored else 0
        self.retrain_until = {int(partition): offset for partition, offset in ledger.last_offsets.items()}
        """The samples offsets of the newest version published: below them, samples are trained again
        whatever their age (step 1)."""
        self.staleness_bound = ctx.config.stream.staleness_bound
        batch_groups = -(-ctx.config.train.batch_samples // ctx.config.rollout.group_size)
        self.replay_cap = ctx.config.stream.lockstep_replays(batch_groups, ctx.config.log.partitions)
        """Replayed copies a lockstep batch takes at most (the feeder releases the rest fresh), or ``None``."""
        self.stale_samples = 0
        self.stale_feedback: list[PromptStats] = []
        """Stale groups dropped since the last version, sent in its transaction (step 5)."""
        self.publisher = WeightPublisher(
            ctx.producer, ctx.codec, ctx.topics.weights(policy), policy, ctx.config.weights, log=ctx.log
        )
        self.seals = CheckpointSeals(ctx.config, ctx.topics.weights(policy), policy, self.checkpoints.directory)
        self.consumer: Consumer | None = None
        """The samples consumer of ``run``, whose group's offsets each version's transaction commits."""

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        topic = ctx.topics.samples(self.policy)
        consumer = ctx.log.consumer(group_id=f"{ctx.config.run}.train.{self.policy}")
        partitions = [TopicPartition(topic, p) for p in range(ctx.log.describe_topic(topic).partitions)]
        consumer.assign(partitions)
        assembler = BatchAssembler(ctx.config.train.batch_samples, ctx.config.rollout.group_size)
        self._recall_trained(partitions, assembler)
        for tp in partitions:
            consumer.seek(tp, self.offsets.get(tp.partition, 0))
        self.consumer = consumer
        version = self.learner.version
        try:
            self._commit_version("start", [], full=True)
            ctx.metric(TRAIN_VERSION, version, version, policy=self.policy)
            crash_point("trainer.flush_start", version)
            ctx.producer.flush()
            waited, warn_at = 0.0, WAIT_WARNING_S
            while not stop.is_set():
                t0 = time.perf_counter()
                for message in consumer.poll(max_records=1024, timeout=0.5):
                    assembler.admit(message, ctx.codec, self._problem, self._reject)
                waited += time.perf_counter() - t0
                oldest = self._oldest_trainable()
                taken = assembler.take(oldest, self.replay_cap)
                if taken is None:
                    self.commands.keepalive()
                    if waited >= warn_at:
                        logger.warning(waiting_message(waited, self.learner.version, assembler, oldest))
                        warn_at += WAIT_WARNING_S
                    continue
                if assembler.stale:
                    self._drop_stale(assembler.stale)
                self._advance(assembler.skipped)  # replayed copies beyond the cap: consumed untrained
                self._step(taken, waited)
                waited, warn_at = 0.0, WAIT_WARNING_S
            if self.learner.version > self.checkpointed:  # stopped cleanly: keep the last version too
                try:
                    self._checkpoint_unless_fenced()
                except FencedError as exc:
                    raise self._fenced(f"its stop checkpoint of version {self.learner.version}") from exc
                self.checkpoints.prune(self.ledger.names)
            self.commands.send("stop")
        finally:
            consumer.close()
            self.transactions.close()  # aborts a transaction left open by a failure

    def _commit_version(self, kind: str, sample_ids: list[str], full: bool = False) -> None:
        """Steps 3-7: a checkpoint when one is due; then the current weights as version
        ``learner.version``, with its ledger entry and the offsets, in one transaction."""
        ctx, version = self.ctx, self.learner.version
        topic = ctx.topics.samples(self.policy)
        try:
            due = kind == "step" and version % ctx.config.train.checkpoint_every == 0
            if due:
                self._checkpoint_unless_fenced(published_full=True)  # step 3
                crash_point("trainer.checkpoint_written", version)  # the window between the write and the commit
            self.transactions.begin()
            self.commands.send("publish")  # a sharded model's ranks gather its tensors together
            manifest = self.publisher.publish(
                self.learner.backend.full_state(), version, full=full or due, transaction=self.transactions
            )
            if kind == "start":
                check_restored(self.restored, manifest.sha256, self.ledger)
                if self.restored is not None:
                    self.seals.check(self.restored.version, self.publisher)
            if due:
                self.seals.seal(version, self.publisher)  # before the commit: the ledger names only sealed ones
            entry = LedgerEntry(
                self.policy,
                kind,
                self.epoch,
                version,
                *self.parent,
                consumed_ranges(self.committed, self.offsets),
                sample_ids,
                {str(partition): offset for partition, offset in self.offsets.items()},
                manifest.sha256,
                self.trained_samples,
                now_ms(),
            )
            self.transactions.send(ctx.topics.ledger(self.policy), ctx.codec.encode(entry), key=str(version).encode())
            for stats in self.stale_feedback:
                self.transactions.send(ctx.topics.feedback(), ctx.codec.encode(stats), key=stats.prompt_id.encode())
            crash_point("trainer.send_offsets", version)
            self.transactions.send_offsets(
                self.consumer, {TopicPartition(topic, p): offset for p, offset in self.offsets.items()}
            )
            crash_point("trainer.commit", version)  # the version, its ledger entry and offsets: all or nothing
            self.transactions.commit()
            self.ledger.note(entry)
        except FencedError as exc:
            raise self._fenced(f"publishing version {version} or writing its checkpoint") from exc
        self.publisher.committed()  # weight retention, only once the version is visible
        self.parent = (self.epoch, version)
        self.committed = dict(self.offsets)
        self.stale_feedback = []
        if self.checkpointed == version:
            self.checkpoints.prune(self.ledger.names)  # retention only once the ledger names the new checkpoint

    def _problem(self, sample: TrainSample) -> str | None:
        """Why the model cannot train on ``sample``, or ``None`` (``sample_checks.py``)."""
        return sample_problem(sample, self.limits, self.ctx.config.rollout.group_size)

    def _oldest_trainable(self) -> int | None:
        """The oldest version a fresh sample may be generated with to be trained now (step 1); ``None``
        while no bound applies: no staleness operator, or samples read again after a crash."""
        if self.staleness_bound is None:
            return None
        if any(self.offsets.get(partition, 0) < end for partition, end in self.retrain_until.items()):
            return None
        return self.learner.version - self.staleness_bound

    def _drop_stale(self, stale: list[tuple[TrainSample | None, Message]]) -> None:
        """Consume the stale groups' records without training them; report each group as dropped."""
        version, bound = self.learner.version, self.staleness_bound
        groups = stale_groups(stale)
        self.stale_feedback.extend(stale_feedback(groups, self.policy, version, bound))
        self.stale_samples += sum(sample is not None for sample, _ in stale)
        self._advance(stale)
        logger.warning(
            "dropped %d stale groups (%d samples) at version %d: generated more than %d versions before it",
            len(groups),
            len(stale),
            version,
            bound,
        )
        self.ctx.metric(TRAIN_STALE_SAMPLES, self.stale_samples, version, policy=self.policy)

    def _reject(self, message: Message, reason: str, error: BaseException | None = None) -> None:
        self.rejected += 1
        self.ctx.dead_letter(message, reason, error)
        self.ctx.metric(TRAIN_REJECTED_SAMPLES, self.rejected, self.learner.version, policy=self.policy)

    def _recall_trained(
        self, partitions: list[TopicPartition], assembler: BatchAssembler, window: int = RECALL_WINDOW
    ) -> None:
        """After a restart, remember the ids of the last ``window`` samples below the checkpointed
        offsets (``batch_assembler.recall_trained``)."""
        recall_trained(self.ctx.log, self.ctx.codec, self.offsets, partitions, assembler, window)

    def _step(self, taken: list[tuple[TrainSample | None, Message]], waited: float) -> None:
        ctx, learner = self.ctx, self.learner
        batch = [sample for sample, _ in taken if sample is not None]
        if not batch:  # every sample of it was dead-lettered
            self._advance(taken)
            return
        staleness = [learner.version - s.trajectory.min_version for s in batch]
        examples = policy_examples(batch)
        self.commands.send(
            "step",
            examples=examples,
            samples=[(message.partition, message.offset, s.sample_id) for s, message in taken if s is not None],
        )
        try:
            stats = learner.step(examples)
        except NonFiniteStepError as exc:
            self._skip(taken, exc)
            return
        version = learner.version
        self.trained_samples += len(batch)
        self._advance(taken)
        self._commit_version("step", [sample.sample_id for sample in batch])
        figures = version_figures(stats, waited, staleness, self.trained_samples, self.publisher.last_stats)
        for name, value in figures.items():
            ctx.metric(train_metric(name), value, version, policy=self.policy)
        ctx.metric(TRAIN_VERSION, version, version, policy=self.policy)
        crash_point("trainer.flush_metrics", version)
        ctx.producer.flush()
        logger.info(
            "version %d: loss %.4f, grad norm %.3f, %d samples, %.2f s",
            version,
            stats.loss,
            stats.grad_norm,
            len(batch),
            stats.seconds,
        )

    def _checkpoint_unless_fenced(self, published_full: bool = False) -> None:
        """A transaction that commits only the offsets already committed, where a fenced trainer learns
        it was fenced (``FencedError``) and so writes nothing; then the checkpoint (step 3, a stop)."""
        topic = self.ctx.topics.samples(self.policy)
        self.transactions.begin()
        partitions = [tp for tp in self.consumer.assignment() if tp.topic == topic]
        crash_point("trainer.fence_send_offsets", self.learner.version)
        self.transactions.send_offsets(self.consumer, {tp: self.committed.get(tp.partition, 0) for tp in partitions})
        crash_point("trainer.fence_commit", self.learner.version)
        self.transactions.commit()
        self._checkpoint(published_full)

    def _fenced(self, without: str) -> FencedError:
        return FencedError(
            f"the trainer of policy {self.policy!r} (epoch {self.epoch}) was fenced: a newer trainer of the policy"
            f" opened transactional id {self.transactional_id!r}; this one exits without {without}"
        )

    def _checkpoint(self, published_full: bool = False) -> None:
        """An atomic checkpoint of the current version, with the offsets after its batch."""
        learner = self.learner
        state = TrainerState(
            learner.version, dict(self.offsets), self.trained_samples, self.epoch, published_full, learner.kl_coef
        )
        if self.ranks.distributed or self.learner.backend.checkpoints_sharded:  # every rank writes its shards
            tmp = self.checkpoints.begin(state.version)
            self.commands.send("checkpoint", directory=str(tmp))
            self.learner.backend.save_shards(tmp)
            crash_point("trainer.sharded_checkpoint_commit", state.version)
            self.checkpoints.commit(tmp, state)
        else:
            self.checkpoints.save(self.learner.backend.model_state, self.learner.optimizer, state)
        self.checkpointed = self.learner.version
        if not published_full:  # at a stop: of the version published last (a due one is sealed once published)
            self.seals.seal(state.version, self.publisher)

    def _advance(self, taken: list[tuple[TrainSample | None, Message]]) -> None:
        """Move each samples partition's offset past the batch's last record there.

        A batch is a prefix of the records in the order they were read, and each partition's records
        arrive in offset order, so everything of a partition below that offset is in this batch or
        an earlier one."""
        for _, message in taken:
            self.offsets[message.partition] = max(self.offsets.get(message.partition, 0), message.offset + 1)

    def _skip(self, taken: list[tuple[TrainSample | None, Message]], error: NonFiniteStepError) -> None:
        """A step that changed nothing: dead-letter its samples, move past the batch, publish nothing."""
        ctx = self.ctx
        self.skipped_steps += 1
        messages = [message for sample, message in taken if sample is not None]
        logger.error("skipping a batch of %d samples: %s", len(messages), error)
        for message in messages:
            ctx.dead_letter(message, f"batch skipped: {error}", error)
        self._advance(taken)
        ctx.metric(TRAIN_SKIPPED_STEPS, self.skipped_steps, self.learner.version, policy=self.policy)
        crash_point("trainer.flush_skipped", self.learner.version)
        ctx.producer.flush()
