"""A Kafka log whose broker does not answer fails at open, in bounded time, naming the address."""

from __future__ import annotations

import socket
import time

import pytest

from astraflow.core.errors import LogError
from astraflow.log.kafka.log import KafkaLog


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_broker_fails_at_open_naming_the_bootstrap_address() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(LogError, match=None) as caught:
        KafkaLog(bootstrap, connect_timeout_s=2.0)
    assert time.monotonic() - started < 10.0
    assert f"cannot reach the Kafka cluster at {bootstrap} within 2s" in str(caught.value)
