"""What every component process holds: its log, codec, topic names, metrics and dead letters.

A component gets everything it needs to talk to the rest of the system from a ``ComponentContext``
built from the run config; it never holds a reference to another component. Its codec's schema
store is the log's ``_astraflow.schemas`` topic, so every schema a component writes with is on the
log for readers that do not ship it. Metrics and dead letters are records like any other, written
to its role's ``{run}.metrics.{role}`` and ``{run}.deadletter.{role}`` (``runtime/control.py``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from astraflow.config import RunConfig
from astraflow.config.log import ADMIN, COMPONENT_ROLES
from astraflow.core.rundir import RunDir
from astraflow.log import Log, Message, Producer, open_log
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, Metric

logger = logging.getLogger(__name__)
RECORD_OVERHEAD_BYTES = 1024
"""What a record costs beyond its value under a topic's ``max_message_bytes``: key, headers, and
on Kafka the record batch around it."""
SAMPLE_HEADROOM_BYTES = 4096
"""Room a trajectory leaves under its topic's record limit for what the stream processor adds to make
it a TrainSample (advantage, ids, operator names), so a trajectory that fits yields a sample that fits."""
REASON_CHARS = 2000
"""The longest dead-letter reason kept: an exception's text can be as long as the record it quotes."""


def now_ms() -> int:
    return int(time.time() * 1000)


def open_run_log(config: RunConfig, run_dir: Path, component: str | None = None) -> Log:
    """The run's log: ``run_dir/log.sqlite`` for the embedded backend, the cluster for Kafka (as
    ``component``'s principal, where ``log.security.role_credentials`` gives each its own)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return open_log(
        config.log.backend,
        path=RunDir(run_dir).log,
        bootstrap=config.log.bootstrap,
        client_config=config.log.client_config(component),
    )


def dead_letter_record(
    origin: str, message: Message | None, reason: str, error: BaseException | None = None
) -> DeadLetter:
    """The dead-letter record for ``message`` (raw bytes, where it was read, ``reason`` cut to
    ``REASON_CHARS``), logged as a warning."""
    if len(reason) > REASON_CHARS:
        reason = reason[: REASON_CHARS - 20] + f" ... ({len(reason):,} chars)"
    logger.warning("dead-lettering a record from %s: %s", message.topic if message else "-", reason)
    return DeadLetter(
        origin=origin,
        reason=reason,
        error_type=type(error).__name__ if error else "",
        topic=message.topic if message else "",
        partition=message.partition if message else -1,
        offset=message.offset if message else -1,
        key=message.key if message else None,
        payload=message.value if message else b"",
        created_ms=now_ms(),
    )


class ComponentContext:
    """Log, codec, producer and topic names of one component process of one run."""

    def __init__(self, config: RunConfig, run_dir: Path, component: str) -> None:
        self.config = config
        self.run_dir = run_dir
        self.component = component
        self.role = COMPONENT_ROLES.get(component, ADMIN)
        """The role whose principal this component logs in as, and whose metrics and dead-letter topics it writes."""
        self.instance = f"{component}-{socket.gethostname()}-{os.getpid()}"
        self.log = open_run_log(config, run_dir, component)
        self.schemas = LogSchemaStore(self.log)
        self.codec = Codec(self.schemas)
        self.topics = RunTopics(config.run, config.workflow, config.policy_names())
        self.topics.ensure(self.log, config.log.partitions, config.weights.chunk_bytes)
        self.producer: Producer = self.log.producer()
        self.dead_letters = 0
        self._record_limits: dict[str, int] = {}

    def metric(self, name: str, value: float, step: int, **labels: str) -> None:
        """Queue one metric record (sent with the next flush)."""
        record = Metric(self.component, name, float(value), int(step), now_ms(), {"instance": self.instance, **labels})
        self.producer.send(self.topics.metrics(self.role), self.codec.encode(record), key=self.component.encode())

    def oversize(self, topic: str, value: bytes, headroom: int = 0) -> str | None:
        """Why ``value`` would be refused by ``topic`` (its ``max_message_bytes``, less the record batch's
        ``RECORD_OVERHEAD_BYTES`` and ``headroom``), or ``None`` when it fits. Checked before sending,
        because a refused record fails only the whole flush, later, without saying which record it was."""
        if topic not in self._record_limits:
            self._record_limits[topic] = self.log.describe_topic(topic).max_message_bytes
        limit = self._record_limits[topic] - RECORD_OVERHEAD_BYTES - headroom
        if len(value) <= limit:
            return None
        return f"record of {len(value):,} bytes exceeds the {limit:,} bytes a record of topic {topic!r} may have"

    def dead_letter(self, message: Message | None, reason: str, error: BaseException | None = None) -> None:
        """Queue a dead-letter record holding the raw bytes and why they could not be processed."""
        letter = self.codec.encode(self.dead_letter_record(message, reason, error))
        self.producer.send(self.topics.deadletter(self.role), letter)

    def dead_letter_record(
        self, message: Message | None, reason: str, error: BaseException | None = None
    ) -> DeadLetter:
        """The dead-letter record for ``message``, counted and logged, for a caller that sends it
        itself (the faust stream runtime writes it in the transaction of the record it rejects)."""
        self.dead_letters += 1
        return dead_letter_record(self.instance, message, reason, error)

    def close(self) -> None:
        self.producer.close()
        self.schemas.close()
        self.log.close()
