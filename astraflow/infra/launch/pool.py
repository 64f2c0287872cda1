"""The rollout producers of ``astraflow run``: started, stopped and paid for.

``ProducerPool`` owns the ``rollout-N`` children of the launcher. ``resize(n)`` starts new
producers (each joins the task group after catching up on weights), or stops the newest ones:
it SIGTERMs them (a producer finishes its batch, commits and leaves the group: rollout.py) and
moves them out of the supervised list first, so the supervisor never restarts a producer the pool
stopped. ``reap`` collects the stopped ones once they exited. ``producer_seconds`` is the sum of
every producer's wall time from its start to its exit: what the pool cost, the quantity
autoscaling saves.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger(__name__)


class Process(Protocol):
    """What the pool needs of a launcher child."""

    name: str
    process: subprocess.Popen

    def terminate(self) -> None: ...


class ProducerPool:
    """Resizes the producers within ``[minimum, maximum]``; ``children`` is the supervisor's list."""

    def __init__(
        self,
        start: Callable[[str], Process],
        children: list,
        initial: int,
        minimum: int,
        maximum: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._start = start
        self.children = children
        self.minimum = minimum
        self.maximum = maximum
        self.clock = clock
        self.members: list[Process] = []
        self.retiring: list[Process] = []
        self.finished_seconds = 0.0
        self._started: dict[str, float] = {}
        self._next = 0
        self.resize(initial)

    @property
    def size(self) -> int:
        return len(self.members)

    def resize(self, desired: int | None) -> str | None:
        """Start or stop producers until ``desired`` (clamped to the bounds) run; a note when it changed."""
        self.reap()
        if desired is None:
            return None
        target = max(self.minimum, min(self.maximum, desired))
        before = self.size
        while self.size < target:
            name = f"rollout-{self._next}"
            self._next += 1
            child = self._start(name)
            self._started[name] = self.clock()
            self.members.append(child)
            self.children.append(child)
        while self.size > target:
            child = self.members.pop()
            self.children.remove(child)
            child.terminate()
            self.retiring.append(child)
        if self.size == before:
            return None
        logger.info("rollout producers %d -> %d", before, self.size)
        return f"rollout producers {before} -> {self.size}"

    def reap(self) -> None:
        """Account for the stopped producers that have exited."""
        for child in [c for c in self.retiring if c.process.poll() is not None]:
            self.retiring.remove(child)
            self.finished_seconds += self.clock() - self._started.pop(child.name)

    def producer_seconds(self) -> float:
        """Wall seconds of every producer so far, running ones counted up to now."""
        self.reap()
        now = self.clock()
        return self.finished_seconds + sum(now - started for started in self._started.values())
