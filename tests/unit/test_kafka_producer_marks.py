"""``KafkaProducer.mark``/``settled``: delivery reports of different partitions arrive out of order.

No broker: records wait in librdkafka's queue, and the test plays their delivery reports; likewise
what a failed ``flush`` says when a fatal error was only logged.
"""

import pytest

from astraflow.log.kafka.producer import KafkaProducer


def test_a_mark_is_settled_once_every_record_before_it_is_reported_in_any_order() -> None:
    producer = KafkaProducer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    try:
        for i in range(3):
            producer.send("nowhere", b"x", key=str(i).encode())
        mark = producer.mark()
        producer.send("nowhere", b"after the mark")
        assert not producer.settled(mark)
        producer._on_delivery(2, None, None)  # reported before records 0 and 1
        producer._on_delivery(0, None, None)
        assert not producer.settled(mark)  # record 1 still in flight
        producer._on_delivery(1, None, None)
        assert producer.settled(mark)
        assert not producer.settled()  # the record after the mark is not reported yet
        producer._on_delivery(3, None, None)
        assert producer.settled()
    finally:
        producer._producer.purge()  # nothing will deliver these: drop them instead of flushing on close


def test_a_purge_after_a_fatal_error_known_only_from_its_log_line_names_the_refusal() -> None:
    """CI saw librdkafka log an ACL refusal as it raised it while confluent-kafka surfaced only the purge
    of the record: ``flush`` must still say which principal may not write, from the logged line (here
    handed to the producer's librdkafka logger as librdkafka hands it), not 'Purged in queue'."""
    from confluent_kafka import KafkaError

    from astraflow.core.errors import DeliveryError

    producer = KafkaProducer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0, "sasl.username": "analysis"})
    producer._log.log(
        2,
        "%s [%s] %s",
        "FATAL",
        "rdkafka#producer-1",
        "[thrd:main]: Fatal error: Broker: Cluster authorization failed: Failed to acquire idempotence PID",
    )
    producer._failures.append(("run.weights.main", "0", KafkaError(KafkaError._PURGE_QUEUE)))
    with pytest.raises(DeliveryError, match="principal User:analysis may not write to the log"):
        producer._raise_failures()
    producer._failures.append(("run.weights.main", "0", KafkaError(KafkaError._MSG_TIMED_OUT)))
    with pytest.raises(DeliveryError, match="not delivered"):  # no purge: the failure speaks for itself
        producer._raise_failures()
