"""``max_staleness`` holds at the optimizer step, and a surplus of groups drains instead of growing.

A group can go stale after the stream processor passed it: it waits in the samples topic behind
other samples. That only happens when more groups were made than the trainer takes - e.g. a stream
runtime that emitted a group twice across a crash, whose copy of a dropped group's feedback made
the task feeder release one task too many. Measured in the chaos benchmark before this: every batch
after such a surplus trained samples 1-5 versions old in a lockstep run (max_staleness 0), and
held-out accuracy fell from 0.59 to 0.40 while the clean run reached 0.80.

Here: the batch assembler leaves stale groups out of a batch (and hands them to the trainer); the
trainer trains none of them, reports each as a dropped group in its next version's transaction, and
still trains the samples of versions lost in a crash again; the feeder counts each dropped group
once, and a stale one not at all where ``max_staleness`` is 0.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

from astraflow.consumers.trainer.batch_assembler import BatchAssembler
from astraflow.consumers.trainer.component import Trainer
from astraflow.log import Message
from astraflow.producers.feeder.feedback import FeedbackReader
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import LedgerEntry, PromptStats, TrainSample
from tests.unit.test_trainer_reference import GROUP, recorded_samples
from tests.unit.tiny_trainer import stopping_at, tiny_math_config

BATCH = 64
LOCKSTEP = {"mode": "lockstep", "stream": {"max_staleness": 0}}


def at_version(samples: list[TrainSample], version: int, tag: str = "") -> list[TrainSample]:
    """Copies of ``samples`` generated with weight version ``version`` (ids and groups suffixed by ``tag``)."""
    out = []
    for sample in samples:
        t = sample.trajectory
        trajectory = dataclasses.replace(
            t,
            trajectory_id=t.trajectory_id + tag,
            group_id=t.group_id + tag,
            token_versions=np.full(len(t.response_ids), version, dtype=np.int32),
        )
        out.append(dataclasses.replace(sample, sample_id=sample.sample_id + tag, trajectory=trajectory))
    return out


def message(offset: int) -> Message:
    return Message("run.samples.main", 0, offset, None, b"", 0)


def test_a_stale_group_takes_no_place_in_the_batch_and_is_handed_back() -> None:
    fresh = recorded_samples(2 * GROUP)
    old = at_version(recorded_samples(GROUP, seed=3), 0, tag="old")
    newer = at_version(fresh, 1)
    assembler = BatchAssembler(batch_samples=2 * GROUP, group_size=GROUP)
    for offset, sample in enumerate(old[:2] + newer[:GROUP] + old[2:] + newer[GROUP:]):
        assembler.add(sample, message(offset))
    assert assembler.take(oldest_version=2) is None  # every group is stale then: no batch
    batch = assembler.take(oldest_version=1)
    assert [sample.sample_id for sample, _ in batch] == [s.sample_id for s in newer]
    assert sorted(sample.sample_id for sample, _ in assembler.stale) == sorted(s.sample_id for s in old)
    assert assembler.buffer == []  # the stale records were consumed with the batch


def replayed_copy(samples: list[TrainSample], n: int) -> list[TrainSample]:
    """The replay mixer's n-th copy of a group: the same trajectories, sample ids suffixed ``#replay<n>``."""
    return [
        dataclasses.replace(s, sample_id=s.trajectory.trajectory_id + f"#replay{n}", replayed=True) for s in samples
    ]


def test_a_replayed_copy_is_a_group_of_its_own_never_stale_with_its_original() -> None:
    """In lockstep a fresh group the last batch left over is stale, while the replay mixer may already have
    emitted a copy of it: the copy shares the group id, and counted as the same group it was dropped as
    stale with it (and a copy beside its original made one group of twice its size). The trainer then held
    one group short of its batch for ever: a lockstep run with replay stalled."""
    old = at_version(recorded_samples(GROUP, seed=3), 0, tag="old")
    old = [dataclasses.replace(s, sample_id=s.trajectory.trajectory_id) for s in old]  # as the stream names them
    newer = at_version(recorded_samples(GROUP), 1)
    copy = replayed_copy(old, 1)
    assembler = BatchAssembler(batch_samples=2 * GROUP, group_size=GROUP)
    for offset, sample in enumerate(old[:3] + copy[:4] + newer + old[3:] + copy[4:]):
        assembler.add(sample, message(offset))
    assert assembler.held(1) == (2 * GROUP, GROUP)  # the copy and the newer group count, the original does not
    batch = assembler.take(oldest_version=1)
    assert batch is not None
    assert sorted(sample.sample_id for sample, _ in batch) == sorted(s.sample_id for s in newer + copy)
    assert sorted(sample.sample_id for sample, _ in assembler.stale) == sorted(s.sample_id for s in old)
    assert assembler.buffer == []


