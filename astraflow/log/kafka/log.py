"""The ``kafka`` log backend: Apache Kafka through confluent-kafka (librdkafka).

``KafkaLog`` does the admin operations with an ``AdminClient`` and hands out the producers,
transactional producers and consumers of ``kafka_producer``, ``kafka_transactions`` and
``kafka_consumer``, all configured here:

- records up to 64 MiB pass the clients (the topic's ``max.message.bytes`` decides what the
  broker accepts), uncompressed so that a topic's size limit means the same for every record;
- topics are never auto-created: producing to a missing topic fails ``flush`` after
  ``topic.metadata.propagation.max.ms`` instead of creating a topic with broker defaults;
- ``create_topic`` returns only when every partition's leader serves it, so a record sent or
  an offset asked for right after it is accepted;
- consumers heart-beat at least every second: in the classic group protocol a member learns of
  a rebalance (another member left or joined) only from a heartbeat response, so the interval,
  not the session timeout, bounds how fast partitions move to the remaining members;
- consumers read ``read_committed`` (librdkafka's default, written out because exactly-once hops
  rest on it): records of aborted and of still open transactions are never returned;
- transactional producers (``kafka_transactions``) take the producers' settings plus their
  ``transactional.id``; librdkafka's ``transaction.timeout.ms`` (60 s) is how long the broker
  keeps an abandoned transaction open before aborting it.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Callable

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as RdPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from astraflow.core.errors import LogError, TopicNotFoundError
from astraflow.log.base import (
    ASSIGN_GROUP_PREFIX,
    Consumer,
    Log,
    OffsetReset,
    Producer,
    TopicPartition,
    TopicSpec,
    TransactionalProducer,
)
from astraflow.log.kafka.consumer import KafkaConsumer
from astraflow.log.kafka.librdkafka import librdkafka_logger
from astraflow.log.kafka.producer import KafkaProducer
from astraflow.log.kafka.transactions import KafkaTransactionalProducer

logger = logging.getLogger(__name__)

MAX_CLIENT_RECORD_BYTES = 64 * 1024 * 1024
RANGE_FETCH_WAIT_MS = 10
"""How long the broker holds a range reader's fetch that finds nothing new (``KafkaLog.range_reader``)."""
_TIMEOUT_S = 30.0
_RENEW_ADMIN_S = 5.0
_NOT_FOUND = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
_REFUSED = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
"""Errors of an operation the broker's ACLs refused."""
_LEADERSHIP_MOVING = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError._NOENT,
)
"""Errors of a partition whose leader is still taking it on (or moving): asking again cures them.
(``_NOENT``: the admin client's metadata names no leader yet, "No leaders found", as one node of a
cluster may answer right after a topic is created.)"""


