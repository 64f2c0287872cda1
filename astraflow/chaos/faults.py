"""Fault injection into a live ``astraflow run``: ``kill -9`` its components, restart its broker.

Used by the reliability test (``tests/e2e/test_faults.py``) and the chaos benchmark
(``benchmarks/chaos.py``). It touches the run only through what the run exposes to anyone:

- ``run_dir/pids/<child>.pid``: the launcher's pid file of each child (rewritten at a restart);
- ``run_dir/metrics.jsonl``: the metrics the launcher's monitor appends, read for the trainer's
  ``train.version`` and the launcher's ``launcher.restarts``.

So it synchronises on observable state: a kill happens once the run published the version the
schedule names, and counts as survived once the launcher started a new process for that child
(a new pid in its pid file) and the run then published another version.

Broker faults act on the brokers given to ``run_schedule``: one node (``LocalKafkaBroker``) or the
nodes of a ``LocalKafkaCluster``. ``broker`` stops a node (a controlled shutdown) and starts it
again on the same ports and data; ``broker-kill`` SIGKILLs a node and leaves it dead for the rest
of the run (with three replicas and ``min.insync.replicas`` 2 the cluster goes on with two).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from astraflow.core.errors import AstraFlowError
from astraflow.core.metric_names import EVAL_ACCURACY, LAUNCHER_RESTARTS, TRAIN_VERSION
from astraflow.core.rundir import RunDir

logger = logging.getLogger(__name__)

KINDS = ("train", "stream", "rollout", "feed", "evaluate")
"""The component kinds of a single-policy run, as named by the launcher's children."""


class FaultError(AstraFlowError):
    """The run did not reach the state a fault schedule waits for in time (or it ended)."""


BROKER_FAULTS = ("broker", "broker-kill")
"""Schedule entries that act on a broker node: restart it, or kill it for good."""


class Broker(Protocol):
    """What a broker fault needs: ``LocalKafkaBroker``."""

    @property
    def bootstrap(self) -> str: ...

    def stop(self, timeout: float = 30.0) -> bool: ...

    def start(self, timeout: float = 60.0) -> None: ...

    def kill(self) -> bool: ...


@dataclass(frozen=True)
class Fault:
    """One injected fault, as the report lists it."""

    kind: str
    """A component kind of ``KINDS``, or one of ``BROKER_FAULTS``."""
    target: str
    """The child name (``rollout-0`` ...) or the broker's bootstrap."""
    version: int
    """The run's version when the fault was injected."""
    at_s: float
    """Seconds since the injector started."""
    recovered_s: float
    """Seconds until the launcher started the replacement (the broker: served again)."""