def test_a_lockstep_batch_takes_replayed_copies_up_to_its_cap_and_consumes_the_rest() -> None:
    """With ``replay_cap`` a batch takes that many replayed copies, in offset order, and fresh groups for
    the rest; further copies in its prefix are consumed untrained, and the members of a skipped copy
    that arrive after the batch are skipped too, so no copy is left half counted."""

    def fresh(seed: int, tag: str) -> list[TrainSample]:
        samples = at_version(recorded_samples(GROUP, seed=seed), 1, tag=tag)
        return [dataclasses.replace(s, sample_id=s.trajectory.trajectory_id) for s in samples]  # as the stream names

    first, second, third, fourth = fresh(0, "a"), fresh(3, "b"), fresh(5, "c"), fresh(7, "d")
    copy_one, copy_two, copy_three = replayed_copy(first, 1), replayed_copy(first, 2), replayed_copy(third, 1)
    assembler = BatchAssembler(batch_samples=3 * GROUP, group_size=GROUP)
    order = first + copy_one + copy_two[:5] + second + copy_two[5:] + third + copy_three + fourth
    for offset, sample in enumerate(order):
        assembler.add(sample, message(offset))
    batch = assembler.take(oldest_version=1, replay_cap=1)
    assert [s.sample_id for s, _ in batch] == [x.sample_id for x in first + copy_one + second]
    assert [s.sample_id for s, _ in assembler.skipped] == [x.sample_id for x in copy_two[:5]]
    assert assembler.held(1) == (3 * GROUP, 0)  # the skipped copy's later members count towards nothing
    batch = assembler.take(oldest_version=1, replay_cap=1)
    assert [s.sample_id for s, _ in batch] == [x.sample_id for x in third + copy_three + fourth]
    assert [s.sample_id for s, _ in assembler.skipped] == [x.sample_id for x in copy_two[5:]]
    assert assembler.buffer == []
    # without a cap every copy counts, as before
    again = BatchAssembler(batch_samples=3 * GROUP, group_size=GROUP)
    for offset, sample in enumerate(order):
        again.add(sample, message(offset))
    assert [s.sample_id for s, _ in again.take(oldest_version=1)] == [
        x.sample_id for x in first + copy_one + copy_two[:5] + second + copy_two[5:]
    ]


def test_a_waiting_trainer_says_what_it_holds_of_its_batch() -> None:
    """A run whose batch never fills (the replay stall of docs/benchmarks.md#data_algorithms) waited in
    silence; the trainer now logs every ``WAIT_WARNING_S`` how long it waited and what it holds."""
    from astraflow.consumers.trainer.component import waiting_message

    old = at_version(recorded_samples(GROUP, seed=3), 0, tag="old")
    newer = at_version(recorded_samples(GROUP), 1)
    assembler = BatchAssembler(batch_samples=2 * GROUP, group_size=GROUP)
    for offset, sample in enumerate(old + newer):
        assembler.add(sample, message(offset))
    assert assembler.held(oldest_version=None) == (2 * GROUP, 0)
    assert assembler.held(oldest_version=1) == (GROUP, GROUP)
    assert assembler.take(oldest_version=1) is None  # one fresh group of the two a batch needs
    text = waiting_message(61.2, 7, assembler, 1)
    assert text.startswith(f"no batch for 61 s after version 7: {GROUP} of {2 * GROUP} samples held ({GROUP} more")
    assert "(astraflow stats)" in text and "more in stale" not in waiting_message(61.2, 7, assembler, None)


def test_without_a_bound_every_group_is_trained() -> None:
    assembler = BatchAssembler(batch_samples=GROUP, group_size=GROUP)
    for offset, sample in enumerate(at_version(recorded_samples(GROUP), 0)):
        assembler.add(sample, message(offset))
    assert len(assembler.take(oldest_version=None)) == GROUP and assembler.stale == []


class Recording:
    """A curator that keeps what it observed."""

    name = "recording"

    def __init__(self) -> None:
        self.observed: list[str] = []

    def observe(self, stats: PromptStats) -> None:
        self.observed.append(stats.group_id)

    def admit(self, prompt_id: str, candidate: int) -> bool:
        return True


def stats(group: str, accepted: bool, reason: str = "") -> PromptStats:
    return PromptStats(group, group, "math", "main", 0, GROUP, 0.5, 0.5, 0.5, accepted, reason, 0, [])


