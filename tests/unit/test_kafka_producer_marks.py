"""``KafkaProducer.mark``/``settled``: delivery reports of different partitions arrive out of order.

No broker: records wait in librdkafka's queue, and the test plays their delivery reports.
"""

from astraflow.log.kafka_producer import KafkaProducer


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
