"""``astraflow warmup``: the base checkpoint a run starts from, built once and cached.

With ``model.path`` set, that checkpoint is the base and nothing is trained. Otherwise a tiny
model is built from the ``model`` section, supervised on the task's train split until held-out
greedy exact match reaches ``warmup.target_accuracy`` (``supervised_warmup``), and saved with
``save_pretrained``. The result is cached under ``$ASTRAFLOW_CACHE`` (default
``~/.cache/astraflow``) by a hash of the model, task and warm-up sections and the policy's role,
and copied into ``{run_dir}/base`` (``{run_dir}/base/{policy}`` with ``policies``) where every
component loads it. A multi-policy run warms each policy up on its own data (``load_policy_split``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from astraflow.config import RunConfig
from astraflow.models.base import base_checkpoint_dir

logger = logging.getLogger(__name__)


def cache_root() -> Path:
    return Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))


def _cache_key(config: RunConfig) -> str:
    sections = {name: getattr(config, name).model_dump(mode="json") for name in ("model", "task", "warmup")}
    if config.role != "answer":  # keys of single-role runs stay what they were, so their caches stay valid
        sections["role"] = {"role": config.role, "max_new_tokens": config.rollout.max_new_tokens}
    return hashlib.sha256(json.dumps(sections, sort_keys=True).encode()).hexdigest()[:16]


def _train_base(config: RunConfig, run_dir: Path, target: Path) -> None:
    import torch

    from astraflow.consumers.warmup import supervised_warmup
    from astraflow.models.loading import save_policy
    from astraflow.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
    from astraflow.tasks.datasets import load_policy_split

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    m, w = config.model, config.warmup
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelSpec(hidden_size=m.hidden, num_layers=m.layers, num_heads=m.heads, intermediate_size=4 * m.hidden, seed=m.seed))
    result = supervised_warmup(
        model,
        tokenizer,
        load_policy_split(config, run_dir, "train", targets=True),
        load_policy_split(config, run_dir, "heldout", targets=True),
        target_em=w.target_accuracy,
        max_steps=w.max_steps,
        batch_size=w.batch_size,
        lr=w.lr,
        eval_every=w.eval_every,
        max_new_tokens=config.rollout.max_new_tokens,
        seed=m.seed,
    )
    logger.info("warm-up: held-out exact match %.3f after %d steps (%.1f s)", result.heldout_em, result.steps, result.seconds)
    save_policy(model, tokenizer, target)
    (target / "warmup.json").write_text(json.dumps({"steps": result.steps, "heldout_em": result.heldout_em, "seconds": result.seconds, "curve": result.curve}))


def ensure_base_checkpoint(config: RunConfig, run_dir: Path) -> Path:
    """The run's base checkpoint directory, warming a tiny model up first when needed."""
    target = base_checkpoint_dir(config, run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    if config.model.path or (target / "config.json").is_file():
        return target
    cached = cache_root() / "base" / _cache_key(config)
    if not (cached / "config.json").is_file():
        building = cached.with_name(cached.name + f".tmp{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        _train_base(config, run_dir, building)
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(building, cached)
    else:
        logger.info("reusing the cached base checkpoint %s", cached)
    shutil.copytree(cached, target)
    return target
