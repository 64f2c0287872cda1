"""A Kafka ``send_offsets`` that never returns abandons its producer, and the stage exits (issue #21).

librdkafka's ``send_offsets_to_transaction`` can wait for ever past its timeout for a group
coordinator it lost (librdkafka #5456, #5511); here it hung the rollout producer after the broker
of the Kafka fault test restarted. That hang cannot be produced on demand, so ``Hanging`` wraps a
real transactional producer on the session's broker and makes only that one call block until
the test ends; everything else (``init_transactions``, the transaction, the fencing by a newer
producer) is the real client on the real broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from astraflow.core.errors import LogError
from astraflow.log import TopicPartition, open_log
from astraflow.log.kafka import stuck_clients
from astraflow.log.kafka import transactions as kt
from tests.integration.test_log_conformance import REPO_ROOT, make_topic
from tests.integration.test_log_transactions import fill, read_through


class Hanging:
    """A confluent-kafka producer whose ``send_offsets_to_transaction`` blocks until ``release``."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.release = threading.Event()
        self.entered = threading.Event()

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.entered.set()
        self.release.wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


@pytest.fixture
def no_stuck_clients() -> Iterator[None]:
    yield
    stuck_clients._STUCK.clear()


def test_a_send_offsets_that_never_returns_abandons_the_producer(
    kafka_bootstrap: str, unique: str, monkeypatch: pytest.MonkeyPatch, no_stuck_clients: None
) -> None:
    monkeypatch.setattr(kt, "SEND_OFFSETS_TIMEOUT_S", 0.5)
    monkeypatch.setattr(kt, "GRACE_S", 0.5)
    with open_log(backend="kafka", bootstrap=kafka_bootstrap) as log:
        source, sink = make_topic(log, unique, "stuck-in"), make_topic(log, unique, "stuck-out")
        tid, tp = f"tx-stuck-{unique}", TopicPartition(source, 0)
        fill(log, source, 2)
        with log.consumer(f"tx-stuck-{unique}") as consumer:
            consumer.assign([tp])
            producer = log.transactional_producer(tid)
            hanging = Hanging(producer._producer)
            producer._producer = hanging
            producer.begin()
            producer.send(sink, b"abandoned")
            started = time.monotonic()
            with pytest.raises(LogError, match="did not return within 1 s.*abandoned"):
                producer.send_offsets(consumer, {tp: 1})
            assert hanging.entered.is_set()
            assert time.monotonic() - started < 10  # the caller got its thread back; the call still hangs
            for call in (producer.begin, lambda: producer.send(sink, b"again"), producer.commit, producer.abort):
                with pytest.raises(LogError, match="abandoned"):
                    call()
            producer.close()  # does nothing: aborting would wait on the stuck client
            assert stuck_clients.stuck() == [f"transactional producer {tid!r} in send_offsets"]

            # what the restarted stage does: a new producer with the id ends the open transaction
            with log.transactional_producer(tid) as newer:
                newer.begin()
                newer.send(sink, b"newer")
                newer.send_offsets(consumer, {tp: 1})
                newer.commit()
            hanging.release.set()
        assert read_through(log, sink, b"newer") == [b"newer"]


def test_a_component_with_a_stuck_client_exits_without_closing_its_log(tmp_path) -> None:
    """``exit_if_stuck`` ends the process at once, status 1 (the launcher restarts it), and says why;
    without a stuck client the component closes normally."""
    script = (
        "import sys\n"
        "from astraflow.infra.launch.process import exit_if_stuck\n"
        "from astraflow.log.kafka import stuck_clients\n"
        "exit_if_stuck('rollout')\n"
        "print('closing normally', flush=True)\n"
        "stuck_clients.note(\"transactional producer 'r.p0' in send_offsets\", object())\n"
        "exit_if_stuck('rollout')\n"
        "print('closed the log', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 1, done
    assert done.stdout == "closing normally\n"
    assert "rollout exits without closing its log: transactional producer 'r.p0' in send_offsets never returned" in (
        done.stderr
    )
