"""A trainer reading a samples topic of two partitions keeps an offset per partition.

The trainer trains three versions from groups spread over both partitions and stops; its
checkpoint must hold, for each partition, the offset after the last sample it trained there.
A second trainer on the same run then gets one more batch: it must resume at those offsets, so
its one new version trains exactly the new samples and none of the first three batches again.
(Keeping only the batch's last partition, as the trainer once did, resumes the other one from
an older offset or from 0, and its samples are trained twice.)
"""

from __future__ import annotations

import threading
from pathlib import Path

from astraflow.consumers.trainer.component import Trainer
from astraflow.core.rundir import RunDir
from astraflow.log import TopicSpec, open_log
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import TrainSample
from astraflow.training.checkpoint import read_latest_state
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import stopping_at, tiny_math_config

BATCH = 64


def send(ctx: ComponentContext, samples: list[TrainSample]) -> None:
    """Each group to partition 0 or 1 by its order of first appearance, alternating."""
    order: dict[str, int] = {}
    for sample in samples:
        group = sample.trajectory.group_id
        partition = order.setdefault(group, len(order) % 2)
        ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=group.encode(), partition=partition)
    ctx.producer.flush()


def train_until(ctx: ComponentContext, version: int) -> Trainer:
    stop = threading.Event()
    trainer = stopping_at(Trainer(ctx, "main"), version, stop)
    trainer.run(stop)
    return trainer


def test_the_trainer_resumes_each_samples_partition_at_its_own_offset(tmp_path: Path) -> None:
    config = tiny_math_config(tmp_path, {"train": {"checkpoint_every": 10, "batch_samples": BATCH}})
    run_dir = tmp_path / "run"
    samples = recorded_samples(4 * BATCH)
    with open_log("embedded", path=RunDir(run_dir).log) as log:  # before the run makes it with one partition
        log.create_topic(TopicSpec(f"{config.run}.samples.main", partitions=2))

    ctx = ComponentContext(config, run_dir, "train")
    try:
        send(ctx, samples[: 3 * BATCH])
        ends = ctx.log.end_offsets(ctx.topics.samples("main"))
        assert len(ends) == 2 and min(ends.values()) > 0, ends  # both partitions hold samples
        train_until(ctx, 3)
        state = read_latest_state(RunDir(run_dir).checkpoints("main"))
        assert state.version == 3 and state.offsets == ends, (state.offsets, ends)

        send(ctx, samples[3 * BATCH :])
        trainer = train_until(ctx, 4)
        ends = ctx.log.end_offsets(ctx.topics.samples("main"))
    finally:
        ctx.close()
    state = read_latest_state(RunDir(run_dir).checkpoints("main"))
    assert trainer.learner.version == state.version == 4
    assert state.trained_samples == 4 * BATCH and state.offsets == ends, (state.trained_samples, state.offsets, ends)
