"""The Kafka ``Consumer``: manual commits, and seeks that hold before the group assigns.

librdkafka tracks a partition's position only once a record of it has been returned, and it
refuses ``seek`` on a partition whose fetcher has not started yet. So this class keeps its own
``_positions`` (set by seeks and by every returned record) and seeks in four ways:

- ``assign`` hands librdkafka nothing until the next ``poll``, which assigns every partition at the
  offset a seek gave it meanwhile: a partition assigned at a logical offset (the beginning, the
  group's offset) and sought at once could go on from the logical one, its lookup landing after
  the seek (librdkafka issue 2256: a late follower of a weights topic read every chunk from offset
  0 now and then), and assigning at the offset is the fix librdkafka's authors give;
- partition fetching from a real offset: librdkafka ``seek``;
- partition assigned but not fetching yet, or still looking up its logical offset: re-assign it
  with the offset;
- subscribe mode, partition not assigned yet: remember the seek and apply it in ``_on_assign``
  when the group hands the partition over (a whole-assignment seek such as
  ``seek_to_beginning()`` before the first assignment applies to that first assignment).

Without a ``group_id`` the consumer still needs one for librdkafka: it gets a throwaway random
group that never commits, so offsets start at ``auto_offset_reset``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, KafkaError, KafkaException
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import TopicPartition as RdPartition

from astraflow.core.errors import LogError
from astraflow.log.base import Consumer, Message, OffsetReset, TopicPartition

logger = logging.getLogger(__name__)

_TIMEOUT_S = 30.0
_REFUSED = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
)
"""Errors of a read the broker's ACLs refused."""
_RAISED = (
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
)
"""Consumer errors that retrying cannot cure; librdkafka recovers from every other kind by itself
(e.g. the group coordinator moving or still loading), so those are only logged."""
Resolver = Callable[[TopicPartition], int]


