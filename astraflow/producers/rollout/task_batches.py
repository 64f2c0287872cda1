"""The rollout producer's tasks in and records out: a batch's records are committed with its task
offsets, in one transaction per tasks partition.

The transactional id is the task group's and the partition's, ``{run}.rollout.{workflow}.p{n}``,
because the partition is the one identity of a producer's work that survives a restart. A
restarted process gets a new pid, the pool starts and stops producers at any time (``astraflow
run``, the scaler, a producer started by hand in another region), and nothing else names a
producer; but whoever owns partition n next (the restarted process, or another member of the
pool) opens a producer with n's id, and that fences n's previous owner: it can commit nothing of n
any more, and its open transaction ends there. On Kafka that means at once (``init_transactions``
aborts it) instead of after ``transaction.timeout.ms`` (60 s) during which it would hold every
``read_committed`` reader of the trajectory partitions it wrote to; an id per process would leave
that to the timeout after every crash, and one more transactional id on the brokers per process
that ever ran. There are never more ids than partitions. Kafka Streams chose the same before
KIP-447 (a producer per input partition). The cost: a batch with tasks of k partitions is k
transactions, and a producer holds one transactional producer per partition it owns.

Steps of one batch:

1. ``poll`` polls tasks as a member of the group, then opens a transactional producer for each
   partition the member was just given (fencing the partition's previous owner) and closes those
   of the partitions it lost.
2. The rollout producer runs the tasks and puts each record of a task - its trajectories, its dead
   letters - into the ``Outbox`` of the task's partition. Nothing is sent while the engine works.
3. ``commit``, per partition of the batch: ``begin``, send the outbox, ``send_offsets`` (the
   offset after the partition's last task of the batch), ``commit``. The tasks' records and their
   offsets become visible together, or none of them.
4. A partition whose transaction is refused is handed back, with nothing of it visible:
   ``FencedError`` (a newer owner of the partition opened its producer; this one is closed) or
   ``TransactionAbortedError`` (the log aborted it, e.g. because the member lost the partition in
   a rebalance). A partition that moved is redone by its new owner from the group's committed
   offset; one this member still owns, by its own view, is sought back to that committed offset.
   Not to the batch's first task: a member whose lease ran out while it generated may be given
   the partition back without seeing it go, after another member committed past that task. Until
   the group tells a fenced member that the partition moved, it opens the partition's producer
   again at its next poll and fences the new owner in turn; the group refuses the offsets of
   whichever is not the owner (Kafka's generation check, the embedded log's leases), so neither
   commits a task twice, and the next rebalance settles it.
   Any other failure (a record the log refuses, a commit whose outcome the log could not tell)
   ends the producer, and its restart redoes the batch.

While a batch of multi-turn episodes runs, ``journal`` commits their completed turns in transactions
of the same producers, without offsets (``episode_journal.py``); one refused hands the partition
back as in step 4, and the batch's commit skips it. ``on_assigned`` / ``on_revoked`` hear of each
partition this member gains (once its producer has fenced the previous owner) and loses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import FencedError, TransactionAbortedError
from astraflow.log import Message, TopicPartition, TransactionalProducer
from astraflow.runtime.context import ComponentContext
from astraflow.runtime.outbox import Outbox

logger = logging.getLogger(__name__)


class TaskBatch:
    """Tasks polled together, and per tasks partition the records to commit with their offsets."""

    def __init__(self, ctx: ComponentContext, messages: list[Message]) -> None:
        self._ctx = ctx
        self.messages = messages
        self.outboxes: dict[int, Outbox] = {}
        self.refused: set[int] = set()
        """Partitions whose transaction was refused while the batch ran: handed back, not committed."""

    def outbox(self, message: Message) -> Outbox:
        """Where the records made from ``message``'s task go: its partition's outbox."""
        return self.partition_outbox(message.partition)

    def partition_outbox(self, partition: int) -> Outbox:
        """The outbox of the batch's tasks of ``partition``."""
        if partition not in self.outboxes:
            self.outboxes[partition] = Outbox(self._ctx)
        return self.outboxes[partition]

    def ends(self) -> dict[int, int]:
        """Per partition of the batch, the offset after its last task: the group's next offset."""
        ends: dict[int, int] = {}
        for message in self.messages:
            ends[message.partition] = max(ends.get(message.partition, 0), message.offset + 1)
        return ends


