"""The learner every rank of a policy's trainer builds, and the checkpoint each loads into it.

Rank 0 (``component.Trainer``) and the other ranks (``ranks.TrainerRank``) build the same learner
over the same base checkpoint and restore the checkpoint rank 0 chose, through these two functions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.consumers.trainer.ledger import TrainerLedger
from astraflow.core.errors import AstraFlowError
from astraflow.runtime.base_checkpoint import base_checkpoint_path
from astraflow.training.checkpoint import (
    CheckpointStore,
    TrainerState,
    is_deepspeed,
    is_sharded,
    load_checkpoint,
    read_state,
)
from astraflow.training.distributed import SINGLE, CommandChannel, Ranks

if TYPE_CHECKING:
    from astraflow.config import RunConfig
    from astraflow.training.learner import Learner

logger = logging.getLogger(__name__)


def build_rank_learner(config: RunConfig, run_dir: Path, ranks: Ranks = SINGLE) -> tuple[Learner, object]:
    """The learner of this rank of a policy's trainer over the base checkpoint, and the tokenizer.

    With several ranks it first joins the process group; every rank builds its learner at the same
    time (DDP and FSDP2 synchronise the model as they wrap it).
    """
    import torch

    from astraflow.engines.loading import load_policy
    from astraflow.training.distributed import init_group
    from astraflow.training.learner import build_learner, step_config

    cfg = config.train
    torch.set_num_threads(cfg.threads)
    if ranks.distributed:
        init_group(ranks)
    model, tokenizer = load_policy(base_checkpoint_path(config, run_dir))
    learner = build_learner(
        cfg.backend,
        model,
        tokenizer.pad_token_id,
        step_config(cfg, config.rollout),
        deepspeed=cfg.deepspeed,
        simulated=cfg.simulated,
        fsdp=cfg.fsdp,
        ranks=ranks,
    )
    if ranks.leader:
        logger.info(
            "trainer backend %s%s%s",
            cfg.backend,
            f" (ZeRO stage {cfg.deepspeed.zero_stage}, optimizer offload {cfg.deepspeed.offload_optimizer})"
            if cfg.backend == "deepspeed"
            else "",
            f", {ranks.world_size} ranks" if ranks.distributed else "",
        )
    return learner, tokenizer


def restore_rank(learner: Learner, directory: Path | None, version: int) -> TrainerState | None:
    """Load the checkpoint in ``directory`` (none: keep the base) into this rank's learner, which
    then trains from ``version``; every rank does it with the directory rank 0 chose. A checkpoint of
    several ranks (``sharded/``, or the deepspeed backend's ``deepspeed/``) loads whatever this world's
    size; so does one of one rank (``model.pt``) where the backend can take full state dicts. A KL
    term (``train.kl``) takes the checkpoint's β, and a ``sync`` reference the restored weights."""
    restored = None
    if directory is not None and (is_sharded(Path(directory)) or is_deepspeed(Path(directory))):
        restored = learner.backend.load_shards(Path(directory))
    elif directory is not None:
        learner.backend.check_full_checkpoint(Path(directory))
        restored = load_checkpoint(Path(directory), learner.backend.model_state, learner.optimizer)
    if restored is not None:
        learner.resume_kl(restored.kl_coef)
    learner.version = version
    return restored


def restore_leader(
    policy: str, learner: Learner, checkpoints: CheckpointStore, ledger: TrainerLedger, commands: CommandChannel
) -> tuple[TrainerState | None, int]:
    """Rank 0's restore: the newest checkpoint its ledger names (none: the base), loaded by every rank,
    which train on from the version id the ledger gives it. Returns its state and the checkpointed
    version (0 for the base)."""
    found = checkpoints.find(accept=ledger.names)
    checkpointed = read_state(found).version if found else 0
    start = ledger.start_version(checkpointed)
    commands.send("restore", directory=str(found) if found else None, version=start)
    restored = restore_rank(learner, found, start)
    if restored:
        logger.info(
            "trainer epoch %d resumed %s at version %d from offsets %s; publishing it as version %d",
            ledger.next_epoch,
            policy,
            restored.version,
            restored.offsets,
            learner.version,
        )
    return restored, checkpointed


def check_restored(restored: TrainerState | None, sha256: str, ledger: TrainerLedger) -> None:
    """Refuse to resume from a checkpoint whose weights (published again whole, ``sha256``) are not the
    ones its version was published with: a checkpointed version is published whole, so its ledger
    entry's ``payload_sha256`` is the sha256 of exactly those weights. A checkpoint written at a stop
    (of a version published as a delta) or before this check existed carries nothing to check."""
    if restored is None or not restored.published_full:
        return
    expected = ledger.payloads.get((restored.epoch, restored.version))
    if expected and expected != sha256:
        raise AstraFlowError(
            f"the checkpoint of version {restored.version} (epoch {restored.epoch}) does not hold the weights that"
            f" version was published with (sha256 {sha256[:16]}..., the ledger says {expected[:16]}...): it was"
            " changed on disk; refusing to resume from it (delete it to resume from the one before)"
        )
