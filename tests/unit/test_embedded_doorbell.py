"""A reader of the embedded log waiting for records is woken by the writer's ring, not by its timer.

Each test pushes the timer an hour away (``POLL_WAIT_S``), so a record reaches a waiting reader
only if the writer's commit rang it: without the doorbell these polls return empty at their
timeout."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from astraflow.log import TopicPartition, TopicSpec
from astraflow.log.embedded import consumer as consumer_module
from astraflow.log.embedded.doorbell import SUPPORTED, Doorbell, bells_dir, ring
from astraflow.log.embedded.log import EmbeddedLog

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="abstract Unix sockets are Linux's")

TIMEOUT_S = 60.0


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EmbeddedLog:
    monkeypatch.setattr(consumer_module, "POLL_WAIT_S", 3600.0)
    monkeypatch.setattr(consumer_module, "POLL_WAIT_MAX_S", 3600.0)
    with EmbeddedLog(tmp_path / "log.sqlite") as opened:
        opened.create_topic(TopicSpec("t", partitions=2))
        opened.create_topic(TopicSpec("other"))
        yield opened


def registrations(log: EmbeddedLog, topic: str) -> list[str]:
    directory = bells_dir(log.path) / topic
    return sorted(os.listdir(directory)) if directory.is_dir() else []


def poll_in_thread(log: EmbeddedLog, group_id: str | None = None) -> tuple[threading.Thread, dict]:
    """A consumer of ``t`` polling once in a thread, once it is registered; its result in the dict."""
    result: dict = {}
    consumer = log.consumer(group_id=group_id)
    if group_id:
        consumer.subscribe(["t"])
    else:
        consumer.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    assert consumer.poll(timeout=0.05) == []  # registers: its first empty poll reads once more, then waits

    def run() -> None:
        started = time.monotonic()
        result["messages"] = consumer.poll(timeout=TIMEOUT_S)
        result["seconds"] = time.monotonic() - started
        consumer.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_flush_wakes_the_waiting_reader(log: EmbeddedLog) -> None:
    thread, result = poll_in_thread(log)
    assert len(registrations(log, "t")) == 1
    with log.producer() as producer:
        producer.send("t", b"a", partition=1)
        producer.flush()
    thread.join(TIMEOUT_S + 5)
    assert [m.value for m in result["messages"]] == [b"a"]
    assert result["seconds"] < TIMEOUT_S / 2  # woken, not timed out
    assert registrations(log, "t") == []  # closing the consumer removed its registration


def test_a_transaction_wakes_a_group_member_on_its_commit_only(log: EmbeddedLog) -> None:
    thread, result = poll_in_thread(log, group_id="g")
    producer = log.transactional_producer("tx")
    producer.begin()
    producer.send("t", b"in a transaction", partition=0)
    thread.join(0.2)
    assert thread.is_alive()  # nothing visible, nothing rung
    producer.commit()
    thread.join(TIMEOUT_S + 5)
    producer.close()
    assert [m.value for m in result["messages"]] == [b"in a transaction"]
    assert result["seconds"] < TIMEOUT_S / 2


def test_a_write_to_another_topic_rings_no_one(log: EmbeddedLog) -> None:
    bell = Doorbell(log.path)
    bell.register(["t"])
    with log.producer() as producer:
        producer.send("other", b"x")
        producer.flush()
    assert bell.wait(0.2) is False
    with log.producer() as producer:
        producer.send("t", b"x")
        producer.flush()
    assert bell.wait(TIMEOUT_S) is True
    assert bell.wait(0) is False  # every queued ring was drained
    bell.close()


def _register_and_die(path: str) -> None:
    Doorbell(Path(path)).register(["t"])
    os._exit(0)  # no close: the registration outlives its reader


def test_a_ring_removes_the_registration_of_a_reader_that_died(log: EmbeddedLog) -> None:
    child = multiprocessing.get_context("spawn").Process(target=_register_and_die, args=(str(log.path),))
    child.start()
    child.join(TIMEOUT_S)
    assert child.exitcode == 0
    assert len(registrations(log, "t")) == 1
    ring(log.path, ["t"])
    assert registrations(log, "t") == []


def test_topic_names_that_are_no_file_names_get_a_directory_of_their_own(log: EmbeddedLog) -> None:
    bell = Doorbell(log.path)
    bell.register(["..", "a/b"])
    ring(log.path, ["a/b"])
    assert bell.wait(TIMEOUT_S) is True
    ring(log.path, [".."])
    assert bell.wait(TIMEOUT_S) is True
    assert not (bells_dir(log.path).parent / "a").exists()
    bell.close()