class TaskBatches:
    """A member of the task group that commits each batch's records with its offsets (module docstring)."""

    def __init__(
        self,
        ctx: ComponentContext,
        group_id: str,
        on_assigned: Callable[[int], None] | None = None,
        on_revoked: Callable[[int], None] | None = None,
    ) -> None:
        self._ctx = ctx
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._topic = ctx.topics.tasks()
        self.group_id = group_id
        self._consumer = ctx.log.consumer(group_id=group_id)
        self._consumer.subscribe([self._topic])
        self._producers: dict[int, TransactionalProducer] = {}

    def transactional_id(self, partition: int) -> str:
        return f"{self.group_id}.p{partition}"

    def poll(self, max_records: int, timeout: float) -> TaskBatch:
        """Step 1: the next tasks of the partitions this member owns."""
        messages = self._consumer.poll(max_records=max_records, timeout=timeout)
        self._follow_assignment()
        # a record of a partition revoked by this very poll is its new owner's to run
        return TaskBatch(self._ctx, [m for m in messages if m.partition in self._producers])

    def commit(self, batch: TaskBatch) -> list[int]:
        """Steps 3 and 4: commit each partition's records with its offsets, or hand the partition back;
        returns the partitions committed."""
        committed = []
        for partition, after in sorted(batch.ends().items()):
            if partition in batch.refused:
                continue  # handed back when its journal's transaction was refused
            if self._transaction(batch, partition, lambda producer: self._commit(producer, batch, partition, after)):
                committed.append(partition)
        return committed

    def journal(self, batch: TaskBatch, partition: int, records: list[tuple[str, bytes, bytes]]) -> bool:
        """Commit ``records`` (topic, value, key) of the batch's tasks of ``partition`` to that partition
        of their topics, without offsets; ``False`` if the partition was handed back (now or before)."""
        if partition in batch.refused:
            return False

        def write(producer: TransactionalProducer) -> None:
            producer.begin()
            for topic, value, key in records:
                producer.send(topic, value, key=key, partition=partition)
            crash_point("rollout.commit_turns")  # the turns of the batch's episodes so far: all or nothing
            producer.commit()
            crash_point("rollout.turns_committed")  # a kill here leaves unfinished episodes on the journal

        return self._transaction(batch, partition, write)

    def close(self) -> None:
        """Close the transactional producers (no transaction is open between batches), then leave the group."""
        try:
            for producer in self._producers.values():
                producer.close()
        finally:
            self._producers = {}
            self._consumer.close()

    def _transaction(self, batch: TaskBatch, partition: int, write: Callable[[TransactionalProducer], None]) -> bool:
        """``write`` with the partition's producer; a refused transaction hands the partition back (step 4)."""
        try:
            write(self._producers[partition])
            return True
        except FencedError as exc:
            self._producers.pop(partition).close()
            logger.warning("tasks partition %d has a newer owner; its tasks are handed back: %s", partition, exc)
        except TransactionAbortedError as exc:
            logger.warning("the transaction of tasks partition %d was aborted; its tasks redone: %s", partition, exc)
        batch.refused.add(partition)
        self._redo(partition)
        return False

    def _commit(self, producer: TransactionalProducer, batch: TaskBatch, partition: int, after: int) -> None:
        outbox = batch.outboxes.get(partition)
        producer.begin()
        if outbox is not None:
            outbox.write(producer)
        crash_point("rollout.send_offsets", after)
        producer.send_offsets(self._consumer, {TopicPartition(self._topic, partition): after})
        crash_point("rollout.commit", after)  # the task's trajectories and its offset: all or nothing
        producer.commit()

    def _redo(self, partition: int) -> None:
        """Read the partition again from the group's committed offset, if it is still this member's."""
        tp = TopicPartition(self._topic, partition)
        if tp not in self._consumer.assignment():
            return
        offset = self._consumer.committed([tp])[tp]
        if offset is None:
            self._consumer.seek_to_beginning([tp])
        else:
            self._consumer.seek(tp, offset)

    def _follow_assignment(self) -> None:
        owned = {tp.partition for tp in self._consumer.assignment()}
        for partition in sorted(set(self._producers) - owned):
            self._producers.pop(partition).close()
            if self._on_revoked is not None:
                self._on_revoked(partition)
        for partition in sorted(owned - set(self._producers)):
            self._producers[partition] = self._ctx.log.transactional_producer(self.transactional_id(partition))
            if self._on_assigned is not None:
                self._on_assigned(partition)
