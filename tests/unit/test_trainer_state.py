"""The trainer state in a checkpoint: version, offsets per samples partition, samples trained, epoch."""

from __future__ import annotations

from pathlib import Path

import torch

from astraflow.training.checkpoint import (
    CheckpointStore,
    TrainerState,
    complete_checkpoints,
    is_sharded,
    load_sharded,
    read_latest_state,
    read_model_state,
    save_sharded,
)


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


def test_a_sharded_checkpoint_restores_model_and_optimizer_in_one_process(tmp_path: Path) -> None:
    """What a trainer of several ranks writes (``sharded/``) loads into a trainer of one, and its weights
    read back whole; in one process DCP writes all of it (the ranks' split is the integration tests')."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    store = CheckpointStore(tmp_path)
    tmp = store.begin(7)
    save_sharded(tmp, model, optimizer)
    final = store.commit(tmp, TrainerState(7, {0: 70}, 56, epoch=3))
    assert is_sharded(final) and not (final / "model.pt").exists() and read_latest_state(tmp_path).version == 7

    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    assert load_sharded(final, fresh, fresh_optimizer) == TrainerState(7, {0: 70}, 56, 3)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
        assert torch.equal(read_model_state(final)[name], tensor), name
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for index, moments in saved.items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loaded[index][key], moments[key]), (index, key)


def test_retention_never_deletes_the_newest_checkpoint_the_ledger_names(tmp_path: Path) -> None:
    """Saves delete nothing; ``prune`` keeps the two newest named checkpoints and whatever lies above the
    newest of them (a checkpoint whose version is about to commit), and deletes the rest."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    store = CheckpointStore(tmp_path)
    named = {10, 20, 30}
    for version in (10, 20, 30, 40, 50):  # 40 and 50: written, then killed before their versions committed
        store.save(model, optimizer, TrainerState(version, {0: version}, version, epoch=1))
    assert [p.name for p in complete_checkpoints(tmp_path)] == [
        "v00000010",
        "v00000020",
        "v00000030",
        "v00000040",
        "v00000050",
    ]
    assert [p.name for p in store.prune(lambda state: state.version in named)] == ["v00000010"]
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["v00000020", "v00000030", "v00000040", "v00000050"]
    named.add(60)
    store.save(model, optimizer, TrainerState(60, {0: 60}, 60, epoch=2))
    store.prune(lambda state: state.version in named)
    assert [int(p.name[1:]) for p in complete_checkpoints(tmp_path)] == [30, 60]
    assert store.prune(lambda state: False) == []  # nothing named yet: nothing to measure retention from
