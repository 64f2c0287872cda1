"""Records a producer holds until it writes them in one transaction.

The feeder and the rollout producer collect what one round or one batch writes - tasks,
trajectories, dead letters - in an ``Outbox`` and send it only once the transaction begins, right
before its commit. A transaction is so open only while its records are sent and committed, never
while a dataset is walked or an engine generates: an open transaction holds ``read_committed``
readers of its partitions back, and Kafka aborts one left open past ``transaction.timeout.ms``.
"""

from __future__ import annotations

from astraflow.log import Message, TransactionalProducer
from astraflow.runtime.context import ComponentContext


class Outbox:
    """Records for one transaction, in the order they are to be written."""

    def __init__(self, ctx: ComponentContext) -> None:
        self._ctx = ctx
        self.records: list[tuple[str, bytes, bytes | None, int | None]] = []
        """(topic, value, key, partition) of every record, in order."""

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None) -> None:
        """Hold one record, for ``partition`` or partitioned by its key when it is written (as ``Producer.send``)."""
        self.records.append((topic, value, key, partition))

    def dead_letter(self, message: Message | None, reason: str, error: BaseException | None = None) -> None:
        """Hold the dead letter of ``message`` (``ComponentContext.dead_letter``, but in the transaction)."""
        record = self._ctx.dead_letter_record(message, reason, error)
        self.send(self._ctx.topics.deadletter(self._ctx.role), self._ctx.codec.encode(record))

    def write(self, producer: TransactionalProducer) -> None:
        """Send every record held into ``producer``'s open transaction."""
        for topic, value, key, partition in self.records:
            producer.send(topic, value, key=key, partition=partition)
