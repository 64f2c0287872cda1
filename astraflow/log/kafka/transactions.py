"""The Kafka ``TransactionalProducer``: librdkafka's transactions, its errors mapped onto ours.

How the contract of ``TransactionalProducer`` (``base.py``) maps onto librdkafka:

1. Creating the producer runs ``init_transactions``: the transaction coordinator bumps the
   producer epoch of the transactional id, which fences every older instance, and ends that
   instance's open transaction (aborts it, or finishes a commit already under way).
2. ``begin`` is ``begin_transaction`` (local only). ``send`` produces as ``KafkaProducer`` does;
   a record the client refuses at once (over ``message.max.bytes``) is remembered, so that
   ``commit`` aborts rather than commit the others without it.
3. ``send_offsets`` passes the consumer's group metadata (group, generation, member id), so the
   coordinator refuses offsets of a member that a rebalance replaced (KIP-447).
4. ``commit`` is ``commit_transaction``: flush the records, then write the commit markers and
   the offsets. A retriable error is retried until the timeout, after which the outcome is
   unknown (``LogError``). An abortable one (a record that failed, offsets refused) aborts and
   raises ``DeliveryError`` for failed records, ``TransactionAbortedError`` otherwise. librdkafka
   keeps counting the sequence numbers of records the broker refused, so the next transaction
   that writes to their partition fails once more (``OUT_OF_ORDER_SEQUENCE_NUMBER``, raised as
   ``TransactionAbortedError``); the abort after it bumps the producer epoch, which resets them.
5. A fatal error - the epoch fenced by a newer instance (``_FENCED``, ``PRODUCER_FENCED``) or
   anything else librdkafka cannot recover from - raises ``FencedError`` (``LogError`` for the
   others) from the call that meets it, and again from every later call.
6. ``abort`` is ``abort_transaction``, which drops what is still queued; ``close`` aborts an
   open transaction. Delivery reports of an earlier transaction never count against a later one.
7. ``send_offsets_to_transaction`` can ignore its timeout and wait for ever: librdkafka keeps a
   group coordinator it lost cached and never looks for the new one (librdkafka issues #5456 and
   #5511, open at 2.16; met here after a single broker restarted). So it runs on a watcher thread:
   past its timeout and a grace, the producer is abandoned - ``LogError`` now and from every later
   call, ``close`` does nothing, and the client is kept in ``stuck_clients`` so that no destructor
   waits on the hung call. The stage exits (``launch.process.run_component`` ends the process
   without closing the log) and restarts; its new producer with the same id fences the old one and
   ends the open transaction. The caller's thread stays free meanwhile, so a stop signal is heard.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Callable, NoReturn

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdPartition

from astraflow.core.errors import FencedError, LogError, TransactionAbortedError
from astraflow.log.base import Consumer, TopicPartition, TransactionalProducer
from astraflow.log.kafka import stuck_clients
from astraflow.log.kafka.consumer import KafkaConsumer
from astraflow.log.kafka.producer import delivery_error, produce

_FENCING = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
"""Fatal errors that mean a newer producer with the same transactional id took over."""
_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
"""Delivery reports of records that ``abort`` dropped: expected, not failures."""
_REFUSED = (
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
)
"""Fatal errors of an operation the broker's ACLs refused."""


SEND_OFFSETS_TIMEOUT_S = 12.0
"""The longest ``send_offsets`` waits for the group coordinator; then it raises ``LogError`` (outcome
unknown: the caller closes the producer and its stage restarts). Healthy calls take milliseconds, and
a coordinator moving to another node after one died is found within the brokers' session timeout
(9 s by default); a longer wait only delays the restart that the hang of step 7 ends in anyway (a
restarted single broker cost the trainer 86 s with 30 s here)."""
GRACE_S = 5.0
"""How much longer than its own timeout a librdkafka call may take before the producer is abandoned."""


