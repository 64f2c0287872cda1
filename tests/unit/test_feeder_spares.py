"""Spare groups (``stream.spare_groups``): where ``max_staleness`` is 0 the feeder releases each batch with
spares for the drops it expects, never less than the batch needs, and a restarted feeder continues
from what its tasks recorded."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from astraflow.config import load_config
from astraflow.producers.feeder.component import Spares, TaskFeeder
from astraflow.runtime.context import ComponentContext
from astraflow.tasks.base import Problem

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"
BATCH = 64
"""Groups in one trainer batch of the math example (512 samples in groups of 8)."""


def simulate(factor: float, drop_rate: float, versions: int, seed: int = 0, restart_every: int = 0) -> list[int]:
    """A lockstep run: per version, the groups released (each dropped with ``drop_rate`` and its drop reported at
    once, the bound read again after every report) until ``BATCH`` were kept. Returns the groups released per
    version; fails if a batch can never fill (the feeder stops releasing before ``BATCH`` are kept)."""
    rng = random.Random(seed)
    spares = Spares(factor, BATCH)
    released = dropped = 0
    per_version = []
    for version in range(versions):
        if restart_every and version % restart_every == restart_every - 1:
            state, spares = spares.state(), Spares(factor, BATCH)
            spares.restore(state)
        kept = before = 0
        while kept < BATCH:
            bound = (version + 1) * BATCH + dropped + spares.groups(version, dropped)
            if released >= bound:
                pytest.fail(f"version {version}: {kept} of {BATCH} groups kept and nothing more released")
            while released < bound:
                released += 1
                before += 1
                if rng.random() < drop_rate:
                    dropped += 1
                else:
                    kept += 1
        per_version.append(before)
    return per_version


@pytest.mark.parametrize("drop_rate", [0.0, 0.15, 0.5, 0.9])
@pytest.mark.parametrize("factor", [0.0, 1.25, 3.0])
def test_every_batch_fills_whatever_the_drops(factor: float, drop_rate: float) -> None:
    simulate(factor, drop_rate, versions=60, seed=int(drop_rate * 100))


def test_without_spares_exactly_the_batch_and_its_drops_are_released() -> None:
    released = simulate(0.0, 0.3, versions=20)
    assert released[0] >= BATCH
    assert Spares(0.0, BATCH).groups(5, 40) == 0


def test_spares_follow_the_recent_drops_and_unused_ones_count_as_surplus() -> None:
    spares = Spares(1.25, BATCH)
    assert spares.groups(0, 0) == 0  # no history: no spares yet
    assert spares.groups(0, 8) == 0  # 8 drops at version 0, replaced by the bound's own count
    assert spares.groups(1, 8) == 10  # 8 of 72 dropped: ⌈1.25 · 64 · 8 / 64⌉ spares with version 1's batch
    assert spares.groups(1, 12) == 6  # 4 drops used 4 of them
    assert spares.groups(2, 12) == 6 + 8  # 6 unused are surplus for good; 12 of 146 dropped: E = ⌈7.16⌉
    assert spares.groups(2, 30) == 6  # more drops than spares: each further one is replaced as before


def test_spares_cut_the_top_up_rounds() -> None:
    """With drops of 15% a lockstep batch without spares needs a replacement round almost every version."""

    def rounds(factor: float) -> int:
        spares, dropped, released, count = Spares(factor, BATCH), 0, 0, 0
        rng = random.Random(1)
        for version in range(100):
            kept = 0
            while kept < BATCH:  # one round: release up to the bound, then read the drops of the whole round
                bound = (version + 1) * BATCH + dropped + spares.groups(version, dropped)
                fresh, released = bound - released, bound
                drops = sum(rng.random() < 0.15 for _ in range(fresh))
                kept, dropped, count = kept + fresh - drops, dropped + drops, count + 1
        return count

    assert rounds(0.0) > 190  # nearly two rounds a version
    assert rounds(1.25) < 150


@pytest.mark.parametrize("restart_every", [2, 3, 7])
def test_a_restarted_feeder_never_leaves_a_batch_short(restart_every: int) -> None:
    simulate(1.25, 0.3, versions=40, restart_every=restart_every)


def test_tasks_record_the_spares_and_a_restart_at_the_same_version_continues_exactly(tmp_path: Path) -> None:
    ctx = ComponentContext(load_config(EXAMPLE), tmp_path, "feed")
    try:
        rows = [Problem(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(4)]
        feeder = TaskFeeder(ctx, rows, seed=0)
        tasks_per_batch = feeder.budgets["main"].tasks_per_batch
        assert feeder.capacity({"main": 0}, Counter()) == tasks_per_batch
        assert feeder.capacity({"main": 0}, Counter(main=16)) == tasks_per_batch + 16
        # 16 of 80 dropped: ⌈1.25 · 64 / 4⌉ spares
        assert feeder.capacity({"main": 1}, Counter(main=16)) == 2 * tasks_per_batch + 16 + 20
        state = feeder.task(7, {"main": 1}, seq=7).metadata["spares.main"]
        assert state == "1,16,20,0,16:80"

        again = TaskFeeder(ctx, rows, seed=0)
        again.spares["main"].restore(state)
        assert again.capacity({"main": 1}, Counter(main=20)) == feeder.capacity({"main": 1}, Counter(main=20))
        later = TaskFeeder(ctx, rows, seed=0)
        later.spares["main"].restore(state)
        # the version moved on: the recorded 20 spares all count as surplus (at worst a few too many, never short)
        assert later.capacity({"main": 2}, Counter(main=20)) == 3 * tasks_per_batch + 20 + 20 + 20
    finally:
        ctx.close()


def test_no_spares_where_staleness_leaves_room_or_they_are_off(tmp_path: Path) -> None:
    for overrides in ({"mode": "async", "stream.max_staleness": 1}, {"stream.spare_groups": 0}):
        ctx = ComponentContext(load_config(EXAMPLE, overrides), tmp_path, "feed")
        try:
            assert TaskFeeder(ctx, [Problem("p0", "1+1=", "2")], seed=0).spares == {}
        finally:
            ctx.close()
