"""Sealed checkpoints (``weights/seal.py``): with a signing key every checkpoint the trainer writes is
sealed; with the verify key a trainer resumes from, and ``export_version`` exports, only a checkpoint
whose seal holds - for this run's policy, this version and exactly these weights."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import torch

from astraflow.config import RunConfig
from astraflow.consumers.trainer.component import Trainer
from astraflow.core.errors import WeightsError
from astraflow.core.rundir import RunDir
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.training.export import export_version
from astraflow.weights.seal import SEAL_FILE
from astraflow.weights.signing import generate_key_pair
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import send_samples, stopping_at, tiny_math_config


def trained(tmp_path: Path, run: str = "sealed") -> tuple[RunConfig, Path]:
    """A run of signed weights whose trainer checkpointed version 2 (due) and stopped at 3 (a stop
    checkpoint, of a version published as a delta, which the ledger's sha256 does not cover)."""
    private, public, _ = generate_key_pair(tmp_path / "keys")
    keys = {"signing_key": str(private), "verify_key": str(public)}
    train = {"checkpoint_every": 2, "batch_samples": 8}
    config = tiny_math_config(tmp_path, {"run": run, "train": train, "weights": keys})
    ctx = ComponentContext(config, tmp_path / "run", "train")
    try:
        send_samples(ctx, recorded_samples(40))
        stop = threading.Event()
        stopping_at(Trainer(ctx, "main"), 3, stop).run(stop)
    finally:
        ctx.close()
    return config, tmp_path / "run"


def resume(config: RunConfig, run_dir: Path, until: int = 4) -> None:
    ctx = ComponentContext(config, run_dir, "train")
    try:
        stop = threading.Event()
        stopping_at(Trainer(ctx, "main"), until, stop).run(stop)
    finally:
        ctx.close()


def tamper(checkpoint: Path) -> None:
    """One weight changed in ``model.pt``, as corruption or an edit on the disk would."""
    state = torch.load(checkpoint / "model.pt")
    name = next(name for name in state if ".layers." in name)
    state[name] = state[name] + 1.0
    torch.save(state, checkpoint / "model.pt")


def test_every_checkpoint_is_sealed_and_a_sealed_one_resumes_and_exports(tmp_path: Path) -> None:
    config, run_dir = trained(tmp_path)
    checkpoints = RunDir(run_dir).checkpoints("main")
    assert (checkpoints / "v00000002" / SEAL_FILE).is_file() and (checkpoints / "v00000003" / SEAL_FILE).is_file()
    assert export_version(config, run_dir, "main", tmp_path / "export", version=3) == 3
    resume(config, run_dir)
    assert (checkpoints / "v00000004" / SEAL_FILE).is_file()


def test_a_stop_checkpoint_changed_on_disk_is_refused_at_resume_and_at_export(tmp_path: Path) -> None:
    config, run_dir = trained(tmp_path)
    tamper(RunDir(run_dir).checkpoints("main") / "v00000003")
    with pytest.raises(WeightsError, match="not the ones the trainer sealed"):
        export_version(config, run_dir, "main", tmp_path / "export", version=3)
    assert not (tmp_path / "export").exists()
    with pytest.raises(WeightsError, match="v00000003: its weights are not the ones the trainer sealed"):
        resume(config, run_dir)
    ctx = ComponentContext(config, run_dir, "train")
    try:
        entries = [entry for _, entry in decode_snapshot(ctx.log, ctx.topics.ledger("main"))]
    finally:
        ctx.close()
    assert {entry.epoch for entry in entries} == {1}  # the refused start committed nothing


def test_a_seal_of_another_version_or_policy_or_none_is_refused(tmp_path: Path) -> None:
    config, run_dir = trained(tmp_path)
    checkpoints = RunDir(run_dir).checkpoints("main")
    shutil.copy(checkpoints / "v00000002" / SEAL_FILE, checkpoints / "v00000003" / SEAL_FILE)
    with pytest.raises(WeightsError, match="its seal is of version 2, not of version 3"):
        export_version(config, run_dir, "main", tmp_path / "a", version=3)
    other_config, other_run = trained(tmp_path / "other", run="other")
    (checkpoints / "v00000003" / SEAL_FILE).unlink()
    with pytest.raises(WeightsError, match=f"has no {SEAL_FILE}"):
        export_version(config, run_dir, "main", tmp_path / "b", version=3)
    # the other run's genuine checkpoint of version 3, with its seal, signed by its own key; this
    # run's verify key is another, and its seal names the other run's topic
    shutil.rmtree(checkpoints / "v00000003")
    shutil.copytree(RunDir(other_run).checkpoints("main") / "v00000003", checkpoints / "v00000003")
    with pytest.raises(WeightsError, match="its seal is refused: foreign"):
        export_version(config, run_dir, "main", tmp_path / "c", version=3)
    same_key = other_config.model_copy(update={"run": "sealed"})
    with pytest.raises(WeightsError, match="its seal is refused: bad signature: .* for sealed.weights.main"):
        export_version(same_key, run_dir, "main", tmp_path / "d", version=3)
