"""Where a run's base checkpoint lives: ``model.path`` when given, else ``{run_dir}/base``
(``{run_dir}/base/{policy}`` for each policy of a run with ``policies``).

``astraflow warmup`` (or the first stage of ``astraflow run``) writes ``{run_dir}/base``; every
component loads the policy from the path this module returns, with the same code for a tiny
warmed-up model and a real checkpoint on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

from astraflow.config import RunConfig
from astraflow.core.errors import ConfigError
from astraflow.core.rundir import RunDir


def base_checkpoint_dir(config: RunConfig, run_dir: Path) -> Path:
    """Of ``config.policy``: pass the config narrowed by ``RunConfig.for_policy``."""
    if config.model.path:
        return Path(config.model.path)
    return RunDir(run_dir).base(config.policy if config.policies else None)


def base_checkpoint_path(config: RunConfig, run_dir: Path) -> Path:
    """The base checkpoint directory, which must exist (``ConfigError`` saying how to make it)."""
    path = base_checkpoint_dir(config, run_dir)
    if not (path / "config.json").is_file():
        hint = "check model.path" if config.model.path else f"run `astraflow warmup CONFIG --run-dir {run_dir}` first"
        raise ConfigError(f"no base checkpoint at {path}: {hint}")
    return path


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where Hugging Face configs of different architectures keep the context length."""


def model_limits(path: Path) -> tuple[int | None, int | None]:
    """(vocabulary size, context length) of the checkpoint at ``path``, from its ``config.json``
    (read as JSON, so no model library is imported); ``None`` for what it does not say."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None, None
    config = {**config.get("text_config", {}), **config}
    vocab = config.get("vocab_size")
    context = next((config[key] for key in CONTEXT_KEYS if isinstance(config.get(key), int)), None)
    return (vocab if isinstance(vocab, int) else None), context