class KafkaLog(Log):
    """A ``Log`` on the Kafka cluster at ``bootstrap``; ``client_config`` adds librdkafka settings
    (e.g. SASL) to every client. Opening it asks the cluster for its metadata: a cluster that does
    not answer within ``connect_timeout_s`` is a ``LogError`` naming ``bootstrap``, not a component
    that hangs or fails later on an unrelated-looking timeout."""

    def __init__(
        self, bootstrap: str, client_config: dict[str, Any] | None = None, connect_timeout_s: float = _TIMEOUT_S
    ) -> None:
        self._base: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "logger": librdkafka_logger(),
            **(client_config or {}),
        }
        self.principal: str | None = self._base.get("sasl.username")
        """The SASL user every client of this log authenticates as; ``None`` without SASL."""
        self._refusal: KafkaError | None = None
        self._admin = AdminClient({**self._base, "error_cb": self._on_error})
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                self._admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                break
            except KafkaException as exc:
                self._admin.poll(0.2)  # serves the error callback: a refused login shows there
                if self._refusal is not None:
                    mechanism = self._base.get("sasl.mechanism", "TLS")
                    raise LogError(
                        f"the Kafka cluster at {bootstrap} refused user {self.principal!r} ({mechanism}): "
                        f"{self._refusal.str()}"
                    ) from exc
                if time.monotonic() >= deadline:
                    raise LogError(
                        f"cannot reach the Kafka cluster at {bootstrap} within {connect_timeout_s:g}s: "
                        f"{exc.args[0].str()}"
                    ) from exc

    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback: remember a refused authentication, to say so at once."""
        if error.code() == KafkaError._AUTHENTICATION:
            self._refusal = error

    def _may_not(self, operation: str, resource: str, error: KafkaError) -> LogError:
        """The error for an operation the broker's ACLs refused, naming the principal."""
        who = f"principal User:{self.principal}" if self.principal else "this client (no SASL user)"
        return LogError(f"{who} may not {operation} {resource}: {error.str()}")

    def create_topic(self, spec: TopicSpec, exist_ok: bool = True) -> None:
        config = {
            "cleanup.policy": "compact" if spec.compacted else "delete",
            "retention.ms": str(-1 if spec.retention_ms is None else spec.retention_ms),
            "max.message.bytes": str(spec.max_message_bytes),
        }
        if spec.segment_ms is not None:
            config["segment.ms"] = str(spec.segment_ms)
            # a segment must hold the largest record batch; the default (1 GiB) already does
            config["segment.bytes"] = str(max(spec.max_message_bytes, 16 * 1024 * 1024))
        future = self._admin.create_topics(
            [NewTopic(spec.name, spec.partitions, config=config)], request_timeout=_TIMEOUT_S
        )[spec.name]
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() in _REFUSED:
                # a principal without CREATE uses the topics an admin made; one that is missing is an error
                found = self._admin.list_topics(spec.name, timeout=_TIMEOUT_S).topics.get(spec.name)
                if not exist_ok or found is None or found.error is not None:
                    raise self._may_not("CREATE", f"topic {spec.name!r}", exc.args[0]) from exc
            elif exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise LogError(f"creating topic {spec.name!r} failed: {exc.args[0].str()}") from exc
            if not exist_ok:
                raise LogError(f"topic {spec.name!r} already exists") from exc
        # The nodes of a cluster learn of a new topic a moment apart, and each lookup may ask another
        # node, so a lookup right after one that saw the topic can still miss it: wait until it is
        # led, and its leaders serve offsets (only once they took the partitions on), without a miss.
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                self._wait_for(spec.name, lambda meta: meta is not None and _all_led(meta))
                self.end_offsets(spec.name)
                return
            except TopicNotFoundError:
                if time.monotonic() > deadline:
                    raise LogError(f"topic {spec.name!r} was created but did not settle within {_TIMEOUT_S:.0f}s")
                time.sleep(0.05)

    def describe_topic(self, name: str) -> TopicSpec:
        """The topic's spec. Its configs come from whichever node the client asks, and a node learns of a
        new topic a moment after others: right after a topic was made on a cluster, a node could answer
        that it does not exist although the metadata had just named it (a secure three-node cluster's
        ``broker grant`` failed so in a CI run). So a miss after the metadata named it is asked again,
        for up to ``_TIMEOUT_S``; a topic the metadata does not name is missing at once."""
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            partitions = len(self._metadata(name).partitions)  # TopicNotFoundError: the cluster does not name it
            try:
                config = self._topic_configs(name)
                break
            except TopicNotFoundError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        retention = int(config["retention.ms"].value)
        return TopicSpec(
            name=name,
            partitions=partitions,
            retention_ms=None if retention < 0 else retention,
            compacted="compact" in config["cleanup.policy"].value,
            max_message_bytes=int(config["max.message.bytes"].value),
            segment_ms=None if config["segment.ms"].is_default else int(config["segment.ms"].value),
        )

    def _topic_configs(self, name: str) -> Any:
        """The topic's configs as the node the client asks knows them."""
        future = self._admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, name)], request_timeout=_TIMEOUT_S
        )
        try:
            return next(iter(future.values())).result()
        except KafkaException as exc:
            if exc.args[0].code() in _NOT_FOUND:
                raise TopicNotFoundError(f"topic {name!r} does not exist") from exc
            if exc.args[0].code() in _REFUSED:
                raise self._may_not("DESCRIBE_CONFIGS", f"topic {name!r}", exc.args[0]) from exc
            raise LogError(f"describing topic {name!r} failed: {exc.args[0].str()}") from exc

    def list_topics(self) -> list[str]:
        try:
            topics = self._admin.list_topics(timeout=_TIMEOUT_S).topics
        except KafkaException as exc:
            raise LogError(f"listing topics failed: {exc.args[0].str()}") from exc
        return sorted(name for name in topics if not name.startswith("__"))

    def delete_topic(self, name: str) -> None:
        future = self._admin.delete_topics([name], request_timeout=_TIMEOUT_S)[name]
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() in _NOT_FOUND:
                raise TopicNotFoundError(f"topic {name!r} does not exist") from exc
            if exc.args[0].code() in _REFUSED:
                raise self._may_not("DELETE", f"topic {name!r}", exc.args[0]) from exc
            raise LogError(f"deleting topic {name!r} failed: {exc.args[0].str()}") from exc
        self._wait_for(name, lambda meta: meta is None)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Retries while leadership moves (also right after creation), for up to 30 s.

        librdkafka's admin client can keep a new topic's "no leader" from a node that did not know
        the topic yet: its ``list_offsets`` then answers "No leaders found" (``_NOENT``) for as long
        as the client lives, although fresh metadata names the leaders. So after a second of that
        the admin client is replaced by a new one, once every ``_RENEW_ADMIN_S``."""
        partitions = sorted(self._metadata(topic).partitions)
        requests = {RdPartition(topic, p): OffsetSpec.latest() for p in partitions}
        deadline = time.monotonic() + _TIMEOUT_S
        renew_at = time.monotonic() + 1.0
        while True:
            try:
                futures = self._admin.list_offsets(requests, request_timeout=_TIMEOUT_S)
                return {rd.partition: future.result().offset for rd, future in futures.items()}
            except KafkaException as exc:
                err = exc.args[0]
                if not (err.retriable() or err.code() in _LEADERSHIP_MOVING) or time.monotonic() > deadline:
                    raise LogError(f"reading end offsets of {topic!r} failed: {err.str()}") from exc
                if err.code() == KafkaError._NOENT and time.monotonic() > renew_at:
                    logger.info("renewing the admin client: it finds no leaders of %r", topic)
                    self._admin = AdminClient(dict(self._base))
                    renew_at = time.monotonic() + _RENEW_ADMIN_S
                time.sleep(0.1)

    def delete_records(self, topic: str, before: dict[int, int]) -> None:
        negative = {partition: offset for partition, offset in before.items() if offset < 0}
        if negative:  # librdkafka would read -1 as "the end": delete everything
            raise LogError(f"cannot delete records of {topic} below negative offsets {negative}")
        self._metadata(topic)  # TopicNotFoundError, rather than librdkafka's "no leaders found"
        requests = [RdPartition(topic, partition, offset) for partition, offset in before.items()]
        if not requests:
            return
        futures = self._admin.delete_records(requests, request_timeout=_TIMEOUT_S, operation_timeout=_TIMEOUT_S)
        for rd, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                err = exc.args[0]
                raise LogError(
                    f"deleting records of {topic}:{rd.partition} below offset {rd.offset} failed: {err.str()}"
                ) from exc

    def group_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """One offsets request per group: the admin API answers for a single group at a time."""
        try:
            listed = self._admin.list_consumer_groups(request_timeout=_TIMEOUT_S).result()
            groups: dict[str, dict[TopicPartition, int]] = {}
            for listing in listed.valid:
                request = [ConsumerGroupTopicPartitions(listing.group_id)]
                found = self._admin.list_consumer_group_offsets(request, request_timeout=_TIMEOUT_S)
                offsets = {
                    TopicPartition(rd.topic, rd.partition): rd.offset
                    for rd in found[listing.group_id].result().topic_partitions
                    if rd.offset >= 0
                }
                if offsets:
                    groups[listing.group_id] = offsets
        except KafkaException as exc:
            raise LogError(f"reading consumer-group offsets failed: {exc.args[0].str()}") from exc
        return groups

    def producer(self) -> Producer:
        return KafkaProducer(self._producer_config())

    def transactional_producer(self, transactional_id: str, timeout_s: float | None = None) -> TransactionalProducer:
        config = self._producer_config()
        if timeout_s is not None:
            config["transaction.timeout.ms"] = int(timeout_s * 1000)
        return KafkaTransactionalProducer(config, transactional_id, _TIMEOUT_S)

    def consumer(
        self,
        group_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        session_timeout_s: float = 10.0,
        fetch_wait_ms: int | None = None,
    ) -> Consumer:
        """``fetch_wait_ms``: how long the broker holds a fetch that finds nothing new (librdkafka's
        ``fetch.wait.max.ms``, 500 ms unless given)."""
        session_ms = int(session_timeout_s * 1000)
        config = {
            **self._base,
            "group.id": group_id or f"{ASSIGN_GROUP_PREFIX}{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": auto_offset_reset,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, min(1000, session_ms // 3)),
            "allow.auto.create.topics": False,
            "max.partition.fetch.bytes": MAX_CLIENT_RECORD_BYTES,
            "fetch.max.bytes": MAX_CLIENT_RECORD_BYTES,
            "receive.message.max.bytes": MAX_CLIENT_RECORD_BYTES + 1024 * 1024,
        }
        if fetch_wait_ms is not None:
            config["fetch.wait.max.ms"] = fetch_wait_ms
        return KafkaConsumer(config, has_group=group_id is not None, auto_offset_reset=auto_offset_reset)

    def range_reader(self) -> Consumer:
        # a range ends below the log's end, so the fetch the broker holds open at the end only delays the next
        # range, whose first fetch waits for it: held 500 ms (librdkafka's default), each range took ~0.5 s
        return self.consumer(fetch_wait_ms=RANGE_FETCH_WAIT_MS)

    def close(self) -> None:
        """Nothing to release: the admin client holds no state worth flushing."""

    def _producer_config(self) -> dict[str, Any]:
        return {
            **self._base,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "none",
            "partitioner": "murmur2_random",
            "message.max.bytes": MAX_CLIENT_RECORD_BYTES,
            "allow.auto.create.topics": False,
            "topic.metadata.propagation.max.ms": 3000,
        }

    def _metadata(self, name: str) -> Any:
        """The topic's metadata; ``TopicNotFoundError`` when the cluster does not know it."""
        meta = self._topic_metadata(name)
        if meta is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        return meta

    def _topic_metadata(self, name: str) -> Any:
        try:
            meta = self._admin.list_topics(topic=name, timeout=_TIMEOUT_S).topics.get(name)
        except KafkaException as exc:
            raise LogError(f"reading metadata of {name!r} failed: {exc.args[0].str()}") from exc
        if meta is None or (meta.error is not None and meta.error.code() in _NOT_FOUND):
            return None
        return meta

    def _wait_for(self, name: str, done: Callable[[Any], bool]) -> None:
        """Poll the topic's metadata until ``done(metadata or None)`` holds."""
        deadline = time.monotonic() + _TIMEOUT_S
        while not done(self._topic_metadata(name)):
            if time.monotonic() > deadline:
                raise LogError(f"topic {name!r} did not settle within {_TIMEOUT_S:.0f}s")
            time.sleep(0.05)


def _all_led(meta: Any) -> bool:
    return meta.error is None and bool(meta.partitions) and all(p.leader >= 0 for p in meta.partitions.values())
