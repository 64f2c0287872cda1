"""Cross-region: a Kafka client in a network namespace reaches the real broker over a slow link.

The region (``astraflow.chaos.netns.RemoteRegion``) is a namespace behind a veth pair capped by
``tc tbf`` at ``RATE_MBIT`` each way, with ``DELAY_MS`` added each way by the delay proxy in front
of the broker. The same client runs in the region and on the host, side by side; the region's
produce round trips must carry the added latency (two delays), its bulk send must respect the
cap, and every record must arrive. Skipped only where namespaces cannot be created (not root, no
iproute2), failed instead with ``CI=true``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator

import pytest

from astraflow.chaos.netns import RemoteRegion
from astraflow.log import TopicSpec, open_log
from tests._broker import unavailable

pytestmark = pytest.mark.kafka
RATE_MBIT = 8.0
DELAY_MS = 150.0
ACKS = 6
BULK_BYTES = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def region() -> Iterator[RemoteRegion]:
    reason = RemoteRegion.available()
    if reason is not None:
        unavailable(reason)
    with RemoteRegion("test", rate_mbit=RATE_MBIT, delay_ms=DELAY_MS) as created:
        yield created


def run_client(argv_prefix: list[str], bootstrap: str, topic: str) -> dict:
    argv = [
        *argv_prefix,
        sys.executable,
        "-m",
        "tests.integration.region_client",
        bootstrap,
        topic,
        str(ACKS),
        str(BULK_BYTES),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_remote_producer_sees_the_delay_and_the_cap(kafka_bootstrap: str, region: RemoteRegion, unique: str) -> None:
    remote_topic, local_topic = f"region.remote.{unique}", f"region.local.{unique}"
    with open_log("kafka", bootstrap=kafka_bootstrap) as log:
        for topic in (remote_topic, local_topic):
            log.create_topic(TopicSpec(topic, partitions=1))
    address = region.expose(kafka_bootstrap)

    remote = run_client(region.argv([]), address, remote_topic)
    local = run_client([], kafka_bootstrap, local_topic)

    added_round_trip = 2 * DELAY_MS / 1000
    remote_rtt, local_rtt = statistics.median(remote["round_trips"]), statistics.median(local["round_trips"])
    assert remote_rtt >= added_round_trip, (
        f"region round trip {remote_rtt:.3f} s, expected at least {added_round_trip:.3f} s"
    )
    assert remote_rtt - local_rtt == pytest.approx(added_round_trip, abs=0.15), (remote_rtt, local_rtt)
    cap_seconds = remote["bulk_bytes"] * 8 / (RATE_MBIT * 1e6)
    assert remote["bulk_seconds"] >= 0.8 * cap_seconds, (
        f"{remote['bulk_bytes']} B in {remote['bulk_seconds']:.2f} s beat the {RATE_MBIT} Mbit/s cap"
    )
    assert local["bulk_seconds"] < remote["bulk_seconds"]
    expected = {f"ack-{i}" for i in range(ACKS)} | {"warm"}
    for result in (remote, local):
        assert expected <= set(result["read_back"]) and len(result["read_back"]) == len(set(result["read_back"]))
