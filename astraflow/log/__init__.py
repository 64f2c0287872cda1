"""The log: topics of Avro records joining every AstraFlow component (see ``base.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astraflow.log.base import (
    Consumer,
    Log,
    Message,
    Producer,
    TopicPartition,
    TopicSpec,
    TransactionalProducer,
)

__all__ = [
    "Consumer",
    "Log",
    "Message",
    "Producer",
    "TopicPartition",
    "TopicSpec",
    "TransactionalProducer",
    "open_log",
]


def open_log(
    backend: str,
    *,
    path: str | Path | None = None,
    bootstrap: str | None = None,
    client_config: dict[str, Any] | None = None,
) -> Log:
    """Open the log backend named by ``backend`` (``embedded`` needs ``path``, ``kafka`` ``bootstrap``;
    ``client_config`` adds librdkafka settings to every Kafka client, e.g. ``LogConfig.client_config()``).

    Imports the backend module lazily so that the other one's client library is never loaded.
    """
    from astraflow.core.errors import ConfigError

    if backend == "embedded":
        if path is None:
            raise ConfigError("log.path: the embedded backend needs a SQLite file path")
        from astraflow.log.embedded.log import EmbeddedLog

        return EmbeddedLog(Path(path))
    if backend == "kafka":
        if not bootstrap:
            raise ConfigError("log.bootstrap: the kafka backend needs bootstrap servers, e.g. 127.0.0.1:9092")
        from astraflow.log.kafka.log import KafkaLog

        return KafkaLog(bootstrap, client_config)
    raise ConfigError(f"log.backend: unknown backend {backend!r}; choose 'embedded' or 'kafka'")
