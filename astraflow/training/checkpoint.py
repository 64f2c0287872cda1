"""Atomic trainer checkpoints: model, optimizer, consumed offsets and version, all or nothing.

Steps of a save (why a crash at any point leaves either the old or the new checkpoint, whole):

1. Write every file of version v into ``v{v:08d}.tmp/`` and fsync them.
2. Rename the directory to ``v{v:08d}/`` (atomic on one filesystem) and fsync the parent.

Retention is a separate step, taken only after the version's commit (``prune``): it keeps the newest
``keep`` checkpoints that the ledger names and deletes the others below the newest of them. A save
never deletes anything, so a checkpoint the ledger names is never removed for one it does not: with
``checkpoint_every`` 10, a trainer killed twice in a row between a checkpoint's write and its
version's commit (at 40, then at 50) still finds 30, and a crash costs at most the versions since
the last committed checkpoint, never a fall-back to the base.

A reader takes the newest directory without the ``.tmp`` suffix; the trainer restores the newest
one that its ledger names (``accept``): it writes a checkpoint before it commits the version, so one
whose commit never happened (a crash in between, or a fenced trainer) is passed over, and a later
checkpoint with the same version number replaces it. The consumed offsets are the
log offsets of the *next* sample to train on, so a resumed trainer seeks there: a crash between an
optimizer step and its checkpoint redoes that step from the same samples and never skips data.
Which samples went into which version is the ledger's (``consumers/trainer/ledger.py``), not the
checkpoint's.

A trainer of one rank writes ``model.pt`` and ``optimizer.pt`` (full state dicts). A trainer of
several ranks writes ``sharded/`` instead, with ``torch.distributed.checkpoint`` (DCP): every rank
saves its own shards of the model and of the optimizer state (FSDP2's DTensors; of DDP's replicas
one copy, which DCP spreads over the ranks), so no rank gathers the whole model, and rank 0 writes
``state.json`` and renames the directory once DCP's metadata is written, which is after every rank
wrote its files. DCP loads by parameter name and global shape whatever the world size: a checkpoint of
two ranks resumes under one or under four, and one of one rank under several (every rank then loads
the full state dict and keeps its shard). The deepspeed backend writes ``deepspeed/`` instead, in
DeepSpeed's own format, with one rank or several (its backend module says how it resumes under
another world size). ``read_model_state`` reads the full weights of any kind in one process
(``astraflow export-model``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from astraflow.core.crashpoints import crash_point

if TYPE_CHECKING:
    import torch


SHARDED = "sharded"
"""The folder of a checkpoint in ``torch.distributed.checkpoint``'s format, written by every rank."""
DEEPSPEED = "deepspeed"
"""The folder of a checkpoint in DeepSpeed's format (``engine.save_checkpoint``), written by every rank."""
DEEPSPEED_TAG = "state"
"""The tag (folder) of the one DeepSpeed checkpoint in ``DEEPSPEED``."""
RECALL_WINDOW = 20_000
"""Sample ids per partition a restarted trainer re-reads below its checkpointed offsets."""