@pytest.mark.parametrize(
    ("records", "replace_stale", "dropped", "observed"),
    [
        # a copy of a dropped group's record gives no second task back
        ([("g", False, "zero_variance: all equal"), ("g", False, "zero_variance: all equal")], True, 1, ["g"]),
        # where max_staleness is 0 a stale group was surplus: nothing to give back
        ([("g", False, "stale: 1 versions behind")], False, 0, ["g"]),
        ([("g", False, "stale: 1 versions behind")], True, 1, ["g"]),
        # the trainer's verdict after the stream's: counted as a drop, observed by the curator once
        ([("g", True, ""), ("g", False, "stale: 3 versions behind the trainer")], True, 1, ["g"]),
        ([("g", True, ""), ("g", False, "stale: 3 versions behind the trainer")], False, 0, ["g"]),
        ([("g", False, "zero_variance: x"), ("h", False, "zero_variance: x")], True, 2, ["g", "h"]),
    ],
)
def test_the_feeder_counts_each_dropped_group_once(
    tmp_path: Path, records: list, replace_stale: bool, dropped: int, observed: list[str]
) -> None:
    ctx = ComponentContext(tiny_math_config(tmp_path, {}), tmp_path / "run", "feed")
    try:
        for group, accepted, reason in records:
            ctx.producer.send(ctx.topics.feedback(), ctx.codec.encode(stats(group, accepted, reason)))
        ctx.producer.flush()
        curator = Recording()
        reader = FeedbackReader(ctx, curator, {"main": replace_stale})
        reader.catch_up()
        reader.close()
    finally:
        ctx.close()
    assert reader.dropped["main"] == dropped
    assert curator.observed == observed


def send(ctx: ComponentContext, samples: list[TrainSample]) -> None:
    for sample in samples:
        key = sample.trajectory.group_id.encode()
        ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=key, partition=0)
    ctx.producer.flush()


def train(ctx: ComponentContext, version: int, crash: bool = False, within_s: float = 120.0) -> Trainer:
    """Run a trainer until it published ``version`` (or died after it, with ``crash``); at most ``within_s``."""
    stop = threading.Event()
    trainer = stopping_at(Trainer(ctx, "main"), version, stop, crash=crash)
    timer = threading.Timer(within_s, stop.set)  # a trainer that waits for a batch that never comes
    timer.start()
    try:
        trainer.run(stop)
    finally:
        timer.cancel()
    return trainer


def test_the_trainer_trains_no_stale_group_and_reports_it_with_its_next_version(tmp_path: Path) -> None:
    ctx = ComponentContext(tiny_math_config(tmp_path, {**LOCKSTEP, "train": {"batch_samples": BATCH}}), tmp_path, "t")
    try:
        first = at_version(recorded_samples(BATCH), 0)
        surplus = at_version(recorded_samples(GROUP, seed=11), 0, tag="surplus")  # made at 0, arrives after v1
        second = at_version(recorded_samples(BATCH, seed=5), 1, tag="v1")
        send(ctx, first + surplus + second)
        trainer = train(ctx, 2)
        feedback = [s for _, s in decode_snapshot(ctx.log, ctx.topics.feedback())]
        entries = [e for _, e in decode_snapshot(ctx.log, ctx.topics.ledger("main")) if isinstance(e, LedgerEntry)]
    finally:
        ctx.close()
    assert trainer.learner.version == 2 and trainer.stale_samples == GROUP
    steps = {entry.version: entry for entry in entries if entry.kind == "step"}
    assert steps[1].sample_ids == [s.sample_id for s in first]
    assert steps[2].sample_ids == [s.sample_id for s in second]  # a full batch of fresh samples
    assert steps[2].offsets == {"0": len(first) + len(surplus) + len(second)}  # the stale group consumed
    [report] = feedback
    assert not report.accepted and report.drop_reason.startswith("stale: 1 versions behind the trainer at version 1")
    assert report.trajectory_ids == [s.trajectory.trajectory_id for s in surplus]


def test_samples_of_versions_lost_in_a_crash_are_trained_again_whatever_their_age(tmp_path: Path) -> None:
    config = tiny_math_config(tmp_path, {**LOCKSTEP, "train": {"batch_samples": BATCH, "checkpoint_every": 10}})
    ctx = ComponentContext(config, tmp_path, "t")
    try:
        batches = [at_version(recorded_samples(BATCH, seed=20 + v), v, tag=f"v{v}") for v in range(3)]
        send(ctx, [sample for batch in batches for sample in batch])
        with pytest.raises(RuntimeError, match="killed"):
            train(ctx, 3, crash=True)  # versions 1-3 published, none checkpointed: all three are lost
        trainer = train(ctx, 7)  # the base again as version 4, then batches 0-2 again as 5-7
        late = at_version(recorded_samples(BATCH, seed=30), 3, tag="late")  # made with lost version 3
        send(ctx, late + at_version(recorded_samples(BATCH, seed=31), 7, tag="v7"))
        trainer = train(ctx, 8)
        entries = [e for _, e in decode_snapshot(ctx.log, ctx.topics.ledger("main")) if isinstance(e, LedgerEntry)]
    finally:
        ctx.close()
    steps = {(entry.epoch, entry.version): entry for entry in entries if entry.kind == "step"}
    for batch, version in zip(batches, (5, 6, 7)):
        assert steps[(2, version)].sample_ids == [s.sample_id for s in batch]
    assert trainer.stale_samples == BATCH  # the batch made with a lost version, after the samples were retrained
    assert steps[(3, 8)].sample_ids[0].endswith("v7")
