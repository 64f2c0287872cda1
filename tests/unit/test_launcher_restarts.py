"""The launcher's supervision of a child: restarts, pid file, crash-loop limit (a fake clock, no sleeps)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from astraflow.chaos.faults import schedule
from astraflow.infra.launch.launcher import MAX_RESTARTS, RESTART_WINDOW_S, Child, CrashLoopError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def exiting_child(tmp_path: Path, clock: Clock, restarts: list[int]) -> Child:
    """A ``feed`` child whose process exits with status 3 at once."""
    argv = [sys.executable, "-c", "raise SystemExit(3)", "feed"]
    return Child("feed", argv, tmp_path, on_restart=lambda child, code: restarts.append(code), clock=clock)


def test_exits_are_restarted_with_a_new_pid_file_until_the_child_crash_loops(tmp_path: Path) -> None:
    clock, restarts = Clock(), []
    child = exiting_child(tmp_path, clock, restarts)
    for _ in range(MAX_RESTARTS):
        child.process.wait()
        assert child.check() == "feed exited with 3; restarted"
        assert int(child.pid_file.read_text()) == child.process.pid
    child.process.wait()
    with pytest.raises(CrashLoopError, match=f"feed exited with 3 after {MAX_RESTARTS} restarts"):
        child.check()
    assert restarts == [3] * MAX_RESTARTS and child.restarts == MAX_RESTARTS
    assert not child.pid_file.exists()


def test_exits_spread_over_time_are_restarted_without_limit(tmp_path: Path) -> None:
    clock, restarts = Clock(), []
    child = exiting_child(tmp_path, clock, restarts)
    for _ in range(3 * MAX_RESTARTS):
        child.process.wait()
        clock.now += RESTART_WINDOW_S / (MAX_RESTARTS - 0.5)
        assert child.check() is not None
    assert child.restarts == 3 * MAX_RESTARTS
    child.process.wait()
    child.wait(deadline=clock.now)
    assert not child.pid_file.exists()


def test_a_running_child_is_left_alone(tmp_path: Path) -> None:
    child = Child("train", [sys.executable, "-c", "import time; time.sleep(60)", "train"], tmp_path)
    try:
        assert child.check() is None and child.kind == "train"
        assert int(child.pid_file.read_text()) == child.process.pid
    finally:
        child.process.kill()
        child.process.wait()


@pytest.mark.parametrize(("kills", "restarts"), [(2, 0), (2, 1), (4, 2)])
def test_fault_schedules_kill_each_kind_and_spread_broker_restarts(kills: int, restarts: int) -> None:
    plan = schedule(kills, restarts, seed=7)
    assert len(plan) == 5 * kills + restarts and plan.count("broker") == restarts
    assert all(plan.count(kind) == kills for kind in ("train", "stream", "rollout", "feed", "evaluate"))
    assert plan[0] != "broker" and plan[-1] != "broker"
    assert plan == schedule(kills, restarts, seed=7)
    # in rounds: every kind once before any twice, and never one kind twice in a row, so no child is
    # killed MAX_RESTARTS + 1 times in a row, which the launcher would take for a crash loop
    only_kills = [kind for kind in plan if kind != "broker"]
    rounds = [only_kills[i : i + 5] for i in range(0, len(only_kills), 5)]
    assert all(sorted(one) == sorted(("train", "stream", "rollout", "feed", "evaluate")) for one in rounds)
    assert all(a != b for a, b in zip(only_kills, only_kills[1:]))


STOPPING = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[2])  # argv[1] is the kind, as the launcher reads it
def stop(signum, frame):
    others = sorted(p.name for p in out.parent.glob("*.exited"))
    out.with_suffix(".exited").write_text(",".join(others))
    raise SystemExit(0)
signal.signal(signal.SIGTERM, stop)
out.with_suffix(".ready").write_text("")
while True:
    time.sleep(1)
"""


def test_the_evaluators_are_stopped_after_every_other_component_exited(tmp_path: Path) -> None:
    """So that each scores the version its trainer ended with (``eval.final``)."""
    from astraflow.infra.launch.launcher import stop_children

    kinds = {"evaluate": "evaluate", "train": "train", "rollout-0": "rollout", "evaluate-system": "evaluate"}
    children = [
        Child(name, [sys.executable, "-c", STOPPING, kind, str(tmp_path / name)], tmp_path)
        for name, kind in kinds.items()
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"{name}.ready").exists() for name in kinds):  # each handles SIGTERM now
        assert time.monotonic() < deadline, "the children never started"
        children[0].process.poll()
    stop_children(children)
    seen = {name: (tmp_path / f"{name}.exited").read_text().split(",") for name in kinds}
    for evaluator in ("evaluate", "evaluate-system"):
        assert {"train.exited", "rollout-0.exited"} <= set(seen[evaluator]), seen
    assert "evaluate.exited" not in seen["train"] and "evaluate-system.exited" not in seen["train"], seen
