"""Client quotas per role on the secure broker: ``broker start --secure`` gives each role its own, and a
principal that floods the broker is slowed while another is not.

The broker is ``test_secure_broker``'s fixture (one start for this module); the quotas are read back
through the cluster (``astraflow broker quotas``: Kafka's admin API), not from what was asked for. The
flood is measured by the broker's own answer: a throttled client is told how long to hold off
(``throttle_cb``), which librdkafka then does.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from astraflow.infra.broker.acls import DEFAULT_QUOTAS
from astraflow.infra.broker.secure import SecurityFiles
from astraflow.runtime.topics import RunTopics
from tests.integration.test_broker_lifecycle import jar_cache  # noqa: F401  (the fixture)
from tests.integration.test_secure_broker import cli, secure_broker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.kafka

RUN = RunTopics("sec", "math", ("main",))
SLOW = 256 * 1024
"""The producer's quota in the flood: 256 KiB a second, so a few MiB at once exceed it at once."""


def described(home: Path, *args: str) -> dict[str, dict[str, float]]:
    """Every principal's quotas as ``astraflow broker quotas`` prints them (after ``args``' changes)."""
    done = cli("broker", "quotas", "--home", str(home), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return {
        principal: {key: float(value) for key, value in (item.split("=") for item in items)}
        for principal, *items in (line.split() for line in done.stdout.splitlines())
    }


def flood(bootstrap: str, files: SecurityFiles, principal: str, topic: str, mib: int = 4) -> tuple[list[float], float]:
    """Write ``mib`` MiB to ``topic`` as ``principal`` at once; the throttle times the broker sent
    (seconds) and the seconds it took. Stops at the first throttle: being told is the proof."""
    throttles: list[float] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **files.client_config(principal),
            "linger.ms": 5,
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    payload = b"x" * 100_000
    started = time.monotonic()
    for _ in range(mib * 1024 * 1024 // len(payload)):
        producer.produce(topic, payload, partition=0)
        producer.poll(0)
    while producer.flush(0.1) and not any(throttles) and time.monotonic() - started < 30:
        pass
    producer.purge()
    producer.flush(5)
    return [t for t in throttles if t > 0], time.monotonic() - started


def test_every_role_gets_its_own_quotas_at_start_and_admin_none(secure_broker) -> None:  # noqa: F811
    _, files = secure_broker
    quotas = described(files.directory.parent)
    assert quotas == DEFAULT_QUOTAS
    assert quotas["trainer"]["producer_byte_rate"] > quotas["producer"]["producer_byte_rate"]
    assert "admin" not in quotas


def test_a_changed_quota_outlives_a_start_and_throttles_a_flooding_producer_alone(secure_broker) -> None:  # noqa: F811
    bootstrap, files = secure_broker
    home = files.directory.parent
    try:
        changed = described(home, "--quota", f"producer:producer_byte_rate={SLOW}")
        assert changed["producer"]["producer_byte_rate"] == SLOW
        again = cli("broker", "start", "--secure", "--home", str(home))  # it runs: only the quotas are filled in
        assert again.returncode == 0, again.stdout + again.stderr
        quotas = described(home)
        assert quotas["producer"] == {**DEFAULT_QUOTAS["producer"], "producer_byte_rate": SLOW}
        assert quotas["trainer"] == DEFAULT_QUOTAS["trainer"]

        throttled, _ = flood(bootstrap, files, "producer", RUN.trajectories("main"))
        assert throttled, "the producer wrote 4 MiB at 256 KiB/s and the broker never throttled it"
        unthrottled, seconds = flood(bootstrap, files, "trainer", RUN.weights("main"))
        assert unthrottled == [] and seconds < 15, (unthrottled, seconds)
    finally:
        assert described(home, "--defaults") == DEFAULT_QUOTAS
