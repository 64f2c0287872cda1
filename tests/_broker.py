"""The Kafka broker a test session runs against, in order of preference:

1. ``$ASTRAFLOW_KAFKA_BOOTSTRAP``: a broker someone already runs (the session leaves it alone);
2. testcontainers' ``KafkaContainer`` (KRaft) when a Docker engine answers;
3. ``LocalKafkaBroker`` on free ports, with its jars cached in the default broker home
   (``$ASTRAFLOW_HOME`` or ``~/.cache/astraflow/kafka``, shared across runs) and its data in the
   session's temporary directory.

A broker that cannot start skips the Kafka tests with the reason, except with ``CI=true``, where
it fails the run: Kafka tests must never be skipped silently in CI.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


def docker_available() -> bool:
    """True when ``docker info`` reaches an engine within a few seconds."""
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def session_broker(tmp_dir: Path) -> Iterator[str]:
    """Yield the bootstrap servers of a Kafka broker that lives as long as the context."""
    external = os.environ.get("ASTRAFLOW_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    with contextlib.ExitStack() as stack:
        try:
            bootstrap = stack.enter_context(_container() if docker_available() else _local_broker(tmp_dir))
        except Exception as exc:  # any start failure: reported in full, fatal in CI
            unavailable(f"no Kafka broker for the integration tests: {type(exc).__name__}: {exc}", exc)
        yield bootstrap


def unavailable(reason: str, cause: BaseException | None = None) -> NoReturn:
    """Skip the calling test or fixture with ``reason``; with ``CI=true`` fail instead."""
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(reason) from cause
    pytest.skip(reason)


@contextlib.contextmanager
def _local_broker(tmp_dir: Path) -> Iterator[str]:
    from astraflow.core.ports import free_port
    from astraflow.infra.broker.local import LocalKafkaBroker, default_home

    broker = LocalKafkaBroker(tmp_dir / "broker", port=free_port(), jar_cache=default_home())
    broker.start(timeout=120)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@contextlib.contextmanager
def _container() -> Iterator[str]:
    from testcontainers.community.kafka import KafkaContainer

    container = (
        KafkaContainer(KAFKA_IMAGE)
        .with_kraft()
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .with_env("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS", "1000")
        .with_env("KAFKA_MESSAGE_MAX_BYTES", str(16 * 1024 * 1024))
    )
    with container:
        yield container.get_bootstrap_server()
