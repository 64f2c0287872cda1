"""A lockstep run with the replay mixer, simulated on the project's own parts: the feeder's bound
(``PolicyBudget``, ``Spares``), the stream's ``ReplayMixer`` and the trainer's ``BatchAssembler``.

Events in time order: the feeder releases tasks up to its bound at the trainer's version; each group
completes after a random generation time; the stream drops it as stale (generated before the
version it now sees: surplus in lockstep, not given back) or as zero-variance (at rate ``q``, given
back at once), else mixes it; the trainer cuts a batch once its buffer holds one (stale fresh groups
consumed untrained), trains for a while and publishes the next version. A run that can never fill a
batch ends with nothing in flight and the bound reached.

The replay mixer's credit pays ρ / (1 − ρ) replayed groups per fresh group. The feeder used to
release the average count of fresh groups a batch needs, n ⌈B⌉ (1 − ρ) + 1 for n batches, assuming
that what one batch leaves over fills the next; in lockstep a fresh group the batch did not take is
stale at the next version, so the fraction a batch lacked was lost each time, and a replayed copy
that shared its original's group id was dropped as stale with it: the data-algorithm benchmark's
replay arms waited for ever. Now a lockstep batch takes at most c = ``StreamConfig.lockstep_replays``
replayed copies (one mixer per stream partition, each holding back a fraction of a group) and the
feeder releases B − c + 1 fresh groups a batch; every batch fills, and what the trainer holds stays
within a few batches.
"""

from __future__ import annotations

import heapq
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from astraflow.config import load_config
from astraflow.consumers.trainer.batch_assembler import BatchAssembler
from astraflow.producers.feeder.component import PolicyBudget, Spares
from astraflow.streams.operators.base import Group
from astraflow.streams.operators.mixing import ReplayMixer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"
GROUP = 8
BATCH = 64
"""Groups in a batch: the math example's 512 samples in groups of 8."""


def replay_cap(ratio: float, partitions: int) -> int | None:
    """What the example in lockstep with a replay mixer of ``ratio`` caps a batch's replays at."""
    pipeline = [{"op": "staleness"}, {"op": "grpo"}, {"op": "zero_variance"}]
    pipeline += [{"op": "replay", "ratio": ratio, "capacity": 64}] if ratio else []
    config = load_config(EXAMPLE, {"mode": "lockstep", "stream": {"max_staleness": 0, "pipeline": pipeline}})
    return config.stream.lockstep_replays(BATCH, partitions)


def stalled_at(
    ratio: float, drop_rate: float, partitions: int, versions: int, seed: int, train_s: float = 1.0
) -> tuple[int | None, int]:
    """The version whose batch never filled (``None`` when ``versions`` batches were trained), and the most
    groups the trainer held at a batch's cut."""
    rng = random.Random(seed)
    cap = replay_cap(ratio, partitions)
    budget = PolicyBudget(0, BATCH, 1, ratio, cap)
    spares = Spares(1.25, budget.fresh_groups(1))
    mixers = [ReplayMixer(ratio=ratio, capacity=64) for _ in range(partitions)] if ratio else []
    assembler = BatchAssembler(BATCH * GROUP, GROUP)
    most = 0
    version = released = dropped = offset = 0
    now, training_until = 0.0, None
    in_flight: list[tuple[float, int, int]] = []  # (completes at, group number, version generated with)

    def hold(group: Group, generated: int) -> None:
        nonlocal offset
        for i in range(GROUP):
            trajectory = SimpleNamespace(
                group_id=group.group_id, group_size=GROUP, min_version=generated, trajectory_id=f"{group.group_id}/{i}"
            )
            sample_id = trajectory.trajectory_id + (f"#replay{group.replay}" if group.replay else "")
            sample = SimpleNamespace(sample_id=sample_id, replayed=group.replay > 0, trajectory=trajectory)
            assembler.add(sample, SimpleNamespace(partition=0, offset=offset))
            offset += 1

    while version < versions:
        bound = budget.capacity(version, dropped + spares.groups(version, dropped))
        for number in range(released, bound):
            heapq.heappush(in_flight, (now + rng.expovariate(1.0), number, version))
        released = max(released, bound)
        if training_until is None and assembler.take(version, cap) is not None:
            most = max(most, len(assembler.buffer) // GROUP)
            training_until = now + train_s
            continue
        if training_until is not None and (not in_flight or in_flight[0][0] >= training_until):
            now, training_until, version = training_until, None, version + 1
            continue
        if not in_flight:
            return version, most
        now, number, generated = heapq.heappop(in_flight)
        if generated < version:
            continue  # the stream's staleness filter
        if rng.random() < drop_rate:
            dropped += 1
            continue
        group = Group(f"g{number}", [SimpleNamespace(reward=float(i % 2)) for i in range(GROUP)])
        hold(group, generated)
        for copy in mixers[number % partitions].mix(group) if mixers else []:
            hold(copy, generated)
    return None, most


@pytest.mark.parametrize("drop_rate", [0.0, 0.2])
@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.9])
def test_a_lockstep_run_fills_every_batch(ratio: float, partitions: int, drop_rate: float) -> None:
    for seed in range(2):
        stalled, most = stalled_at(ratio, drop_rate, partitions, versions=20, seed=seed)
        assert stalled is None, f"seed {seed}: no batch at version {stalled}"
        assert most <= 2 * BATCH, f"seed {seed}: the trainer held {most} groups beyond a batch"


def test_the_cap_leaves_the_replays_the_mixers_surely_earn() -> None:
    assert [replay_cap(0.3, p) for p in (1, 2, 4)] == [19, 18, 16]  # ⌊0.3 · 64⌋ less one a further partition
    assert replay_cap(0.0, 2) is None
    assert replay_cap(0.02, 4) == 0  # fewer replays than partitions: none taken, the batch all fresh
