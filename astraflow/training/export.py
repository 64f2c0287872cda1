"""A checkpointed version of a policy as a Hugging Face ``save_pretrained`` directory.

A trainer checkpoint (``checkpoints/<policy>/vNNNNNNNN/``) holds a bare state dict (``model.pt``, or
``sharded/`` when several ranks wrote it; ``training/checkpoint.py read_model_state``); the
architecture and the tokenizer are the base checkpoint's. Steps of an export:

1. Load the base checkpoint (its config, in its stored dtype) and its tokenizer as saved; with
   ``weights.verify_key``, check the checkpoint's seal first (``weights/seal.py``): signed by that key
   for this run and policy, of this version, of exactly these weights, or the export is refused.
2. Put the checkpoint's state dict in, rounded to ``weights.transfer_dtype`` first: the weights of
   that version exactly as the run's rollout producers and evaluator loaded them from the weights
   topic (bf16 by default; with ``transfer_dtype: fp32`` the trainer's own weights).
3. ``save_pretrained`` model and tokenizer into ``DIR.tmp``, then rename it to ``DIR``: a reader
   never sees half an export.

The directory opens with ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``
alone (vLLM and TRL load it the same way); nothing of this project is needed to use it.
``astraflow run`` exports each policy's newest checkpoint to ``final/<policy>`` when it stops
(``export_final_models``); ``astraflow export-model`` exports any checkpointed version.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from astraflow.config import RunConfig
from astraflow.core.errors import ConfigError
from astraflow.core.rundir import RunDir
from astraflow.runtime.base_checkpoint import base_checkpoint_path
from astraflow.training.checkpoint import SHARDED, checkpointed_versions, is_sharded, read_model_state, version_dir

logger = logging.getLogger(__name__)


def checkpoint_for(run_dir: Path, policy: str, version: int | None = None) -> tuple[Path, int]:
    """The checkpoint directory of ``policy``'s ``version`` (``None``: the newest) and its version.

    ``ConfigError`` naming the versions there are when it is not checkpointed (the trainer keeps
    only its newest few checkpoints).
    """
    directory = RunDir(run_dir).checkpoints(policy)
    versions = checkpointed_versions(directory)
    if not versions:
        raise ConfigError(f"policy {policy!r}: no checkpoint under {directory} (no version was trained)")
    chosen = versions[-1] if version is None else version
    if chosen not in versions:
        raise ConfigError(
            f"--version {version}: policy {policy!r} has checkpoints of versions {versions} only "
            "(the trainer keeps its newest few)"
        )
    path = version_dir(directory, chosen)
    if not (path / "model.pt").is_file() and not is_sharded(path):
        raise ConfigError(f"{path}: neither model.pt nor {SHARDED}/, so no weights to export")
    return path, chosen


def export_version(
    config: RunConfig, run_dir: Path, policy: str, out: Path, version: int | None = None, replace: bool = False
) -> int:
    """Write ``policy``'s checkpointed ``version`` (``None``: the newest) to ``out``; return the version.

    ``out`` must not exist unless ``replace`` (then a previous export there is replaced whole).
    """
    narrowed = config.for_policy(policy)
    checkpoint, chosen = checkpoint_for(run_dir, policy, version)
    if out.exists() and not replace:
        raise ConfigError(f"--out {out}: already exists; choose a new directory")
    base = base_checkpoint_path(narrowed, run_dir)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.weights.payload import to_transfer

    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    state = read_model_state(checkpoint)
    if narrowed.weights.verify_key:
        from astraflow.runtime.topics import RunTopics
        from astraflow.weights.seal import check_seal, state_digest
        from astraflow.weights.signing import ManifestVerifier

        topic = RunTopics(config.run, config.workflow, config.policy_names()).weights(policy)
        digest = state_digest(state, narrowed.weights.transfer_dtype)
        check_seal(checkpoint, chosen, digest, ManifestVerifier(narrowed.weights.verify_key), topic)
    model.load_state_dict(to_transfer(state, narrowed.weights.transfer_dtype))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    logger.info("exported %s version %d from %s to %s", policy, chosen, checkpoint, out)
    return chosen


def export_final_models(config: RunConfig, run_dir: Path) -> dict[str, dict]:
    """Export each policy's newest checkpoint to ``final/<policy>``, for ``summary.json``: per policy
    ``{"path", "version"}``, or ``{"error"}`` when it failed (the run's summary is written anyway).
    A policy with no checkpoint (no version trained) is left out."""
    exported: dict[str, dict] = {}
    for policy in config.policy_names():
        if not checkpointed_versions(RunDir(run_dir).checkpoints(policy)):
            continue
        out = RunDir(run_dir).final_model(policy)
        try:
            version = export_version(config, run_dir, policy, out, replace=True)
        except Exception as exc:  # a failed export must not cost the run its summary
            logger.exception("exporting the final version of %s failed", policy)
            exported[policy] = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            exported[policy] = {"path": str(out), "version": version}
    return exported