class OptimizerState(Protocol):
    """What ``CheckpointStore`` needs of an optimizer."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class TrainerState:
    version: int
    offsets: dict[int, int]
    """Samples-topic partition → next offset to consume."""
    trained_samples: int
    epoch: int = 0
    """The trainer epoch whose ledger entry names this version (0: written before the ledger existed)."""
    published_full: bool = False
    """Whether the version is published whole, so that its ledger entry's sha256 is of these weights."""
    kl_coef: float | None = None
    """β of the next step's KL term (``train.kl``; an adaptive one moves); ``None``: no KL term."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "offsets": self.offsets,
                "trained_samples": self.trained_samples,
                "epoch": self.epoch,
                "published_full": self.published_full,
                "kl_coef": self.kl_coef,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        raw = json.loads(text)
        offsets = {int(partition): offset for partition, offset in raw["offsets"].items()}
        return cls(
            raw["version"],
            offsets,
            raw["trained_samples"],
            raw.get("epoch", 0),
            raw.get("published_full", False),
            raw.get("kl_coef"),
        )


def read_state(directory: Path) -> TrainerState:
    """The trainer state (``state.json``) of the checkpoint in ``directory``."""
    return TrainerState.from_json((directory / "state.json").read_text())


def version_dir(directory: Path, version: int) -> Path:
    """The checkpoint directory of ``version`` under ``directory`` (``vNNNNNNNN``), whether or not it exists."""
    return directory / f"v{version:08d}"


def checkpointed_versions(directory: Path) -> list[int]:
    """The versions with a complete checkpoint under ``directory``, oldest first."""
    return sorted(int(p.name[1:]) for p in directory.glob("v*") if p.is_dir() and p.name[1:].isdigit())


def complete_checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoint directories under ``directory`` (no ``.tmp``), oldest first."""
    return sorted(p for p in directory.glob("v*") if p.is_dir() and not p.name.endswith(".tmp"))


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint directory under ``directory``, or ``None``."""
    done = complete_checkpoints(directory)
    return done[-1] if done else None


def read_latest_state(directory: Path) -> TrainerState | None:
    """The trainer state of the newest checkpoint, without loading model or optimizer (no torch)."""
    latest = latest_checkpoint(directory)
    return None if latest is None else read_state(latest)


class CheckpointStore:
    """Checkpoints of one policy's trainer under ``directory``."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = directory
        self.keep = keep
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.tmp"):
            crash_point("checkpoint.remove_unfinished")
            shutil.rmtree(stale)

    def latest(self) -> Path | None:
        return latest_checkpoint(self.directory)

    def save(self, model: OptimizerState, optimizer: OptimizerState, state: TrainerState) -> Path:
        """A checkpoint of full state dicts (a trainer of one rank), written by this process alone."""
        import torch

        tmp = self.begin(state.version)
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        crash_point("checkpoint.files_written", state.version)
        return self.commit(tmp, state)

    def begin(self, version: int) -> Path:
        """The empty ``.tmp`` directory a checkpoint of ``version`` is written into (step 1)."""
        tmp = version_dir(self.directory, version).with_name(f"v{version:08d}.tmp")
        tmp.mkdir(parents=True, exist_ok=False)
        return tmp

    def commit(self, tmp: Path, state: TrainerState) -> Path:
        """Write ``state`` into ``tmp``, sync every file and make the checkpoint whole (steps 1-3)."""
        final = version_dir(self.directory, state.version)
        if final.exists():  # a checkpoint of this number whose version was never committed
            crash_point("checkpoint.remove_uncommitted", state.version)
            shutil.rmtree(final)
        (tmp / "state.json").write_text(state.to_json())
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                with path.open("rb") as handle:
                    crash_point("checkpoint.fsync_file", state.version)
                    os.fsync(handle.fileno())
        crash_point("checkpoint.rename", state.version)
        os.rename(tmp, final)
        directory_fd = os.open(self.directory, os.O_RDONLY)
        try:
            crash_point("checkpoint.fsync_directory", state.version)
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)
        return final

    def prune(self, named: Callable[[TrainerState], bool]) -> list[Path]:
        """Delete the checkpoints retention lets go, once a version's commit made the newest ``named``
        (the ledger's): every one below the ``keep`` newest named ones, named or not. Nothing at or
        above the newest named checkpoint is touched. Returns what it deleted."""
        done = complete_checkpoints(self.directory)
        kept = [directory for directory in done if named(read_state(directory))][-self.keep :]
        if not kept:
            return []
        deleted = [directory for directory in done if directory < kept[-1] and directory not in kept]
        for directory in deleted:
            crash_point("checkpoint.prune")
            shutil.rmtree(directory)
        return deleted

    def restore(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        accept: Callable[[TrainerState], bool] = lambda state: True,
    ) -> TrainerState | None:
        """Load the newest checkpoint whose state ``accept`` takes into ``model`` and ``optimizer``;
        ``None`` when there is none."""
        found = self.find(accept)
        return None if found is None else load_checkpoint(found, model, optimizer)

    def find(self, accept: Callable[[TrainerState], bool] = lambda state: True) -> Path | None:
        """The newest complete checkpoint directory whose state ``accept`` takes, or ``None``: what
        ``restore`` loads (a trainer of several ranks names it to every rank first)."""
        for directory in reversed(complete_checkpoints(self.directory)):
            if accept(read_state(directory)):
                return directory
        return None


def is_sharded(directory: Path) -> bool:
    """Whether the checkpoint in ``directory`` was written by several ranks (``SHARDED``)."""
    return (directory / SHARDED).is_dir()


def is_deepspeed(directory: Path) -> bool:
    """Whether the checkpoint in ``directory`` was written by the deepspeed backend (``DEEPSPEED``)."""
    return (directory / DEEPSPEED).is_dir()


def save_sharded(tmp: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    r"""This rank's shards of ``module`` and ``optimizer`` into ``tmp/sharded``: a collective every rank
    calls with the same ``tmp``; rank 0 then ``commit``\ s it (when its call returns, all have written)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(module, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp / SHARDED)


def load_sharded(directory: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainerState:
    """Load the sharded checkpoint in ``directory`` into this rank's ``module`` and ``optimizer`` (a
    collective with several ranks; in one process without a group, the whole of it); its trainer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(module, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=directory / SHARDED)
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return read_state(directory)


def read_model_state(directory: Path) -> dict[str, torch.Tensor]:
    """The full weights of the checkpoint in ``directory``, by name, read in this process (on the CPU)."""
    import torch

    if is_deepspeed(directory):
        import contextlib
        import io

        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()):  # it reports each file it reads
            state = get_fp32_state_dict_from_zero_checkpoint(str(directory / DEEPSPEED), tag=DEEPSPEED_TAG)
        return {name: tensor.detach() for name, tensor in state.items()}
    if is_sharded(directory):
        import warnings

        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            return dict(_load_state_dict_from_keys("model", checkpoint_id=directory / SHARDED)["model"])
    return torch.load(directory / "model.pt", map_location="cpu", weights_only=True)


def load_checkpoint(directory: Path, model: OptimizerState, optimizer: OptimizerState) -> TrainerState:
    """Load the full-state checkpoint in ``directory`` into ``model`` and ``optimizer`` (anything with
    ``load_state_dict``: a backend's ``model_state`` too); its trainer state."""
    import torch

    model.load_state_dict(torch.load(directory / "model.pt", weights_only=True))
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
    return read_state(directory)
