"""The autoscaling rule, its window and guards, and the launcher's producer pool; no clock, no sleep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astraflow.config import ScalerConfig
from astraflow.infra.launch.pool import ProducerPool
from astraflow.scaler.rule import AutoScaler, Observation, ScalerWindow, capped, decide
from astraflow.schemas.records import Metric

CFG = ScalerConfig(enabled=True, min_producers=1, max_producers=8, window_s=60, cooldown_s=30)
TRACE = Path(__file__).parent / "golden" / "scaler_trace.json"


def obs(w: float | None, g: int = 2, consumed: int = 100, entered: int = 100, busy: float | None = None) -> Observation:
    return Observation(g, 5 if w is not None else 0, w, consumed, entered, busy)


@pytest.mark.parametrize(
    ("observation", "previous", "desired", "rule"),
    [
        (obs(0.50, g=2), 2, 4, "up"),  # ⌈2 / 0.5⌉
        (obs(0.11, g=2), 2, 3, "up"),  # ⌈2 / 0.89⌉ = ⌈2.247⌉
        (obs(0.25, g=3), 3, 4, "up"),  # ⌈3 / 0.75⌉ = 4 exactly, no float round-up to 5
        (obs(0.90, g=2), 2, 8, "up"),  # ⌈20⌉, bounded to max 8
        (obs(1.00, g=2), 2, 8, "up"),  # never fed: the maximum
        (obs(0.30, g=1), 3, 3, "up"),  # ⌈1.43⌉ = 2, but a scale-up never lowers the decision
        (obs(0.10, g=2), 2, 2, "hold"),  # the band's edges hold
        (obs(0.05, g=2), 2, 2, "hold"),
        (obs(0.07, g=4), 4, 4, "hold"),
        (obs(0.01, g=4, consumed=50, entered=100), 4, 3, "down"),  # min(4, ⌈4·0.5·1.1⌉) = 3
        (obs(0.00, g=4, consumed=100, entered=100), 4, 4, "down"),  # balanced: ⌈4.4⌉ capped at G
        (obs(0.00, g=4, consumed=100, entered=100, busy=0.25), 4, 2, "down"),  # idle producers: ⌈4·0.25·1.1⌉ = 2
        (obs(0.00, g=2, consumed=10, entered=100), 2, 1, "down"),  # bounded to min 1
        (obs(0.00, g=1, consumed=100, entered=100, busy=0.1), 1, 1, "down"),
        (obs(0.00, g=3, consumed=100, entered=0), 3, 3, "hold"),  # nothing entered: no ratio
        (obs(None, g=3), 3, 3, "hold"),  # no trainer yet
        (obs(0.50, g=0), 2, 4, "up"),  # nobody reported: G = previous
    ],
)
def test_dead_band_rule(observation: Observation, previous: int, desired: int, rule: str) -> None:
    decision = decide(observation, previous, CFG)
    assert (decision.desired, decision.rule) == (desired, rule), decision.reason
    assert decision.reason


def test_bounds_are_capped_at_the_task_partitions() -> None:
    assert capped(CFG, 2).max_producers == 2 and capped(CFG, 16) is CFG
    assert capped(ScalerConfig(min_producers=3, max_producers=4), 2).min_producers == 2


def metric(name: str, value: float, step: int, ms: int, instance: str) -> Metric:
    return Metric(instance.split("-")[0], name, value, step, ms, {"instance": instance})


def trainer_steps(window: ScalerWindow, pairs: list[tuple[float, float]], start_ms: int, every_ms: int) -> int:
    for i, (wait, step) in enumerate(pairs):
        ms = start_ms + i * every_ms
        window.add_metric(metric("train.wait_seconds", wait, i, ms, "train-x"))
        window.add_metric(metric("train.step_seconds", step, i, ms, "train-x"))
    return start_ms + len(pairs) * every_ms


def test_window_wait_fraction_counts_only_steps_inside_it() -> None:
    window = ScalerWindow(window_s=10, batch_samples=64)
    end = trainer_steps(window, [(9.0, 1.0)] * 5 + [(1.0, 1.0)] * 5, start_ms=0, every_ms=2_000)
    window.add_offsets(end, entered_total=1000, consumed_total=900)  # a batch waits: the trainer is busy
    seen = window.observe(end)
    assert seen.steps == 5 and seen.wait_fraction == pytest.approx(0.5) and seen.waiting_s == 0


@pytest.mark.parametrize(
    ("backlog", "steps", "wait_fraction", "waiting_s"),
    [
        (10, [], 1.0, 10.0),  # started, never stepped, less than a batch waiting: starved
        (64, [], None, 0.0),  # a whole batch waits: computing (or stuck), not waiting
        (10, [(1.0, 1.0)], 6.0 / 7.0, 5.0),  # stepped 5 s ago after waiting 1 s, waiting since
    ],
)
def test_window_counts_the_wait_in_progress(
    backlog: int, steps: list[tuple[float, float]], wait_fraction: float | None, waiting_s: float
) -> None:
    window = ScalerWindow(window_s=10, batch_samples=64)
    window.add_metric(metric("train.version", 0, 0, 0, "train-x"))
    trainer_steps(window, steps, start_ms=15_000, every_ms=1)
    window.add_offsets(20_000, entered_total=100 + backlog, consumed_total=100)
    seen = window.observe(20_000)
    assert seen.waiting_s == pytest.approx(waiting_s)
    assert seen.wait_fraction == (None if wait_fraction is None else pytest.approx(wait_fraction))


def test_window_producers_busy_fraction_and_offsets() -> None:
    window = ScalerWindow(window_s=10, batch_samples=64)
    for ms, busy in ((0, 1.0), (5_000, 2.0), (10_000, 3.0), (15_000, 4.0)):
        window.add_metric(metric("rollout.busy_seconds", busy, 0, ms, "rollout-a"))
    window.add_metric(metric("rollout.samples_per_s", 3.0, 0, 1_000, "rollout-gone"))
    window.add_metric(metric("rollout.busy_seconds", 4.0, 0, 18_000, "rollout-new"))
    for ms, entered, consumed in ((0, 0, 0), (5_000, 50, 40), (10_000, 100, 80), (20_000, 200, 150)):
        window.add_offsets(ms, entered, consumed)
    seen = window.observe(20_000)
    assert seen.producers == 2  # rollout-gone last reported 19 s ago
    assert (seen.entered, seen.consumed) == (100, 70)  # since the sample at the window's start
    # rollout-a: 3.0 -> 4.0 over 10 s; rollout-new: joined 4 s before its first report at 18 s, alive 6 s
    assert seen.busy_fraction == pytest.approx((1.0 + 4.0) / (10.0 + 6.0))


def test_autoscaler_cools_down_after_start_and_every_change() -> None:
    scaler = AutoScaler(CFG, initial=2, started_ms=0)
    starved = obs(0.5, g=2)
    assert scaler.step(starved, 10_000).desired == 2  # cooling down after start
    assert scaler.step(starved, 30_000).desired == 4  # ⌈2/0.5⌉
    assert scaler.step(obs(0.5, g=4), 50_000).reason.startswith("cooling down")
    assert scaler.step(obs(0.5, g=4), 60_000).desired == 8


def test_autoscaler_initial_is_clamped() -> None:
    assert AutoScaler(CFG, initial=20, started_ms=0).desired == 8


RECORDED = json.loads(TRACE.read_text())["runs"]


@pytest.mark.parametrize("run", RECORDED, ids=[r["name"] for r in RECORDED])
def test_recorded_runs_replay_to_the_same_decisions(run: dict) -> None:
    """Every ``scaler.desired_producers`` record of two real ``astraflow run`` runs, with the inputs the
    live scaler saw (its labels), replayed through ``AutoScaler``: same desired count and rule each time."""
    scaler = AutoScaler(ScalerConfig.model_validate(run["scaler"]), run["initial"], run["decisions"][0]["started_ms"])
    for tick in run["decisions"]:
        seen = Observation(
            tick["producers"],
            tick["steps"],
            tick["wait_fraction"],
            tick["consumed"],
            tick["entered"],
            tick["busy"],
            tick["waiting_s"],
        )
        decision = scaler.step(seen, tick["at_ms"])
        assert (decision.desired, decision.rule) == (tick["desired"], tick["rule"]), (tick, decision.reason)


class FakeProcess:
    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


class FakeChild:
    def __init__(self, name: str) -> None:
        self.name = name
        self.process = FakeProcess()
        self.terminated = False

    def terminate(self) -> None:
        self.terminated = True


@pytest.mark.parametrize(("steps", "sizes"), [([3, 5, 2, None, 0], [3, 4, 2, 2, 1]), ([1, 1, 1], [1, 1, 1])])
def test_pool_resizes_within_bounds(steps: list[int | None], sizes: list[int]) -> None:
    children: list = ["train"]
    pool = ProducerPool(FakeChild, children, initial=1, minimum=1, maximum=4, clock=lambda: 0.0)
    for desired, size in zip(steps, sizes):
        pool.resize(desired)
        assert pool.size == size and children == ["train", *pool.members]
    assert all(c.terminated for c in pool.retiring) and not any(c.terminated for c in pool.members)


def test_pool_counts_producer_seconds_until_exit() -> None:
    now = [0.0]
    pool = ProducerPool(FakeChild, [], initial=2, minimum=1, maximum=4, clock=lambda: now[0])
    now[0] = 10.0
    pool.resize(1)  # rollout-1 stops at 10 s but has not exited yet
    now[0] = 12.0
    pool.retiring[0].process.code = 0
    pool.reap()
    now[0] = 20.0
    assert pool.producer_seconds() == pytest.approx(20.0 + 12.0)
    assert [c.name for c in pool.members] == ["rollout-0"]
    pool.resize(2)
    assert [c.name for c in pool.members] == ["rollout-0", "rollout-2"]  # names are never reused
