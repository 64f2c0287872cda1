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
5. ``send`` numbers each record; its delivery report (or its rejection at once) marks the number
   done, so ``settled(mark)`` tells without waiting whether every record before a ``mark`` is
   acknowledged, while later ones are still in flight.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as RdProducer

from astraflow.core.errors import DeliveryError, LogError, RecordTooLargeError
from astraflow.log.base import Producer

logger = logging.getLogger(__name__)

_QUEUE_FULL_WAIT_S = 60.0


class FatalLineWatcher:
    """The logger a producer hands librdkafka: forwards every line to ``logger`` and keeps the first
    one that reports a fatal error (``Fatal error: ...``).

    librdkafka logs a fatal error as it raises it, but confluent-kafka may surface the error itself
    late or not at all: a CI run saw an ACL refusal (``Cluster authorization failed: Failed to acquire
    idempotence PID``) logged at the first ``poll`` while the only report ``flush`` got, ten seconds
    on, was the purge of the record it failed. The line says why the record was purged."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.fatal_line: str | None = None

    def log(self, level: int, msg: str, *args: Any) -> None:
        self.logger.log(level, msg, *args)
        if self.fatal_line is None:
            text = msg % args if args else msg
            if "Fatal error:" in text:
                self.fatal_line = text.split("Fatal error:", 1)[1].strip()


class KafkaProducer(Producer):
    """A ``Producer`` on one confluent-kafka producer; ``config`` comes from ``KafkaLog``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._fatal: KafkaError | None = None
        """The fatal error librdkafka reported, if any: it fails (purges) every record after it."""
        self._log = FatalLineWatcher(config.get("logger", logger))
        self._producer = RdProducer({**config, "error_cb": self._on_error, "logger": self._log})
        self._principal = config.get("sasl.username")
        self._failures: list[tuple[str, str, KafkaError]] = []
        """(topic, partition or "?", error) per record that failed since the last ``flush``."""
        self._closed = False
        self._sent = 0
        """Records sent so far: the next one's sequence number (``mark``)."""
        self._done_below = 0
        """Every record numbered below this one is acknowledged or failed."""
        self._done_ahead: set[int] = set()
        """Numbers of records done while an earlier one is not (reports of different partitions interleave)."""

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
        sequence = self._sent  # counted once the record is queued or failed; a send that raises is not
        on_delivery = partial(self._on_delivery, sequence)
        error = produce(self._producer, topic, value, key, headers, partition, timestamp_ms, on_delivery)
        if error is not None:
            self._failures.append((topic, "?" if partition is None else str(partition), error))
            self._done(sequence)
        self._sent += 1
        with self._fatal_errors():
            self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        with self._fatal_errors():
            remaining = self._producer.flush(timeout)
        self._raise_failures()
        if remaining:
            raise DeliveryError(f"{remaining} record(s) not acknowledged within {timeout:.1f}s")

    def _raise_failures(self) -> None:
        failures, self._failures = self._failures, []
        if failures:
            purged = any(err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT) for _, _, err in failures)
            # records purged by a fatal error: its report may still be queued (on a loaded machine
            # more than a second after the purge; a test saw a refusal reported only as the purge)
            for _ in range(100 if purged else 0):
                if self._fatal is not None or self._log.fatal_line is not None:
                    break
                try:
                    self._producer.poll(0.1)
                except (KafkaException, SystemError) as exc:  # how confluent-kafka raises a fatal error
                    cause = exc if isinstance(exc, KafkaException) else exc.__cause__ or exc.__context__
                    if isinstance(cause, KafkaException):
                        self._fatal = cause.args[0]
            if self._fatal is not None:
                raise self._fatal_error(self._fatal)
            if purged and self._log.fatal_line is not None:  # the error never came; its log line did
                raise self._fatal_text_error(self._log.fatal_line)
            raise delivery_error(failures, principal=self._principal)

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal() or error.code() == KafkaError._FATAL:
            self._fatal = error

    def _fatal_error(self, error: KafkaError) -> DeliveryError:
        """What a fatal client error means; one the broker's ACLs caused names the principal."""
        if error.code() in (KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED):
            return self._refused(error.str())
        return self._fatal_text_error(error.str())

    def _fatal_text_error(self, text: str) -> DeliveryError:
        """What a fatal error known only by its text means (``_FATAL`` or a log line)."""
        if "authorization failed" in text.lower():
            return self._refused(text)
        return DeliveryError(f"the producer failed: {text}")

    def _refused(self, text: str) -> DeliveryError:
        who = f"principal User:{self._principal}" if self._principal else "this client (no SASL user)"
        return DeliveryError(f"{who} may not write to the log (its producer needs WRITE on a topic): {text}")

    def mark(self) -> int:
        return self._sent

    def settled(self, mark: int | None = None) -> bool:
        with self._fatal_errors():
            self._producer.poll(0)  # serve the delivery reports that have arrived
        if self._done_below < (self._sent if mark is None else mark):  # records queued or in flight
            return False
        self._raise_failures()
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.flush()

    @contextmanager
    def _fatal_errors(self) -> Iterator[None]:
        """Turn a fatal client error raised from ``poll``/``flush`` into a ``DeliveryError`` that says
        what happened; one the broker's ACLs caused names the principal. (confluent-kafka raises a
        fatal error as the pending exception of the next delivery report it serves, which then shows
        as a ``SystemError``.)"""
        try:
            yield
        except (KafkaException, SystemError) as exc:
            cause = exc if isinstance(exc, KafkaException) else exc.__cause__ or exc.__context__
            if not isinstance(cause, KafkaException):
                raise
            self._fatal = cause.args[0]  # the records still queued are purged: later flushes say why
            raise self._fatal_error(self._fatal) from exc

    def _on_delivery(self, sequence: int, err: KafkaError | None, msg: Any) -> None:
        self._done(sequence)
        if err is not None:
            logger.debug("delivery to %s[%s] failed: %s", msg.topic(), msg.partition(), err)
            partition = msg.partition()
            self._failures.append((msg.topic(), "?" if partition is None or partition < 0 else str(partition), err))

    def _done(self, sequence: int) -> None:
        """Record ``sequence`` as acknowledged or failed, moving ``_done_below`` past every done one."""
        if sequence != self._done_below:
            self._done_ahead.add(sequence)
            return
        self._done_below += 1
        while self._done_below in self._done_ahead:
            self._done_ahead.remove(self._done_below)
            self._done_below += 1