class KafkaTransactionalProducer(TransactionalProducer):
    """A ``TransactionalProducer`` on one confluent-kafka producer; ``config`` comes from ``KafkaLog``."""

    def __init__(self, config: dict[str, Any], transactional_id: str, timeout: float = 30.0) -> None:
        self._id = transactional_id
        self._principal = config.get("sasl.username")
        self._producer = RdProducer({**config, "transactional.id": transactional_id})
        self._open = False
        self._closed = False
        self._broken: LogError | None = None
        """The fatal error met, raised again by every later call."""
        self._transaction = 0
        """Number of the current transaction; delivery reports carry the number they were sent in."""
        self._failures: list[tuple[str, str, KafkaError]] = []
        """(topic, partition or "?", error) per record of the current transaction that failed."""
        self._call("init_transactions", lambda: self._producer.init_transactions(timeout))

    def begin(self) -> None:
        self._check_usable()
        if self._open:
            raise LogError(f"transactional producer {self._id!r}: a transaction is already open")
        self._call("begin_transaction", self._producer.begin_transaction)
        self._transaction += 1
        self._failures = []
        self._open = True

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self._require_open("send")
        on_delivery = partial(self._on_delivery, self._transaction)

        def send_one() -> None:
            error = produce(self._producer, topic, value, key, headers, partition, timestamp_ms, on_delivery)
            if error is not None and error.code() == KafkaError._FATAL:
                self._producer.poll(0)  # raises the fatal error itself, if it was not served yet
                self._fail("send", error)
            if error is not None:
                self._failures.append((topic, "?" if partition is None else str(partition), error))
            self._producer.poll(0)

        self._call("send", send_one)

    def send_offsets(self, consumer: Consumer, offsets: dict[TopicPartition, int]) -> None:
        self._require_open("send_offsets")
        if not isinstance(consumer, KafkaConsumer):
            raise LogError(f"send_offsets needs a consumer of the Kafka log, got {type(consumer).__name__}")
        metadata = consumer.group_metadata()
        if not offsets:
            return
        positions = [RdPartition(tp.topic, tp.partition, offset) for tp, offset in offsets.items()]
        self._call(
            "send_offsets",
            lambda: self._watched(
                "send_offsets",
                lambda: self._producer.send_offsets_to_transaction(positions, metadata, SEND_OFFSETS_TIMEOUT_S),
            ),
        )

    def commit(self, timeout: float = 30.0) -> None:
        self._require_open("commit")
        deadline = time.monotonic() + timeout
        if self._failures:  # refused at send: committing would leave them out
            self._end_aborted(deadline, None)
        while True:
            try:
                self._producer.commit_transaction(max(0.0, deadline - time.monotonic()))
                break
            except KafkaException as exc:
                error = exc.args[0]
                if _is_fatal(error):
                    self._fail("commit", error, exc)
                if error.txn_requires_abort():
                    self._end_aborted(deadline, error)
                if not (error.retriable() and time.monotonic() < deadline):
                    raise LogError(
                        f"transactional producer {self._id!r}: commit failed, outcome unknown: {error.str()};"
                        " close this producer: a new one with the same id settles the transaction"
                    ) from exc
        self._open = False

    def abort(self, timeout: float = 30.0) -> None:
        self._require_open("abort")
        self._call("abort", lambda: self._producer.abort_transaction(timeout))
        self._open = False

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._open and self._broken is None:
                self.abort()
        finally:
            self._closed = True

    def _watched(self, doing: str, call: Callable[[], Any]) -> None:
        """Run ``call`` on a watcher thread; if it has not returned ``SEND_OFFSETS_TIMEOUT_S`` + ``GRACE_S``
        later, abandon the producer (step 7): raise ``LogError`` now and from every later call."""
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as exc:  # handed to the caller's thread below
                outcome.append(exc)

        watcher = threading.Thread(target=run, name=f"{self._id}.{doing}", daemon=True)
        watcher.start()
        watcher.join(SEND_OFFSETS_TIMEOUT_S + GRACE_S)
        if watcher.is_alive():
            self._open = False
            self._broken = LogError(
                f"transactional producer {self._id!r}: {doing} did not return within"
                f" {SEND_OFFSETS_TIMEOUT_S + GRACE_S:.0f} s although bounded to {SEND_OFFSETS_TIMEOUT_S:.0f} s"
                " (librdkafka keeps waiting for a group coordinator it lost, e.g. across a broker restart);"
                " the producer is abandoned: its stage must exit, and a new producer with the same id ends"
                " the open transaction"
            )
            stuck_clients.note(f"transactional producer {self._id!r} in {doing}", self._producer)
            raise self._broken
        if outcome[0] is not None:
            raise outcome[0]

    def _end_aborted(self, deadline: float, cause: KafkaError | None) -> NoReturn:
        """Abort after an abortable error and raise what it was (step 4)."""
        self.abort(max(0.1, deadline - time.monotonic()))
        self._call("abort", lambda: self._producer.poll(0))  # the delivery reports: which records failed
        failures = self._failures
        prefix = f"transaction of {self._id!r} aborted: "
        if failures:
            raise delivery_error(failures, prefix)
        raise TransactionAbortedError(prefix + (cause.str() if cause is not None else "unknown cause"))

    def _on_delivery(self, transaction: int, error: KafkaError | None, msg: Any) -> None:
        if error is None or transaction != self._transaction or error.code() in _PURGED:
            return
        partition = msg.partition()
        self._failures.append((msg.topic(), "?" if partition is None or partition < 0 else str(partition), error))

    def _call(self, doing: str, call: Callable[[], Any]) -> None:
        """Run one librdkafka call: a fatal error breaks the producer (step 5), an abortable one
        aborts the open transaction (step 4), any other raises ``LogError``."""
        try:
            call()
        except KafkaException as exc:
            error = exc.args[0]
            if _is_fatal(error):
                self._fail(doing, error, exc)
            if error.txn_requires_abort() and self._open and doing != "abort":
                self._end_aborted(time.monotonic() + 30.0, error)
            raise LogError(f"transactional producer {self._id!r}: {doing} failed: {error.str()}") from exc

    def _fail(self, doing: str, error: KafkaError, cause: BaseException | None = None) -> NoReturn:
        """Break the producer on a fatal error: raise it now, and from every later call."""
        self._open = False
        text = f"transactional producer {self._id!r}: {doing} failed: {error.str()}"
        if error.code() in _FENCING:
            self._broken = FencedError(f"{text} (a newer producer with the same transactional id took over)")
        elif error.code() in _REFUSED:
            principal = self._principal
            who = f"principal User:{principal}" if principal else "this client (no SASL user)"
            operation = (
                "use transactional id" if error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED else "do"
            )
            self._broken = LogError(f"{who} may not {operation} {self._id!r}: {text}")
        else:
            self._broken = LogError(f"{text} (a fatal error: this producer can do nothing more)")
        raise self._broken from cause

    def _require_open(self, operation: str) -> None:
        self._check_usable()
        if not self._open:
            raise LogError(f"transactional producer {self._id!r}: {operation} needs an open transaction (begin)")

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise type(self._broken)(str(self._broken))
        if self._closed:
            raise LogError(f"transactional producer {self._id!r} is closed")


def _is_fatal(error: KafkaError) -> bool:
    """librdkafka cannot go on after it: the producer was fenced, or broke for another reason."""
    fenced = error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)
    return error.fatal() or fenced or error.code() == KafkaError._FATAL
