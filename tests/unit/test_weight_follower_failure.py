"""A weight follower whose thread fails says so to its owner, and the owner's process exits to be restarted.

The faults are injected into a real embedded log (``watched_log.py``): its weights reads raise, as a
failing disk or a lost broker would make them.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from astraflow.core.errors import LogError, WeightFollowerError
from astraflow.infra.launch.launcher import Child
from astraflow.log import open_log
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.weights.follow import WeightFollower
from astraflow.weights.publish import WeightPublisher
from tests.unit.test_weight_delta import random_state
from tests.unit.watched_log import INJECTED, WatchedLog

TOPIC = "r.weights.main"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"
ERRORS = [OSError(5, "disk I/O error"), LogError("consuming r.weights.main failed: broker gone"), MemoryError("chunk")]


def open_weights_log(tmp_path: Path):
    log = open_log("embedded", path=tmp_path / "log.sqlite")
    RunTopics("r", "math", ("main",)).ensure(log, partitions=1)
    return log


def cause(error: BaseException) -> str:
    """What ``WeightFollowerError`` says of ``error``."""
    return re.escape(f"weights topic {TOPIC} stopped on {type(error).__name__}: {error}")


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_every_entry_point_raises_the_cause_once_the_thread_failed(tmp_path: Path, error: BaseException) -> None:
    with open_weights_log(tmp_path) as real, real.producer() as producer:
        WeightPublisher(producer, Codec(), TOPIC, "main", log=real).publish(random_state(0), 0)
        log = WatchedLog(real, error)
        follower = WeightFollower(log, TOPIC, payload=True).start()
        try:
            assert follower.wait_caught_up(timeout=30) and follower.latest_version == 0
            log.fail.set()  # the thread's next poll raises, while this thread waits for version 1
            started = time.monotonic()
            with pytest.raises(WeightFollowerError, match=cause(error)) as raised:
                follower.wait_for(1, timeout=20)
            assert time.monotonic() - started < 10  # woken by the failure, not by the timeout
            assert raised.value.__cause__ is error
            for entry in (
                lambda: follower.latest_version,
                lambda: follower.newest_version,
                follower.take,
                lambda: follower.wait_for(0, timeout=0),
                lambda: follower.wait_caught_up(timeout=0),
            ):
                with pytest.raises(WeightFollowerError, match=cause(error)):
                    entry()
        finally:
            follower.close()


@pytest.mark.parametrize("payload", [True, False])
def test_a_follower_that_fails_while_catching_up_says_so_at_once(tmp_path: Path, payload: bool) -> None:
    with open_weights_log(tmp_path) as real, real.producer() as producer:
        publisher = WeightPublisher(producer, Codec(), TOPIC, "main", log=real)
        for version in range(3):
            publisher.publish(random_state(version), version)
        log = WatchedLog(real)
        log.fail.set()
        follower = WeightFollower(log, TOPIC, payload=payload).start()
        try:
            started = time.monotonic()
            with pytest.raises(WeightFollowerError, match=cause(INJECTED)):
                follower.wait_caught_up(timeout=20)
            assert time.monotonic() - started < 10
        finally:
            follower.close()


def test_a_component_whose_follower_fails_exits_with_the_cause_and_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The feeder, run as the launcher runs it, on a log whose weights reads fail: it exits non-zero,
    its output names the cause, and the launcher's ``Child`` starts it again."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    argv = [sys.executable, "-m", "tests.unit.watched_log", "feed", str(EXAMPLE), "--run-dir", str(tmp_path)]
    child = Child("feed", argv, tmp_path, clock=lambda: 0.0)
    try:
        code = child.process.wait(timeout=120)
        output = (tmp_path / "logs" / "feed.out").read_text()
        assert code != 0, output
        assert f"weights topic math.weights.main stopped on OSError: {INJECTED}" in output
        first = child.process.pid
        assert child.check() == f"feed exited with {code}; restarted" and child.process.pid != first
        assert child.process.wait(timeout=120) == code
    finally:
        child.process.kill()
        child.process.wait()
