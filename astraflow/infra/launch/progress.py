"""Progress of ``astraflow run`` off a terminal: one plain line every ``LINE_EVERY_S`` seconds.

A live dashboard redraws itself in place, which a pipe, a log file or a CI console cannot show;
there a run would say nothing between its warm-up and its final summary. ``ProgressLines`` prints
instead, from the same ``RunMonitor`` state the dashboard reads, one line per interval::

    [  42 s] main: v17  heldout 0.620 (v15)  traj/s 85  trainer wait 0.41 s  lag 3

per policy: its trainer's weight version, the newest held-out score and the version it scored,
trajectories written per second over the interval (end offsets of its trajectories topic), the
trainer's wait for samples before its last step (``train.wait_seconds``) and the rollout
producers' newest version lag (``rollout.version_lag``); ``-`` where nothing was reported yet.
The monitor's notes (a restarted child, why the run stops) are printed once each as they appear.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from rich.console import Console

from astraflow.core.metric_names import ROLLOUT_VERSION_LAG, TRAIN_WAIT_SECONDS
from astraflow.runtime.topics import RunTopics


class MonitorState(Protocol):
    """What the lines read of a run's monitor (``monitor.RunMonitor`` is one): the monitor prints
    through them, so they know its state by this shape, not by its class."""

    topics: RunTopics
    started: float
    """``time.monotonic()`` when the monitor started."""
    policies: Sequence[str]
    policy_accuracy: dict[str, dict[int, float]]
    """Held-out accuracy by policy and version."""
    policy_versions: dict[str, int]
    policy_latest: dict[str, dict[str, float]]
    """The newest value of each metric, by policy."""
    notes: Iterable[str]
    ends: tuple[float, dict[str, int]] | None
    """The newest end-offset sample: its monotonic time and the end offset of each topic."""


LINE_EVERY_S = 10.0


def progress_line(monitor: MonitorState, elapsed_s: float, trajectories_per_s: dict[str, float]) -> str:
    """One line of the monitor's state, ``elapsed_s`` into the run; ``trajectories_per_s`` by policy."""
    parts = []
    for policy in monitor.policies:
        accuracy = monitor.policy_accuracy[policy]
        latest = monitor.policy_latest[policy]
        scored = max(accuracy) if accuracy else None
        wait = latest.get(TRAIN_WAIT_SECONDS)
        lag = latest.get(ROLLOUT_VERSION_LAG)
        parts.append(
            f"{policy}: v{monitor.policy_versions[policy]}"
            f"  heldout {'-' if scored is None else f'{accuracy[scored]:.3f} (v{scored})'}"
            f"  traj/s {trajectories_per_s.get(policy, 0.0):.0f}"
            f"  trainer wait {'-' if wait is None else f'{wait:.2f} s'}"
            f"  lag {'-' if lag is None else f'{lag:.0f}'}"
        )
    return f"[{elapsed_s:4.0f} s] " + "  |  ".join(parts)


class ProgressLines:
    """The monitor's view off a terminal: ``refresh`` prints a line when ``every_s`` has passed.

    Time is the monitor's: the moment of its newest end-offset sample (``RunMonitor.ends``), so
    the lines follow the refreshes and a test can drive them without a clock.
    """

    def __init__(self, monitor: MonitorState, console: Console, every_s: float = LINE_EVERY_S) -> None:
        self.monitor = monitor
        self.console = console
        self.every_s = every_s
        self._printed_at = monitor.started
        self._previous: tuple[float, dict[str, int]] | None = None
        """The end-offset sample the last line's rates started from."""
        self._notes: set[str] = set()

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: object) -> None:
        ends = self.monitor.ends
        if ends is not None and ends[0] > self._printed_at:
            self._print_line(ends)

    def refresh(self, children: list) -> None:
        m = self.monitor
        for note in m.notes:
            if note not in self._notes:
                self._print(f"[{self._elapsed():4.0f} s] {note}")
        self._notes = set(m.notes)
        ends = m.ends
        if ends is None:
            return
        if self._previous is None:
            self._previous = ends
        if ends[0] - self._printed_at >= self.every_s:
            self._print_line(ends)

    def _print_line(self, ends: tuple[float, dict[str, int]]) -> None:
        m = self.monitor
        rates: dict[str, float] = {}
        if self._previous is not None and ends[0] > self._previous[0]:
            seconds = ends[0] - self._previous[0]
            for policy in m.policies:
                topic = m.topics.trajectories(policy)
                rates[policy] = (ends[1][topic] - self._previous[1][topic]) / seconds
        self._print(progress_line(m, ends[0] - m.started, rates))
        self._printed_at, self._previous = ends[0], ends

    def _elapsed(self) -> float:
        ends = self.monitor.ends
        return (ends[0] if ends is not None else self._printed_at) - self.monitor.started

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
