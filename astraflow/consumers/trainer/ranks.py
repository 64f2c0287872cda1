"""The ranks of a policy's trainer other than rank 0: they train their share of each batch and
write nothing.

Rank 0 is the ``Trainer`` of ``component.py``: it alone opens the log, holds the policy's
transactional id, reads and assembles the batches, and commits each version with its ledger entry
and offsets. A ``TrainerRank`` opens no log and no producer, so it can never be fenced or write a
record; it builds the same learner over the same base checkpoint and follows rank 0's commands
(``training/distributed.py``) until ``stop``:

- ``restore``: load the checkpoint rank 0 chose (its directory; the run directory is shared by the
  ranks of one machine) and take the version to train from;
- ``step``: one optimizer step on the broadcast batch, of which ``PolicyTrainer.step`` trains this
  rank's share; a step that is not finite is skipped by every rank alike;
- ``publish``: take part in gathering a sharded model's full tensors, which only rank 0 keeps;
- ``checkpoint``: write this rank's shards of the model and optimizer state into the directory rank 0
  names, with ``torch.distributed.checkpoint`` (rank 0 then makes the checkpoint whole);
- ``idle``: nothing (rank 0 is waiting for samples).

A stop signal does not end a ``TrainerRank``: rank 0 finishes its step, checkpoints (which may
need this rank) and then sends ``stop``. When any rank dies, the elastic launcher ends the others
and restarts the group, which resumes from the last checkpoint as a restarted trainer does.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from astraflow.config import RunConfig
from astraflow.consumers.trainer.rank_learner import build_rank_learner, restore_rank
from astraflow.core.errors import NonFiniteStepError
from astraflow.training.distributed import CommandChannel, Ranks

logger = logging.getLogger(__name__)


class TrainerRank:
    """Rank ``ranks.rank`` (not 0) of the trainer of ``config``'s policy."""

    def __init__(self, config: RunConfig, run_dir: Path, ranks: Ranks) -> None:
        if ranks.leader:
            raise ValueError("rank 0 is the Trainer, which reads the samples and writes the log")
        self.ranks = ranks
        self.learner, _ = build_rank_learner(config, run_dir, ranks)
        self.commands = CommandChannel(ranks)
        self.steps = 0

    def run(self, stop: threading.Event) -> None:
        """Follow rank 0's commands until it sends ``stop`` (``stop`` itself only notes a signal)."""
        while True:
            command = self.commands.receive()
            if command.name == "stop":
                logger.info("rank %d: rank 0 stopped after %d steps", self.ranks.rank, self.steps)
                return
            handler = getattr(self, f"_on_{command.name}", None)
            if handler is None:
                raise RuntimeError(f"rank {self.ranks.rank}: unknown command {command.name!r} from rank 0")
            handler(**command.args)

    def _on_restore(self, directory: str | None, version: int) -> None:
        restore_rank(self.learner, Path(directory) if directory else None, version)
        logger.info("rank %d: restored %s, training from version %d", self.ranks.rank, directory or "the base", version)

    def _on_step(self, examples: list, samples: list[tuple[int, int, str]]) -> None:
        try:
            stats = self.learner.step(examples)
        except NonFiniteStepError as exc:  # every rank saw it: rank 0 skips the batch too
            logger.error("rank %d: step skipped: %s", self.ranks.rank, exc)
            return
        self.steps += 1
        logger.debug(
            "rank %d: version %d from %d samples, loss %.4f", self.ranks.rank, stats.version, len(samples), stats.loss
        )

    def _on_publish(self) -> None:
        for _name, _tensor in self.learner.backend.full_state().items():
            pass  # gathered with rank 0, which publishes them; this rank drops each at once

    def _on_checkpoint(self, directory: str) -> None:
        self.learner.backend.save_shards(Path(directory))

    def _on_idle(self) -> None:
        """Rank 0 is waiting for samples."""
