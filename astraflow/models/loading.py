"""Load a policy (model + tokenizer) from a local checkpoint directory.

The same code loads the tiny models of ``tiny.py`` and any real Hugging Face checkpoint that has
been downloaded to disk; it never reaches the Hub (``local_files_only``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from astraflow.errors import ConfigError


def load_policy(
    path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM and tokenizer saved in directory ``path``, the model on ``device`` in eval mode."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ConfigError(f"model.path: {directory} is not a checkpoint directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=dtype)
    model.to(device)
    model.eval()
    return model, tokenizer


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """``save_pretrained`` the model and tokenizer into ``path`` (created); ``load_policy`` reads it back."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
