"""The parts of faust the faust runtime replaces or adds: a consumer whose commits wait for the
record being processed, its transport, and the outbox of one input record's outputs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import cached_property
from typing import Any

from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.transport.drivers.aiokafka import Transport as AIOKafkaTransport
from faust.types import TP

from astraflow.config import KafkaSecurity
from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import AstraFlowError


class CommitStalled(AstraFlowError):
    """Faust stopped committing a partition's acked records."""


def replication_factor(bootstrap: str, topic: str, client_config: dict[str, Any] | None = None) -> int:
    """How many replicas ``topic`` has: the changelog gets as many as the input it mirrors."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})}).list_topics(topic, timeout=30)
    return len(metadata.topics[topic].partitions[0].replicas)


def broker_credentials(security: KafkaSecurity, component: str | None = None) -> Any:
    """Faust's credentials (aiokafka's) for ``log.security``: the same protocol, SASL mechanism, user,
    password, CA and client certificate the confluent-kafka clients of ``component`` get; ``None``
    for PLAINTEXT."""
    import ssl

    from faust.auth import SASLCredentials, SSLCredentials

    if security.protocol == "PLAINTEXT":
        return None
    context = None
    if security.tls:
        context = ssl.create_default_context(cafile=security.ca_file)
        if security.cert_file:
            context.load_cert_chain(security.cert_file, security.key_file)
    if not security.sasl:
        return SSLCredentials(context)
    return SASLCredentials(
        username=security.principal(component),
        password=security.password(component),
        ssl_context=context,
        mechanism=security.sasl_mechanism,
    )


class QuiescentConsumer(AIOKafkaConsumer):
    """Faust's aiokafka consumer whose commits wait for the record being processed.

    Faust commits from a timer, from its fetcher and during rebalances and shutdown. A commit
    in the middle of a record would put part of its outputs into a transaction without its
    offset; a crash then re-processes the record and writes that part twice.
    """

    before_commit: Callable[[], Awaitable[None]] | None = None
    """Called at each commit, between two records, before faust commits: the agent writes the
    changes of its table there (``PendingTable.flush``), inside the transactions being committed."""

    @cached_property
    def processing(self) -> asyncio.Lock:
        return asyncio.Lock()

    async def commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        async with self.processing:
            if self.before_commit is not None:
                await self.before_commit()
            crash_point("faust.commit")  # the transactions of the partitions' outputs, table and offsets
            return await super().commit(topics, start_new_transaction=start_new_transaction)

    def abandon(self, timeout: float = 10.0) -> None:
        """End the thread running the Kafka consumer at once: no commit, no goodbye to the group
        (a failed worker's exit, as a crash would leave it). The thread is not a daemon: left
        running, it would keep the failed process alive instead of letting it be restarted."""
        service = self._thread
        service.thread_loop.call_soon_threadsafe(service.thread_loop.stop)
        worker = getattr(service, "_thread", None)  # mode's WorkerThread running that loop
        if worker is not None:
            worker.join(timeout)

    def uncommitted(self) -> dict[TP, int]:
        """The first offset of each partition that the agent acked and faust has not committed yet."""
        return {tp: min(offsets) for tp, offsets in self._acked.items() if offsets}

    def ack_offsets(self, tp: TP, offsets: range) -> None:
        """Count records the agent processed without faust delivering them as acked, as ``ack`` does.

        Faust commits a partition only up to its first offset that was neither acked nor a gap in
        the log, so without this the records after them would never be committed.
        """
        committed, acked, index = self._committed_offset[tp], self._acked[tp], self._acked_index[tp]
        for offset in offsets:
            if (committed is None or offset >= committed) and offset not in index:
                index.add(offset)
                acked.append(offset)


class QuiescentTransport(AIOKafkaTransport):
    """Faust's aiokafka transport with ``QuiescentConsumer`` as its consumer."""

    Consumer = QuiescentConsumer


class Outbox:
    """The records one input record produces, sent together by the agent (a ``RecordSink``)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, int | None]] = []

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.records.append((topic, key, value, None))

    def put(self, topic: str, key: bytes, value: bytes | None, partition: int) -> None:
        """A record for a given partition (a changelog entry; ``None`` deletes it)."""
        self.records.append((topic, key, value, partition))

    def drain(self) -> list[tuple[str, bytes | None, bytes | None, int | None]]:
        records, self.records = self.records, []
        return records
