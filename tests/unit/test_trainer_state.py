"""The trainer state in a checkpoint keeps which offsets each version trained and where it resumed."""

from __future__ import annotations

from pathlib import Path

import torch

from astraflow.training.checkpoint import CheckpointStore, TrainerState, read_latest_state


def test_history_and_resumes_round_trip_and_read_without_the_model(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    state = TrainerState(3, {0: 30}, 12, [(1, {0: 8}), (2, {0: 20}), (3, {0: 30})], [{0: 20}], 500)
    CheckpointStore(tmp_path).save(model, optimizer, state)
    assert read_latest_state(tmp_path) == state
    assert CheckpointStore(tmp_path).restore(model, optimizer) == state
    assert read_latest_state(tmp_path / "none") is None


def test_a_state_written_before_the_history_existed_reads_with_none() -> None:
    old = '{"version": 2, "offsets": {"0": 16}, "trained_samples": 16}'
    assert TrainerState.from_json(old) == TrainerState(2, {0: 16}, 16, [], [], 0)
