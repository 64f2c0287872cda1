"""Curators of the task feeder (accept_all, filter_solved, GRESO) and the feeder's resumable cursor."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import FilterSolvedCurator, GresoCurator, parse_config
from astraflow.producers.feeder.component import TaskFeeder
from astraflow.producers.feeder.curators import AcceptAll, FilterSolved, Greso, build_curator
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import PromptStats
from astraflow.tasks.base import Problem

EASY, HARD, MIXED = (1.0, 0.0), (0.0, 0.0), (0.5, 0.5)  # (pass rate, reward std) of a group


def stats(prompt: str, outcome: tuple[float, float]) -> PromptStats:
    pass_rate, std = outcome
    return PromptStats(prompt, f"{prompt}@0", "math", "main", 0, 8, pass_rate, std, pass_rate)


@pytest.mark.parametrize(
    ("pass_rates", "alpha", "min_groups", "admitted"),
    [
        ([], 0.5, 1, True),
        ([1.0], 0.5, 1, False),  # EWMA 1.0 > 0.95
        ([1.0], 0.5, 2, True),  # not enough groups yet
        ([0.5, 1.0], 0.5, 1, True),  # 0.75
        ([0.9, 1.0], 0.5, 1, True),  # 0.95 is not above 0.95
        ([0.9, 1.0, 1.0], 0.5, 1, False),  # 0.975
        ([1.0, 0.0], 0.5, 1, True),  # 0.5: a solved prompt that fails again is submitted again
        ([0.0, 1.0], 1.0, 1, False),  # alpha 1: only the last group counts
    ],
)
def test_filter_solved(pass_rates: list[float], alpha: float, min_groups: int, admitted: bool) -> None:
    curator = FilterSolved(threshold=0.95, alpha=alpha, min_groups=min_groups)
    for rate in pass_rates:
        curator.observe(stats("p", (rate, 0.1)))
    assert curator.admit("p", 0) is admitted
    assert curator.admit("other", 1)


@pytest.mark.parametrize(
    ("outcomes", "probability"),
    [
        ([], 1.0),
        ([MIXED], 1.0),
        ([EASY], 0.5),  # p_easy^1
        ([EASY, EASY, EASY], 0.125),  # p_easy^3
        ([HARD, HARD], 0.04),  # p_hard^2
        ([EASY, EASY, HARD], 0.2),  # the streak restarts when its kind changes
        ([HARD, HARD, MIXED], 1.0),  # a group with signal ends the streak
        ([HARD, MIXED, HARD], 0.2),
    ],
)
def test_greso_submit_probability_is_p_to_the_streak(outcomes: list, probability: float) -> None:
    curator = Greso(p_easy=0.5, p_hard=0.2, adapt_every=10_000)
    for outcome in outcomes:
        curator.observe(stats("p", outcome))
    assert curator.probability("p") == pytest.approx(probability)
    draws = 20_000
    admitted = sum(curator.admit("p", n) for n in range(draws)) / draws
    assert admitted == pytest.approx(probability, abs=0.015)


@pytest.mark.parametrize(
    ("window", "p_easy", "p_hard"),
    [
        ([EASY, MIXED, MIXED, MIXED], 0.49, 0.51),  # 25% easy >= 8.3%: skip more easy; 0% hard < 16.7%: skip fewer
        ([HARD, MIXED, MIXED, MIXED], 0.51, 0.49),
        ([EASY, HARD, MIXED, MIXED], 0.49, 0.49),
        ([MIXED, MIXED, MIXED], 0.5, 0.5),  # the window is not full yet
    ],
)
def test_greso_adapts_p_toward_the_targets(window: list, p_easy: float, p_hard: float) -> None:
    curator = Greso(p_easy=0.5, p_hard=0.5, target_easy=0.083, target_hard=0.167, step=0.01, adapt_every=4)
    for index, outcome in enumerate(window):
        curator.observe(stats(f"p{index}", outcome))
    assert curator.p == pytest.approx({"easy": p_easy, "hard": p_hard})


def test_greso_p_stays_within_bounds() -> None:
    curator = Greso(p_easy=0.06, p_hard=0.94, step=0.01, p_min=0.05, p_max=0.95, adapt_every=1)
    for _ in range(5):
        curator.observe(stats("p", EASY))
    assert curator.p == pytest.approx({"easy": 0.05, "hard": 0.95})


def test_build_curator_from_config() -> None:
    assert isinstance(build_curator(parse_config({}).stream.curator), AcceptAll)
    solved = build_curator(FilterSolvedCurator(threshold=0.9))
    assert isinstance(solved, FilterSolved) and solved.threshold == 0.9
    greso = build_curator(GresoCurator(p_hard=0.3, seed=4))
    assert isinstance(greso, Greso) and greso.p["hard"] == 0.3


@pytest.fixture
def ctx(tmp_path: Path):
    raw = {"rollout": {"group_size": 8}, "train": {"batch_samples": 256}, "log": {"partitions": 2}}
    raw["stream"] = {"pipeline": [{"op": "grpo"}, {"op": "replay", "ratio": 0.5}], "curator": {"type": "filter_solved"}}
    context = ComponentContext(parse_config(raw), tmp_path, "feed")
    yield context
    context.close()


def test_feeder_counts_fresh_groups_and_resumes_after_its_cursor(ctx: ComponentContext) -> None:
    rows = [Problem(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(5)]
    feeder = TaskFeeder(ctx, rows, seed=3)
    # half of each 256-sample batch is replayed: 16 fresh groups,
    # and one more for the replay share the first batch misses
    assert feeder.budgets["main"].tasks_per_batch == 17
    assert isinstance(feeder.curator, FilterSolved) and feeder.cursor == 0
    for seq, n in enumerate((0, 1, 4, 7)):  # candidates 2, 3, 5 and 6 were skipped by the curator
        task = feeder.task(n, {"main": 0}, seq)
        assert task.metadata == {"cursor": str(n), "seq": str(seq)}
        ctx.producer.send(ctx.topics.tasks(), ctx.codec.encode(task), key=task.task_id.encode())
    ctx.producer.flush()
    resumed = TaskFeeder(ctx, rows, seed=3)
    resumed.resume()
    assert resumed.submitted == 4 and resumed.cursor == 8


def test_greso_decides_a_candidate_the_same_after_a_restart() -> None:
    """A draw is a hash of (seed, prompt, candidate): a curator rebuilt from the same feedback, which
    never made the draws of the candidates before, decides the later ones as the first one did."""
    first, rebuilt, other_seed = Greso(seed=7), Greso(seed=7), Greso(seed=8)
    for curator in (first, rebuilt, other_seed):
        curator.observe(stats("p", HARD))  # probability 0.5
    assert sum(first.admit("p", n) for n in range(100)) in range(30, 71)
    later = range(100, 300)
    assert [first.admit("p", n) for n in later] == [rebuilt.admit("p", n) for n in later]
    assert [first.admit("p", n) for n in later] != [other_seed.admit("p", n) for n in later]
