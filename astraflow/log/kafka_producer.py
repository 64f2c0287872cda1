"""The Kafka ``Producer``: idempotent, acks=all, failures surfaced by ``flush``.

How the delivery contract of ``astraflow.log.base`` maps onto librdkafka:

1. ``send`` hands the record to librdkafka's queue; a record the client rejects at once (too
   large for ``message.max.bytes``) is remembered as a failure, so that ``flush`` reports it with
   the broker-side failures.
2. librdkafka retries transient errors itself; with ``enable.idempotence`` the retries never
   duplicate or reorder a partition's records, and ``acks=all`` means acknowledged = durable.
3. Each delivery report that carries an error is kept (topic, partition, error), never the
   record, so a failing run does not hold large values in memory.
4. ``flush`` waits for the queue to drain, then raises ``RecordTooLargeError`` if any record was
   too large, ``DeliveryError`` for other failures, or for records still unacknowledged at the
   timeout (those stay queued and a later ``flush`` may still deliver them).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as RdProducer

from astraflow.errors import DeliveryError, LogError, RecordTooLargeError
from astraflow.log.base import Producer

logger = logging.getLogger(__name__)

_QUEUE_FULL_WAIT_S = 60.0


class KafkaProducer(Producer):
    """A ``Producer`` on one confluent-kafka producer; ``config`` comes from ``KafkaLog``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._producer = RdProducer(config)
        self._failures: list[tuple[str, str, KafkaError]] = []
        """(topic, partition or "?", error) per record that failed since the last ``flush``."""
        self._closed = False

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        if self._closed:
            raise LogError("send on a closed producer")
        kwargs: dict[str, Any] = {"key": key, "on_delivery": self._on_delivery, "timestamp": timestamp_ms or 0}
        if headers:
            kwargs["headers"] = list(headers)
        if partition is not None:
            kwargs["partition"] = partition
        deadline = time.monotonic() + _QUEUE_FULL_WAIT_S
        while True:
            try:
                self._producer.produce(topic, value, **kwargs)
                break
            except BufferError as exc:
                if time.monotonic() > deadline:
                    raise DeliveryError(f"the producer queue stayed full for {_QUEUE_FULL_WAIT_S:.0f}s") from exc
                self._producer.poll(0.1)
            except KafkaException as exc:
                self._failures.append((topic, "?" if partition is None else str(partition), exc.args[0]))
                break
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        remaining = self._producer.flush(timeout)
        failures, self._failures = self._failures, []
        if failures:
            counts = Counter((topic, part, err.str()) for topic, part, err in failures)
            detail = "; ".join(f"{topic}[{part}]: {text} (x{n})" for (topic, part, text), n in counts.items())
            too_large = any(err.code() == KafkaError.MSG_SIZE_TOO_LARGE for _, _, err in failures)
            error = RecordTooLargeError if too_large else DeliveryError
            raise error(f"{len(failures)} record(s) not delivered: {detail}")
        if remaining:
            raise DeliveryError(f"{remaining} record(s) not acknowledged within {timeout:.1f}s")

    def settled(self) -> bool:
        self._producer.poll(0)  # serve the delivery reports that have arrived
        if len(self._producer):  # records queued or in flight
            return False
        self.flush(0)  # nothing to wait for: raises for the records that failed, if any
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.flush()

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            logger.debug("delivery to %s[%s] failed: %s", msg.topic(), msg.partition(), err)
            partition = msg.partition()
            self._failures.append((msg.topic(), "?" if partition is None or partition < 0 else str(partition), err))
