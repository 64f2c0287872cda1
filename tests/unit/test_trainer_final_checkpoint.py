"""A trainer stopped between two periodic checkpoints checkpoints its last version before it exits,
so the run's final version is on disk for ``final/<policy>`` and a restart redoes no step."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from astraflow.consumers.trainer.component import Trainer
from astraflow.core.errors import AstraFlowError
from astraflow.core.rundir import RunDir
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.training.checkpoint import checkpointed_versions, read_latest_state
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import send_samples, stopping_at, tiny_math_config

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


def test_a_checkpoint_changed_on_disk_is_refused_at_resume(tmp_path: Path) -> None:
    """A checkpointed version is published whole, so its ledger entry's sha256 is of the checkpoint's
    weights: a trainer that resumes from a checkpoint whose ``model.pt`` was changed since (here one
    weight, as corruption or tampering would) refuses it before it commits anything."""
    config = tiny_math_config(tmp_path, {"run": "tamper", "train": {"checkpoint_every": 2, "batch_samples": 8}})
    ctx = ComponentContext(config, tmp_path / "run", "train")
    try:
        send_samples(ctx, recorded_samples(24))
        stop = threading.Event()
        stopping_at(Trainer(ctx, "main"), 2, stop).run(stop)
        checkpoint = RunDir(ctx.run_dir).checkpoints("main") / "v00000002"
        state = torch.load(checkpoint / "model.pt")
        name = next(name for name in state if ".layers." in name)  # not the embedding, which lm_head ties
        state[name] = state[name] + 1.0
        torch.save(state, checkpoint / "model.pt")
        with pytest.raises(AstraFlowError, match="does not hold the weights that version was published with"):
            stop = threading.Event()  # set only if it resumed anyway and trained the third batch
            stopping_at(Trainer(ctx, "main"), 3, stop).run(stop)
        entries = [entry for _, entry in decode_snapshot(ctx.log, ctx.topics.ledger("main"))]
        assert {entry.epoch for entry in entries} == {1}  # the refused start committed nothing
    finally:
        ctx.close()
