"""Atomic trainer checkpoints: model, optimizer, consumed offsets and version, all or nothing.

Steps of a save (why a crash at any point leaves either the old or the new checkpoint, whole):

1. Write every file of version v into ``v{v:08d}.tmp/`` and fsync them.
2. Rename the directory to ``v{v:08d}/`` (atomic on one filesystem) and fsync the parent.
3. Delete checkpoints older than the newest ``keep``.

A reader takes the newest directory without the ``.tmp`` suffix. The consumed offsets are the
log offsets of the *next* sample to train on, so a resumed trainer seeks there: a crash between an
optimizer step and its checkpoint redoes that step from the same samples and never skips data.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class TrainerState:
    version: int
    offsets: dict[int, int]
    """Samples-topic partition → next offset to consume."""
    trained_samples: int


class CheckpointStore:
    """Checkpoints of one policy's trainer under ``directory``."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = directory
        self.keep = keep
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.tmp"):
            shutil.rmtree(stale)

    def latest(self) -> Path | None:
        done = sorted(p for p in self.directory.glob("v*") if p.is_dir() and not p.name.endswith(".tmp"))
        return done[-1] if done else None

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState) -> Path:
        final = self.directory / f"v{state.version:08d}"
        tmp = final.with_name(final.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=False)
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps({"version": state.version, "offsets": state.offsets, "trained_samples": state.trained_samples}))
        for path in tmp.iterdir():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
        os.rename(tmp, final)
        directory_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)
        for old in sorted(p for p in self.directory.glob("v*") if not p.name.endswith(".tmp"))[: -self.keep]:
            shutil.rmtree(old)
        return final

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainerState | None:
        """Load the newest checkpoint into ``model`` and ``optimizer``; ``None`` when there is none."""
        latest = self.latest()
        if latest is None:
            return None
        model.load_state_dict(torch.load(latest / "model.pt", weights_only=True))
        optimizer.load_state_dict(torch.load(latest / "optimizer.pt", weights_only=True))
        raw = json.loads((latest / "state.json").read_text())
        return TrainerState(raw["version"], {int(k): v for k, v in raw["offsets"].items()}, raw["trained_samples"])