class KafkaConsumer(Consumer):
    """A ``Consumer`` on one confluent-kafka consumer; ``config`` comes from ``KafkaLog``."""

    def __init__(self, config: dict[str, Any], has_group: bool, auto_offset_reset: OffsetReset) -> None:
        self._consumer = RdConsumer(config)
        self._principal = config.get("sasl.username")
        self._group = config.get("group.id") if has_group else None
        self._has_group = has_group
        self._reset = auto_offset_reset
        reset_end = OFFSET_BEGINNING if auto_offset_reset == "earliest" else OFFSET_END
        self._start = OFFSET_STORED if has_group else reset_end
        """Where an assigned partition starts: the group's offset, or for the throwaway group
        (which never committed) directly the reset end, sparing a committed-offsets lookup."""
        self._subscribed = False
        self._positions: dict[TopicPartition, int] = {}
        self._pending: dict[TopicPartition, int] = {}
        self._unstarted: list[TopicPartition] | None = None
        """The partitions of an ``assign`` not yet handed to librdkafka (at the next ``poll``)."""
        self._logical: set[TopicPartition] = set()
        """Partitions handed to librdkafka at a logical offset that have returned no record yet."""
        self._pending_all: Resolver | None = None
        self._closed = False

    def group_metadata(self) -> object:
        """The group's metadata (group, generation, member id) for ``send_offsets`` of a transactional
        producer, as this consumer sees it now: it is not to be kept, a rebalance changes it."""
        if not self._has_group or self._closed:
            raise LogError("send_offsets needs an open consumer with a group_id")
        return self._consumer.consumer_group_metadata()

    def subscribe(self, topics: Sequence[str]) -> None:
        if not self._has_group:
            raise LogError("subscribe needs a consumer group: open the consumer with group_id")
        self._subscribed = True
        self._consumer.subscribe(list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._subscribed = False
        self._positions.clear()
        self._logical.clear()
        self._unstarted = list(dict.fromkeys(partitions)) or None
        if self._unstarted is None:
            self._consumer.assign([])  # nothing to read: stop fetching the old assignment now

    def assignment(self) -> list[TopicPartition]:
        held = self._unstarted if self._unstarted is not None else [_ours(rd) for rd in self._consumer.assignment()]
        return sorted(held, key=lambda tp: (tp.topic, tp.partition))

    def _start_assigned(self) -> None:
        """Hand librdkafka the partitions of the last ``assign``, each at the offset sought since."""
        partitions, self._unstarted = self._unstarted, None
        if partitions is None:
            return
        self._logical.update(tp for tp in partitions if tp not in self._positions)
        self._consumer.assign(
            [RdPartition(tp.topic, tp.partition, self._positions.get(tp, self._start)) for tp in partitions]
        )

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        self._start_assigned()
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        raw = [first] + (self._consumer.consume(max_records - 1, 0) if max_records > 1 else [])
        messages = []
        for msg in raw:
            err = msg.error()
            if err is not None:
                if err.code() in _REFUSED:
                    who = f"principal User:{self._principal}" if self._principal else "this client (no SASL user)"
                    what = f"topic {msg.topic()!r}" if msg.topic() else f"consumer group {self._group or '(none)'!r}"
                    raise LogError(f"{who} may not READ {what}: {err.str()}")
                if err.fatal() or err.code() in _RAISED:
                    raise LogError(f"consuming {msg.topic()} failed: {err.str()}")
                logger.info("librdkafka recovers from: %s", err.str())
                continue
            headers = tuple((name, value or b"") for name, value in msg.headers() or ())
            messages.append(
                Message(
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    msg.key(),
                    msg.value() or b"",
                    msg.timestamp()[1],
                    headers,
                )
            )
            tp = TopicPartition(msg.topic(), msg.partition())
            self._positions[tp] = msg.offset() + 1
            self._logical.discard(tp)
        return messages

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        if not self._has_group:
            raise LogError("commit needs a consumer group: open the consumer with group_id")
        if offsets is None:
            offsets = {tp: self._positions[tp] for tp in self.assignment() if tp in self._positions}
        if not offsets:
            return
        try:
            self._consumer.commit(
                offsets=[RdPartition(tp.topic, tp.partition, off) for tp, off in offsets.items()], asynchronous=False
            )
        except KafkaException as exc:
            raise LogError(f"commit failed: {exc.args[0].str()}") from exc

    def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        try:
            found = self._consumer.committed([RdPartition(tp.topic, tp.partition) for tp in partitions], _TIMEOUT_S)
        except KafkaException as exc:
            raise LogError(f"reading committed offsets failed: {exc.args[0].str()}") from exc
        return {_ours(rd): (rd.offset if rd.offset >= 0 else None) for rd in found}

    def position(self, partition: TopicPartition) -> int:
        unstarted = self._unstarted is not None and partition in self._unstarted
        current = (
            -1 if unstarted else self._consumer.position([RdPartition(partition.topic, partition.partition)])[0].offset
        )
        if partition in self._positions:
            # librdkafka's position also moves past the transaction markers no record stands for
            # (topics written in transactions, e.g. by the faust stream runtime), without which a
            # reader would never reach the end offset; after a seek it is unset (negative) until
            # the next record.
            return max(self._positions[partition], current)
        if partition in self._pending:
            return self._pending[partition]
        if current >= 0:
            return current
        stored = self.committed([partition])[partition] if self._has_group else None
        if stored is not None:
            return stored
        low, high = self._watermarks(partition)
        return low if self._reset == "earliest" else high

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if partition not in self.assignment():
            if not self._subscribed:
                raise LogError(f"seek on {partition.topic}[{partition.partition}], which is not assigned")
            self._pending[partition] = offset
            return
        if self._unstarted is None:
            self._seek_started(partition, offset)
        self._positions[partition] = offset

    def _seek_started(self, partition: TopicPartition, offset: int) -> None:
        """Seek a partition librdkafka holds (re-assigned while its logical offset may still be looked up)."""
        if partition in self._logical:
            self._logical.discard(partition)
            self._reassign_at(partition, offset)
            return
        try:
            self._consumer.seek(RdPartition(partition.topic, partition.partition, offset))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._STATE:
                raise LogError(f"seek failed: {exc.args[0].str()}") from exc
            self._reassign_at(partition, offset)

    def seek_to_beginning(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        self._seek_each(partitions, lambda tp: self._watermarks(tp)[0])

    def seek_to_end(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        self._seek_each(partitions, lambda tp: self._watermarks(tp)[1])

    def seek_to_timestamp(self, timestamp_ms: int, partitions: Sequence[TopicPartition] | None = None) -> None:
        self._seek_each(partitions, lambda tp: self._offset_for_time(tp, timestamp_ms))

    def lag(self) -> dict[TopicPartition, int]:
        return {tp: max(0, self._watermarks(tp)[1] - self.position(tp)) for tp in self.assignment()}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close()

    def _seek_each(self, partitions: Sequence[TopicPartition] | None, resolve: Resolver) -> None:
        """Seek each partition to ``resolve(partition)``; before any assignment, defer to it."""
        if partitions is None:
            partitions = self.assignment()
            if not partitions and self._subscribed:
                self._pending_all = resolve
                return
        for tp in partitions:
            self.seek(tp, resolve(tp))

    def _reassign_at(self, partition: TopicPartition, offset: int) -> None:
        """Restart a not-yet-fetching partition at ``offset`` by assigning it again."""
        rd = RdPartition(partition.topic, partition.partition, offset)
        if self._subscribed:
            rest = [
                RdPartition(tp.topic, tp.partition, self._positions.get(tp, OFFSET_STORED))
                for tp in self.assignment()
                if tp != partition
            ]
            self._consumer.assign(rest + [rd])
        else:
            self._consumer.incremental_unassign([RdPartition(partition.topic, partition.partition)])
            self._consumer.incremental_assign([rd])

    def _on_assign(self, consumer: RdConsumer, assigned: list[RdPartition]) -> None:
        """Rebalance callback: apply seeks made before the group handed these partitions over."""
        resolve_all, self._pending_all = self._pending_all, None
        for rd in assigned:
            tp = _ours(rd)
            offset = self._pending.pop(tp, None)
            if offset is None and resolve_all is not None:
                offset = resolve_all(tp)
            if offset is not None:
                rd.offset = offset
                self._positions[tp] = offset
            elif rd.offset < 0:
                self._logical.add(tp)
        logger.debug("assigned %s", [(rd.topic, rd.partition, rd.offset) for rd in assigned])
        consumer.assign(assigned)

    def _on_revoke(self, consumer: RdConsumer, revoked: list[RdPartition]) -> None:
        """Rebalance callback: forget positions of partitions that now belong to other members."""
        for rd in revoked:
            self._positions.pop(_ours(rd), None)
        consumer.unassign()

    def _watermarks(self, partition: TopicPartition) -> tuple[int, int]:
        try:
            return self._consumer.get_watermark_offsets(
                RdPartition(partition.topic, partition.partition), timeout=_TIMEOUT_S, cached=False
            )
        except KafkaException as exc:
            raise LogError(f"reading offsets of {partition.topic}[{partition.partition}] failed: {exc}") from exc

    def _offset_for_time(self, partition: TopicPartition, timestamp_ms: int) -> int:
        """First offset with a timestamp >= ``timestamp_ms``; the end offset when there is none."""
        try:
            found = self._consumer.offsets_for_times(
                [RdPartition(partition.topic, partition.partition, timestamp_ms)], timeout=_TIMEOUT_S
            )[0]
        except KafkaException as exc:
            raise LogError(f"offsets_for_times on {partition.topic}[{partition.partition}] failed: {exc}") from exc
        return found.offset if found.offset >= 0 else self._watermarks(partition)[1]


def _ours(rd: RdPartition) -> TopicPartition:
    return TopicPartition(rd.topic, rd.partition)
