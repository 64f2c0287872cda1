"""The newest task of each partition of a tasks topic: where a restarted feeder continues.

The last offset of a partition need not hold a task: on Kafka every committed or aborted
transaction ends with a marker that takes an offset, and the records of an aborted round take
offsets that no ``read_committed`` reader is given. So each partition is read backwards, in
windows of ``WINDOW`` offsets that double at each step, until a window holds a task; a window
is read until the consumer's position reaches its end (positions move past markers and aborted
records too), so no wait on the clock decides that a window is empty.
"""

from __future__ import annotations

import logging
import time

from astraflow.core.errors import AstraFlowError
from astraflow.log import Consumer, Log, TopicPartition
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import RolloutTask

logger = logging.getLogger(__name__)
WINDOW = 16
"""Offsets read by the first step back from a partition's end."""


def newest_tasks(log: Log, codec: Codec, topic: str, timeout: float = 60.0) -> dict[int, RolloutTask]:
    """Per partition that holds one, its newest task that decodes. Read after every older writer is
    fenced: on Kafka a transaction still open would hold the reader back at its first offset."""
    deadline = time.monotonic() + timeout
    newest = {}
    with log.consumer() as consumer:
        for partition, end in log.end_offsets(topic).items():
            if end > 0:
                task = _newest(consumer, codec, TopicPartition(topic, partition), end, deadline)
                if task is not None:
                    newest[partition] = task
    return newest


def _newest(consumer: Consumer, codec: Codec, tp: TopicPartition, end: int, deadline: float) -> RolloutTask | None:
    consumer.assign([tp])
    consumer.seek_to_beginning([tp])
    start = consumer.position(tp)
    window, high = WINDOW, end
    while high > start:
        low = max(start, high - window)
        consumer.seek(tp, low)
        found = None
        while consumer.position(tp) < high:
            if time.monotonic() > deadline:
                raise AstraFlowError(f"could not read {tp.topic}[{tp.partition}] up to offset {high} to resume")
            for message in consumer.poll(max_records=window, timeout=0.2):
                if message.offset >= high:
                    continue
                try:
                    found = codec.decode(message.value, expect=RolloutTask)
                except AstraFlowError as exc:
                    logger.error("undecodable task at %s[%d]@%d: %s", tp.topic, tp.partition, message.offset, exc)
        if found is not None:
            return found
        window, high = window * 2, low
    return None
