"""A trainer stopped between two periodic checkpoints checkpoints its last version before it exits,
so the run's final version is on disk for ``final/<policy>`` and a restart redoes no step."""

from __future__ import annotations

import threading
from pathlib import Path

from astraflow.config import load_config
from astraflow.consumers.trainer import Trainer
from astraflow.context import ComponentContext
from astraflow.models.tiny import TinyModelSpec, create_tiny_checkpoint
from astraflow.rundir import RunDir
from astraflow.training.checkpoint import checkpointed_versions, read_latest_state
from tests.unit.test_trainer_reference import recorded_samples

REPO = Path(__file__).resolve().parents[2]
BATCH = 64


def test_a_stopped_trainer_checkpoints_its_last_version(tmp_path: Path) -> None:
    base = create_tiny_checkpoint(tmp_path / "base", TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2))
    config = load_config(
        REPO / "examples" / "math" / "config.yaml",
        {"model": {"path": str(base)}, "train": {"checkpoint_every": 10, "batch_samples": BATCH}},
    )
    run_dir = tmp_path / "run"
    ctx = ComponentContext(config, run_dir, "train")
    for sample in recorded_samples(3 * BATCH):
        ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=sample.trajectory.group_id.encode())
    ctx.producer.flush()
    trainer = Trainer(ctx, "main")
    stop = threading.Event()
    step = trainer._step

    def step_then_stop_at_version_3(*args: object) -> None:
        step(*args)
        if trainer.learner.version >= 3:
            stop.set()

    trainer._step = step_then_stop_at_version_3
    try:
        trainer.run(stop)
    finally:
        ctx.close()
    directory = RunDir(run_dir).checkpoints("main")
    assert checkpointed_versions(directory) == [3]  # none of 1-3 was due (every 10), the stop wrote 3
    state = read_latest_state(directory)
    assert state.version == 3 and state.trained_samples == 3 * BATCH
    assert sum(state.offsets.values()) == 3 * BATCH
