"""A Kafka client for the cross-region test, run inside a network namespace (or on the host).

``python -m tests.integration.region_client BOOTSTRAP TOPIC ACKS BULK_BYTES`` sends ``ACKS``
small records one at a time, each flushed (the time to its acknowledgement is one produce round
trip), then ``BULK_BYTES`` in 128 KiB records flushed once (bulk throughput), and reads the
small records back (one fetch round trip each poll). Prints one JSON object: the round trips in
seconds, the bulk seconds and bytes, and the keys it read back.
"""

from __future__ import annotations

import json
import sys
import time

from astraflow.log import TopicPartition, open_log

CHUNK = 128 * 1024


def main(bootstrap: str, topic: str, acks: int, bulk_bytes: int) -> None:
    result: dict[str, object] = {"round_trips": []}
    with open_log("kafka", bootstrap=bootstrap) as log, log.producer() as producer:
        producer.send(topic, b"warm-up", key=b"warm")  # metadata and connection set-up, not timed
        producer.flush()
        for i in range(acks):
            started = time.perf_counter()
            producer.send(topic, f"ack-{i}".encode(), key=f"ack-{i}".encode())
            producer.flush()
            result["round_trips"].append(time.perf_counter() - started)
        started = time.perf_counter()
        for i in range(bulk_bytes // CHUNK):
            producer.send(topic, bytes(CHUNK), key=f"bulk-{i}".encode())
        producer.flush(timeout=120)
        result["bulk_seconds"], result["bulk_bytes"] = time.perf_counter() - started, bulk_bytes // CHUNK * CHUNK
        with log.consumer(group_id=None) as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek_to_beginning()
            keys: list[str] = []
            deadline = time.monotonic() + 60
            while len(keys) < acks + 1 + bulk_bytes // CHUNK and time.monotonic() < deadline:
                keys += [m.key.decode() for m in consumer.poll(max_records=500, timeout=1.0)]
            result["read_back"] = keys
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
