"""A trainer stopped between two periodic checkpoints checkpoints its last version before it exits,
so the run's final version is on disk for ``final/<policy>`` and a restart redoes no step."""

from __future__ import annotations

import threading
from pathlib import Path

from astraflow.consumers.trainer.component import Trainer
from astraflow.core.rundir import RunDir
from astraflow.runtime.context import ComponentContext
from astraflow.training.checkpoint import checkpointed_versions, read_latest_state
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import stopping_at, tiny_math_config

BATCH = 64


def test_a_stopped_trainer_checkpoints_its_last_version(tmp_path: Path) -> None:
    config = tiny_math_config(tmp_path, {"train": {"checkpoint_every": 10, "batch_samples": BATCH}})
    run_dir = tmp_path / "run"
    ctx = ComponentContext(config, run_dir, "train")
    for sample in recorded_samples(3 * BATCH):
        ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=sample.trajectory.group_id.encode())
    ctx.producer.flush()
    stop = threading.Event()
    try:
        stopping_at(Trainer(ctx, "main"), 3, stop).run(stop)
    finally:
        ctx.close()
    directory = RunDir(run_dir).checkpoints("main")
    assert checkpointed_versions(directory) == [3]  # none of 1-3 was due (every 10), the stop wrote 3
    state = read_latest_state(directory)
    assert state.version == 3 and state.trained_samples == 3 * BATCH
    assert sum(state.offsets.values()) == 3 * BATCH
