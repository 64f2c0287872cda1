"""Attaching an analysis consumer to a run, live or finished, without disturbing it.

``stats``, ``report``, ``export`` and ``runs`` find a run from its directory (which holds the
resolved ``config.yaml`` that ``astraflow run`` saved, and ``log.sqlite`` on the embedded backend)
or from its YAML config. They read topics by ``assign`` + ``seek`` with no consumer group, so they
commit nothing and the run's groups (``{run}.stream.{policy}``, ``{run}.train.{policy}`` ...) keep
their members and offsets. A read is a *snapshot*: it stops at the end offsets taken when it
started, so it terminates on a run that is still appending.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.config import RunConfig, load_config
from astraflow.core.errors import AstraFlowError, ConfigError
from astraflow.core.rundir import RunDir
from astraflow.log import Log, Message, TopicPartition, open_log
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.schemas.codec import Codec

STALL_S = 10.0
"""A snapshot read gives up on partitions that return nothing for this long (e.g. a compacted tail)."""


@dataclass
class AttachedRun:
    """The config, directory and log of one run, opened read-only by convention."""

    config: RunConfig
    run_dir: Path
    log: Log

    @property
    def name(self) -> str:
        return self.config.run

    def topics_of(self, kind: str) -> list[str]:
        """The run's topics of one kind (``trajectories``, ``samples`` ...), e.g. one per policy."""
        prefix = f"{self.name}.{kind}."
        return [topic for topic in self.log.list_topics() if topic.startswith(prefix)]

    def run_topics(self) -> list[str]:
        """Every topic namespaced by this run."""
        return [topic for topic in self.log.list_topics() if topic.startswith(f"{self.name}.")]

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> AttachedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_run(
    target: Path, run_dir: Path | None = None, *, backend: str | None = None, bootstrap: str | None = None
) -> AttachedRun:
    """Open the run named by ``target``: a run directory, or a YAML config (run dir from ``run_dir``
    or the default ``runs/<run>``). ``backend`` and ``bootstrap`` override the config's log (e.g. a
    Kafka run seen through another broker address). The one way analysis tools, replay and the
    offline mixer open another run."""
    if target.is_dir():
        directory = target
        config_path = RunDir(target).config
        if not config_path.exists():
            raise ConfigError(
                f"{target}: no config.yaml here; give a run directory written by `astraflow run` or a config"
            )
    elif target.is_file():
        config_path = target
        directory = run_dir
    else:
        raise ConfigError(f"{target}: no such run directory or config file")
    overrides = {key: value for key, value in (("log.backend", backend), ("log.bootstrap", bootstrap)) if value}
    config = load_config(config_path, overrides or None)
    directory = directory or RunDir.default(config.run).root
    return AttachedRun(config, directory, open_run_log_readonly(config, directory))


def open_run_log_readonly(config: RunConfig, run_dir: Path, component: str = "analysis") -> Log:
    """The run's log, on Kafka as ``component``'s principal (``analysis``: read only); unlike the
    components, never creates an empty embedded log file."""
    if config.log.backend == "embedded":
        path = RunDir(run_dir).log
        if not path.exists():
            raise ConfigError(f"{run_dir}: no log.sqlite, so no embedded log to attach to")
        return open_log("embedded", path=path)
    security = config.log.client_config(component)
    return open_log(config.log.backend, bootstrap=config.log.bootstrap, client_config=security)


def offsets_at(log: Log, topic: str, timestamp_ms: int | None = None) -> dict[int, int]:
    """Per partition, the oldest retained offset, or with ``timestamp_ms`` the first record at or
    after it (the end offset where there is none); found by seeking, nothing is read."""
    partitions = [TopicPartition(topic, p) for p in range(log.describe_topic(topic).partitions)]
    with log.consumer(group_id=None) as consumer:
        consumer.assign(partitions)
        if timestamp_ms is None:
            consumer.seek_to_beginning(partitions)
        else:
            consumer.seek_to_timestamp(timestamp_ms, partitions)
        return {tp.partition: consumer.position(tp) for tp in partitions}


def read_snapshot(log: Log, topic: str, start_ms: int | None = None) -> Iterator[Message]:
    """Every record of ``topic`` from its oldest retained one (or the first at ``start_ms``) up to
    the end offsets as they were when the read began, read by assignment (nothing committed)."""
    ends = log.end_offsets(topic)
    consumer = log.consumer(group_id=None)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(ends)]
        consumer.assign(partitions)
        if start_ms is None:
            consumer.seek_to_beginning(partitions)
        else:
            consumer.seek_to_timestamp(start_ms, partitions)
        pending = {tp for tp in partitions if consumer.position(tp) < ends[tp.partition]}
        last = time.monotonic()
        while pending and time.monotonic() - last < STALL_S:
            messages = consumer.poll(max_records=1000, timeout=0.5)
            if messages:
                last = time.monotonic()
            for message in messages:
                if message.offset < ends[message.partition]:
                    yield message
            pending = {tp for tp in pending if consumer.position(tp) < ends[tp.partition]}
    finally:
        consumer.close()


def decode_snapshot(log: Log, topic: str, start_ms: int | None = None) -> Iterator[tuple[Message, Any]]:
    """``read_snapshot`` with each record decoded; an undecodable one comes with its error instead."""
    schemas = LogSchemaStore(log)
    codec = Codec(schemas)
    try:
        for message in read_snapshot(log, topic, start_ms):
            try:
                yield message, codec.decode(message.value)
            except AstraFlowError as exc:
                yield message, exc
    finally:
        schemas.close()
