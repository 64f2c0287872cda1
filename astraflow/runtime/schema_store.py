"""The schema store shared through the log: ``SchemaStore`` over the compacted topic ``SCHEMA_TOPIC``.

Every process that reads or writes records opens one (``runtime.context``, ``runtime.attach``): it
publishes the schemas this package ships and finds, by fingerprint, those another process (an older
or newer AstraFlow) published.

Any process can write the topic, and every process reads all of it at start: a record that is not a
schema (bytes that are not UTF-8 or not JSON, JSON nested deeper than Python recurses, an Avro type
that is no record) or whose key is not its schema's fingerprint is skipped with a warning and its
reason kept (``rejected``), never raised: one bad record would otherwise stop every component of
every run on the log at its next start, for as long as compaction keeps it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable

from astraflow.core.errors import clip
from astraflow.log.base import Log, Message, TopicPartition, TopicSpec
from astraflow.schemas.store import SCHEMA_TOPIC, SchemaStore, WriterSchema, packaged_schemas, writer_schema

logger = logging.getLogger(__name__)


class LogSchemaStore(SchemaStore):
    """A ``SchemaStore`` shared through a compacted log topic (key: fingerprint hex, value: JSON).

    On creation it reads the topic, then publishes every schema it knows that the topic lacks.
    ``get`` of an unknown fingerprint reads the records appended since the last read before it
    gives up, so a schema published by any process is found by every other one.
    """

    def __init__(
        self,
        log: Log,
        schemas: Iterable[WriterSchema] | None = None,
        topic: str = SCHEMA_TOPIC,
        sync_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(list(packaged_schemas().values()) if schemas is None else schemas)
        self._log = log
        self._topic = topic
        self._sync_timeout_s = sync_timeout_s
        self._lock = threading.RLock()
        self._published: set[bytes] = set()
        self.rejected: list[str] = []
        """Why each skipped record of the topic was skipped (``"<part>: <problem>"``), in the order read."""
        log.create_topic(TopicSpec(topic, partitions=1, compacted=True))
        self._partitions = [TopicPartition(topic, p) for p in range(log.describe_topic(topic).partitions)]
        self._consumer = log.consumer()
        self._consumer.assign(self._partitions)
        self._consumer.seek_to_beginning(self._partitions)
        self.sync()
        self.publish()

    def add(self, schema: str | dict[str, Any] | WriterSchema) -> bytes:
        """Learn a schema and publish it to the topic if the topic does not hold it yet."""
        fp = super().add(schema)
        if fp not in self._published:
            self.publish()
        return fp

    def get(self, fp: bytes) -> WriterSchema:
        """The writer schema with this fingerprint, reading new topic records on a miss."""
        if fp not in self:
            self.sync()
        return super().get(fp)

    def sync(self) -> int:
        """Read the topic records appended since the last sync; return how many schemas were new."""
        with self._lock:
            ends = self._log.end_offsets(self._topic)
            deadline = time.monotonic() + self._sync_timeout_s
            learnt = 0
            while any(0 < ends.get(tp.partition, 0) > self._consumer.position(tp) for tp in self._partitions):
                if time.monotonic() > deadline:
                    logger.warning("schema topic %s: stopped reading after %.1fs", self._topic, self._sync_timeout_s)
                    break
                for message in self._consumer.poll(max_records=500, timeout=0.2):
                    learnt += self._learn(message)
            return learnt

    def publish(self) -> None:
        """Write every known schema the topic does not hold yet, and wait for the log to ack."""
        with self._lock:
            missing = [s for s in self if s.fingerprint not in self._published]
            if not missing:
                return
            with self._log.producer() as producer:
                for schema in missing:
                    producer.send(self._topic, schema.text.encode(), key=schema.fingerprint.hex().encode())
                producer.flush()
            self._published.update(s.fingerprint for s in missing)

    def close(self) -> None:
        """Release the topic consumer (the log itself stays open)."""
        self._consumer.close()

    def __enter__(self) -> "LogSchemaStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _learn(self, message: Message) -> int:
        problem, schema = schema_record(message)
        if schema is None:
            where = f"{self._topic}[{message.partition}]@{message.offset}"
            self.rejected.append(f"{where}: {problem}")
            logger.warning("schema topic: skipping the record at %s: %s", where, problem)
            return 0
        self._published.add(schema.fingerprint)
        new = schema.fingerprint not in self
        super().add(schema)
        return int(new)

    def _where(self) -> str:
        return f"{super()._where()}, nor in the log topic {self._topic}"


def schema_record(message: Message) -> tuple[str, WriterSchema | None]:
    """The schema a record of the schema topic holds, or why it holds none (``"<part>: <problem>"``), for
    any reader of the topic."""
    try:
        text = bytes(message.value).decode()
    except UnicodeDecodeError as exc:
        return f"value: not UTF-8 text: {exc}", None
    try:
        schema = writer_schema(text)
    except Exception as exc:  # noqa: BLE001 - anyone's bytes: no failure of one record stops the store
        return f"schema: {exc}", None
    key = message.key.decode("ascii", "replace") if message.key is not None else None
    if key is not None and key != schema.fingerprint.hex():
        return f"key: {clip(key, 64)!r} is not the schema's fingerprint {schema.fingerprint.hex()}", None
    return "", schema
