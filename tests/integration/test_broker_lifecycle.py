"""The local KRaft broker: ``astraflow broker start|status|stop`` and data kept across restarts.

Each test runs its own broker in a temporary home; the jars come from the shared cache, so only
the very first run on a machine downloads them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.core.errors import BrokerError
from astraflow.core.ports import free_port
from astraflow.infra.broker.local import LocalKafkaBroker, default_home
from astraflow.log.base import TopicPartition, TopicSpec
from astraflow.log.kafka.log import KafkaLog
from tests._broker import unavailable

pytestmark = pytest.mark.kafka

ASTRAFLOW = Path(sys.executable).with_name("astraflow")


@pytest.fixture(scope="module")
def jar_cache() -> Path:
    """The shared jar cache, fetched from Maven Central if this machine never did."""
    try:
        LocalKafkaBroker(default_home()).fetch()
    except BrokerError as exc:
        unavailable(f"the Kafka jars cannot be fetched: {exc}", exc)
    return default_home()


def broker_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ASTRAFLOW), "broker", *args, "--home", str(home)], capture_output=True, text=True, timeout=180
    )


def test_cli_restart_keeps_records(tmp_path: Path, jar_cache: Path) -> None:
    home = tmp_path / "broker"
    started = broker_cli("start", "--port", str(free_port()), "--jars", str(jar_cache), home=home)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        bootstrap = LocalKafkaBroker(home).bootstrap
        assert bootstrap in broker_cli("status", home=home).stdout
        sent = [(f"key-{i % 3}".encode(), f"value-{i}".encode()) for i in range(20)]
        with KafkaLog(bootstrap) as log, log.producer() as producer:
            log.create_topic(TopicSpec("lifecycle", partitions=2))
            for key, value in sent:
                producer.send("lifecycle", value, key=key)
            producer.flush()

        assert broker_cli("stop", home=home).returncode == 0
        stopped = broker_cli("status", home=home)
        assert (stopped.returncode, stopped.stdout.split()[0]) == (3, "stopped")

        restarted = broker_cli("start", "--jars", str(jar_cache), home=home)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert "running" in broker_cli("status", home=home).stdout
        with KafkaLog(bootstrap) as log, log.consumer() as consumer:
            consumer.assign([TopicPartition("lifecycle", p) for p in range(2)])
            consumer.seek_to_beginning()
            received: list[tuple[bytes | None, bytes]] = []
            for _ in range(30):
                received += [(m.key, m.value) for m in consumer.poll(100, timeout=1.0)]
                if len(received) >= len(sent):
                    break
            assert log.describe_topic("lifecycle").partitions == 2
        assert sorted(received) == sorted(sent)
    finally:
        broker_cli("stop", home=home)
    assert not LocalKafkaBroker(home).status().running


def test_start_refuses_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        broker = LocalKafkaBroker(tmp_path, port=busy.getsockname()[1])
        with pytest.raises(BrokerError, match="in use"):
            broker.start()


def test_failed_start_reports_the_broker_log(tmp_path: Path, jar_cache: Path) -> None:
    broker = LocalKafkaBroker(tmp_path, port=free_port(), jar_cache=jar_cache, heap="1k")
    with pytest.raises(BrokerError, match="(?i)heap"):
        broker.start(timeout=30)
    assert not broker.status().running