class RunProbe:
    """Reads a live run's pid files and the new lines of its ``metrics.jsonl``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.version = -1
        self.restarts: Counter[str] = Counter()
        """Restarts per component kind, from ``launcher.restarts``."""
        self.accuracy: dict[int, float] = {}
        """Held-out accuracy by version, from ``eval.accuracy`` (the first policy's, or the only one's)."""
        self._offset = 0

    def pids(self) -> dict[str, int]:
        """Child name → pid of every child the launcher runs now."""
        found = {}
        for path in (self.run_dir / "pids").glob("*.pid"):
            try:
                found[path.stem] = int(path.read_text())
            except (FileNotFoundError, ValueError):
                continue  # rewritten or removed just now
        return found

    def refresh(self) -> None:
        """Take in the metrics appended since the last call (a partial last line waits for the next)."""
        path = RunDir(self.run_dir).metrics
        if not path.exists():
            return
        with path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            row = json.loads(line)
            if row["name"] == TRAIN_VERSION:
                self.version = max(self.version, int(row["value"]))
            elif row["name"] == EVAL_ACCURACY:
                self.accuracy.setdefault(int(row["step"]), float(row["value"]))
            elif row["name"] == LAUNCHER_RESTARTS:
                self.restarts[row["labels"]["kind"]] += 1


class FaultInjector:
    """Injects faults into the run in ``run_dir`` that ``launcher`` (the ``astraflow run`` process) drives."""

    def __init__(
        self, run_dir: Path, launcher: subprocess.Popen, seed: int = 0, timeout_s: float = 120.0, poll_s: float = 0.2
    ) -> None:
        self.probe = RunProbe(run_dir)
        self.launcher = launcher
        self.rng = random.Random(seed)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.started = time.monotonic()
        self.faults: list[Fault] = []

    def wait_for(self, what: str, ready: Callable[[], bool], timeout_s: float | None = None) -> None:
        """Poll the run until ``ready()``; ``FaultError`` when the run ended or ``timeout_s`` passed."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            self.probe.refresh()
            if ready():
                return
            if self.launcher.poll() is not None:
                raise FaultError(f"the run ended (exit {self.launcher.returncode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise FaultError(
                    f"timed out waiting for {what} (version {self.probe.version}, pids {self.probe.pids()})"
                )
            time.sleep(self.poll_s)

    def wait_for_version(self, version: int) -> None:
        self.wait_for(f"version {version}", lambda: self.probe.version >= version)

    def kill(self, kind: str) -> Fault:
        """SIGKILL one running child of ``kind`` (a random one of several) and wait for its replacement."""
        self.wait_for(f"a running {kind} child", lambda: any(_kind(name) == kind for name in self.probe.pids()))
        name, pid = self.rng.choice(sorted((n, p) for n, p in self.probe.pids().items() if _kind(n) == kind))
        version, at = self.probe.version, time.monotonic()
        logger.info("kill -9 %s (pid %d) at version %d", name, pid, version)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            logger.info("%s (pid %d) had exited already; the launcher restarts it anyway", name, pid)
        self.wait_for(f"a new {name} after killing pid {pid}", lambda: self.probe.pids().get(name, pid) != pid)
        return self._record(Fault(kind, name, version, at - self.started, time.monotonic() - at))

    def restart_broker(self, broker: Broker, start_timeout_s: float = 120.0) -> Fault:
        """Stop the broker node (a controlled shutdown) and start it again on the same ports and data."""
        version, at = self.probe.version, time.monotonic()
        logger.info("restarting the broker at %s at version %d", broker.bootstrap, version)
        broker.stop()
        broker.start(timeout=start_timeout_s)
        return self._record(Fault("broker", broker.bootstrap, version, at - self.started, time.monotonic() - at))

    def kill_broker(self, broker: Broker) -> Fault:
        """SIGKILL the broker node and leave it dead."""
        version, at = self.probe.version, time.monotonic()
        logger.info("kill -9 the broker at %s for good at version %d", broker.bootstrap, version)
        if not broker.kill():
            raise FaultError(f"the broker at {broker.bootstrap} did not run when it was to be killed")
        return self._record(Fault("broker-kill", broker.bootstrap, version, at - self.started, 0.0))

    def run_schedule(
        self, schedule: list[str], first_version: int, gaps: tuple[int, int], brokers: list[Broker] = ()
    ) -> None:
        """Inject ``schedule`` (kinds, or ``BROKER_FAULTS``) in order: the first once ``first_version``
        is published, each next one a random ``gaps`` (inclusive) versions after the version reached
        once the previous fault was recovered from. A broker fault picks one of the ``brokers`` still
        alive at random."""
        alive = list(brokers)
        target = first_version
        for kind in schedule:
            self.wait_for_version(target)
            if kind in BROKER_FAULTS:
                if not alive or (kind == "broker-kill" and len(alive) < 2):
                    raise FaultError(f"the schedule has a {kind}, but {len(alive)} broker node(s) are alive")
                node = self.rng.choice(alive)
                if kind == "broker":
                    self.restart_broker(node)
                else:
                    self.kill_broker(node)
                    alive.remove(node)
            else:
                self.kill(kind)
            target = max(target, self.probe.version) + self.rng.randint(*gaps)

    def _record(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def report(self) -> list[dict]:
        return [asdict(fault) for fault in self.faults]


def _kind(child: str) -> str:
    """``rollout-3`` → ``rollout``; ``train`` → ``train``."""
    return child.split("-", 1)[0]


def schedule(
    kills_per_kind: int, broker_restarts: int, seed: int, kinds: tuple[str, ...] = KINDS, broker_kills: int = 0
) -> list[str]:
    """``kills_per_kind`` rounds of kills, each killing every kind once in a shuffled order, with the
    broker faults spread evenly between them (never first or last): the restarts first, then the
    kills for good.

    Rounds, not one shuffle of all kills: a shuffle can kill one component three or four times in a
    row, which the launcher rightly takes for a crash loop (``MAX_RESTARTS`` exits within
    ``RESTART_WINDOW_S``) and stops the run; in rounds every other kind is killed in between, and a
    round never starts with the kind the last one ended with."""
    rng = random.Random(seed)
    kills: list[str] = []
    for _ in range(kills_per_kind):
        order = list(kinds)
        rng.shuffle(order)
        if kills and len(order) > 1 and order[0] == kills[-1]:
            order[0], order[-1] = order[-1], order[0]
        kills += order
    faults = ["broker"] * broker_restarts + ["broker-kill"] * broker_kills
    for index in range(len(faults), 0, -1):
        kills.insert(index * len(kills) // (len(faults) + 1), faults[index - 1])
    return kills
