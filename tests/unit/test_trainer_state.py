"""The trainer state in a checkpoint: version, offsets per samples partition, samples trained, epoch."""

from __future__ import annotations

from pathlib import Path

import torch

from astraflow.training.checkpoint import CheckpointStore, TrainerState, read_latest_state


def test_the_state_round_trips_and_reads_without_the_model(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    state = TrainerState(3, {0: 30, 1: 12}, 42, epoch=2)
    CheckpointStore(tmp_path).save(model, optimizer, state)
    assert read_latest_state(tmp_path) == state
    assert CheckpointStore(tmp_path).restore(model, optimizer) == state
    assert read_latest_state(tmp_path / "none") is None


def test_restore_takes_the_newest_checkpoint_it_accepts(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    store = CheckpointStore(tmp_path)
    for version in (4, 5):
        store.save(model, optimizer, TrainerState(version, {0: 10 * version}, 8 * version, epoch=1))
    assert store.restore(model, optimizer, accept=lambda state: state.version != 5) == TrainerState(4, {0: 40}, 32, 1)
    assert store.restore(model, optimizer, accept=lambda state: False) is None


def test_a_state_written_before_the_ledger_existed_reads_with_epoch_0() -> None:
    old = '{"version": 2, "offsets": {"0": 16}, "trained_samples": 16, "history": [], "resumes": []}'
    assert TrainerState.from_json(old) == TrainerState(2, {0: 16}, 16, 0)
