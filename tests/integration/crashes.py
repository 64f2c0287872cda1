"""Crashes of a component inside the test process, and reading what it left visible.

A component "dies" where ``Death`` says: the armed call raises ``Killed``, which no ``except
Exception`` of the component catches, so it unwinds like a process that stopped there. What a dead
process would not do, the dead component does not either: a transactional producer that died in
its ``commit`` never closes, so on Kafka its transaction stays open on the broker until a newer
producer with its id ends it, exactly as after a ``kill -9``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from threading import Thread
from typing import Any

import pytest

from astraflow.config import parse_config
from astraflow.log import Log, TopicPartition
from astraflow.runtime.context import ComponentContext


class Killed(BaseException):
    """The process died here."""


class Death:
    """Kills a component once: at the armed call that comes after ``after`` calls of that method."""

    def __init__(self) -> None:
        self.happened = False
        self.corpses: list[Any] = []
        """Transactional producers that died in their commit: kept, never closed."""

    def arm(self, target: Any, method: str, after: int = 0) -> None:
        real = getattr(target, method)
        calls = itertools.count()

        def dying(*args: Any, **kwargs: Any) -> Any:
            if self.happened or next(calls) < after:
                return real(*args, **kwargs)
            self.happened = True
            if hasattr(target, "send_offsets"):
                target.close = lambda: None  # a dead process aborts nothing
                self.corpses.append(target)
            raise Killed(f"killed in {type(target).__name__}.{method}")

        setattr(target, method, dying)


class DyingLog:
    """``log``, with the commit of each consumer and transactional producer it makes armed by ``death``:
    a transaction's commit, and a consumer's own commit, where a stage without transactions committed
    its input offsets after flushing its outputs."""

    def __init__(self, log: Log, death: Death, after: int = 0) -> None:
        self._log = log
        self._death = death
        self._after = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def consumer(self, *args: Any, **kwargs: Any) -> Any:
        consumer = self._log.consumer(*args, **kwargs)
        self._death.arm(consumer, "commit", self._after)
        return consumer

    def transactional_producer(self, transactional_id: str, timeout_s: float | None = None) -> Any:
        producer = self._log.transactional_producer(transactional_id, timeout_s)
        self._death.arm(producer, "commit", self._after)
        return producer


def context(log_target: dict[str, str], run_dir: Path, component: str, raw: dict) -> ComponentContext:
    """A component context of run ``raw["run"]`` on the test's log, with two partitions per topic."""
    log = {"partitions": 2, **log_target}
    log.pop("path", None)  # the embedded log lives in the run directory
    return ComponentContext(parse_config({**raw, "log": log}), run_dir, component)


@contextmanager
def running(body: Callable[[], None]) -> Iterator[list[BaseException]]:
    """Run ``body`` in a thread for the block; what it raised is in the yielded list after the block."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as exc:  # Killed included: the test looks at it
            raised.append(exc)

    thread = Thread(target=run, daemon=True)
    thread.start()
    try:
        yield raised
    finally:
        thread.join(timeout=60)
        assert not thread.is_alive(), "the component did not stop"


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout:.0f} s: {what}")
        time.sleep(0.05)


def read_all(ctx: ComponentContext, topic: str) -> list[Any]:
    """Every committed record of ``topic``, decoded: each partition is read until the reader's position
    reaches the end offset it has now (positions move past transaction markers and aborted records
    too), so nothing is waited out. No transaction may be open on the topic."""
    ends = ctx.log.end_offsets(topic)
    partitions = [TopicPartition(topic, p) for p in sorted(ends)]
    records: list[Any] = []
    with ctx.log.consumer() as reader:
        reader.assign(partitions)
        reader.seek_to_beginning()
        deadline = time.monotonic() + 60
        while any(reader.position(tp) < ends[tp.partition] for tp in partitions):
            if time.monotonic() > deadline:
                pytest.fail(f"{topic} not read up to {ends} within 60 s")
            records += [ctx.codec.decode(message.value) for message in reader.poll(max_records=500, timeout=0.2)]
    return records


def committed(ctx: ComponentContext, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic``, by partition."""
    offsets = ctx.log.group_offsets().get(group, {})
    return {tp.partition: offset for tp, offset in offsets.items() if tp.topic == topic}