def produce(
    client: RdProducer,
    topic: str,
    value: bytes,
    key: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    partition: int | None,
    timestamp_ms: int | None,
    on_delivery: Callable[[KafkaError | None, Any], None],
) -> KafkaError | None:
    """Hand one record to librdkafka, waiting up to ``_QUEUE_FULL_WAIT_S`` while its queue is full.

    Returns the error of a record the client rejects at once (too large for ``message.max.bytes``),
    ``None`` once the record is queued; its delivery report goes to ``on_delivery``. An empty value
    goes as Kafka's null, a tombstone on a compacted topic (``TopicSpec.compacted``)."""
    value = value or None
    kwargs: dict[str, Any] = {"key": key, "on_delivery": on_delivery, "timestamp": timestamp_ms or 0}
    if headers:
        kwargs["headers"] = list(headers)
    if partition is not None:
        kwargs["partition"] = partition
    deadline = time.monotonic() + _QUEUE_FULL_WAIT_S
    while True:
        try:
            client.produce(topic, value, **kwargs)
            return None
        except BufferError as exc:
            if time.monotonic() > deadline:
                raise DeliveryError(f"the producer queue stayed full for {_QUEUE_FULL_WAIT_S:.0f}s") from exc
            client.poll(0.1)
        except KafkaException as exc:
            return exc.args[0]


def delivery_error(
    failures: list[tuple[str, str, KafkaError]], prefix: str = "", principal: str | None = None
) -> DeliveryError:
    """The error for records that failed, (topic, partition or "?", error) each: ``RecordTooLargeError``
    when one was too large, ``DeliveryError`` otherwise. A record the broker's ACLs refused names
    the ``principal`` and what it may not do."""
    counts = Counter((topic, part, err.str()) for topic, part, err in failures)
    detail = "; ".join(f"{topic}[{part}]: {text} (x{n})" for (topic, part, text), n in counts.items())
    refused = sorted({topic for topic, _, err in failures if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED})
    if refused:
        who = f"principal User:{principal}" if principal else "this client (no SASL user)"
        detail += f" - {who} may not WRITE topic {', '.join(refused)}"
    too_large = any(err.code() == KafkaError.MSG_SIZE_TOO_LARGE for _, _, err in failures)
    error = RecordTooLargeError if too_large else DeliveryError
    return error(f"{prefix}{len(failures)} record(s) not delivered: {detail}")
