"""``astraflow tail``: attach to any topic with its own group (or none) and print JSON lines.

An analysis consumer never disturbs a running job: without ``--group`` it reads by assignment and
commits nothing; with one it commits in that group only. Records are decoded with the schema
named by their fingerprint, so any AstraFlow topic (or the dead-letter topic) prints the same way;
bytes that are not AstraFlow Avro print as an error line with the raw size instead of stopping.
With ``select`` (``--policy``/``--min-version``/``--where``, see ``record_filter.py``) only the
decoded records it accepts print, undecodable ones are skipped, and ``limit`` counts printed lines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from astraflow.core.errors import AstraFlowError
from astraflow.log import Log, TopicPartition
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.schemas.codec import Codec, to_jsonable


def tail_topic(
    log: Log,
    topic: str,
    group: str | None = None,
    from_beginning: bool = False,
    limit: int | None = None,
    idle_timeout: float | None = None,
    select: Callable[[Any], bool] | None = None,
) -> Iterator[str]:
    """Yield one JSON line per record of ``topic`` until ``limit`` records or ``idle_timeout`` idle seconds."""
    schemas = LogSchemaStore(log)
    codec = Codec(schemas)
    spec = log.describe_topic(topic)
    consumer = log.consumer(group_id=group, auto_offset_reset="earliest" if from_beginning else "latest")
    partitions = [TopicPartition(topic, p) for p in range(spec.partitions)]
    consumer.assign(partitions)
    if from_beginning:
        consumer.seek_to_beginning(partitions)
    elif group is None:
        consumer.seek_to_end(partitions)
    seen = 0
    last = time.monotonic()
    try:
        while limit is None or seen < limit:
            messages = consumer.poll(max_records=min(500, limit - seen) if limit else 500, timeout=0.5)
            if not messages:
                if idle_timeout is not None and time.monotonic() - last > idle_timeout:
                    return
                continue
            last = time.monotonic()
            for message in messages:
                head = {
                    "topic": message.topic,
                    "partition": message.partition,
                    "offset": message.offset,
                    "timestamp_ms": message.timestamp_ms,
                }
                try:
                    record = codec.decode(message.value)
                except AstraFlowError as exc:
                    if select is None:
                        seen += 1
                        yield json.dumps(head | {"error": str(exc), "bytes": len(message.value)})
                    continue
                if select is None or select(record):
                    seen += 1
                    yield json.dumps(head | {"type": type(record).__name__, "value": to_jsonable(record)})
            if group is not None:
                consumer.commit()
    finally:
        consumer.close()
        schemas.close()
