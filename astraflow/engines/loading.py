"""Load a policy (model + tokenizer) from a local checkpoint directory.

The same code loads the tiny models of ``basemodel/tiny.py`` and any real Hugging Face causal LM that has
been downloaded to disk; it never reaches the Hub (``local_files_only``). Real checkpoints differ
from the tiny one in two ways handled here: many have no pad token (left padding then uses the
eos token; padded positions are masked out everywhere), and they are stored in bf16/fp16, which
``dtype="auto"`` keeps on a GPU that runs it and widens to fp32 on CPU.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from astraflow.core.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; ``cuda`` without a GPU is a ``ConfigError``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"engine.device: {device!r} asked for, but no CUDA GPU is visible")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """``auto`` → bf16 on a GPU that supports it, fp16 on other GPUs, fp32 on CPU; names → dtypes."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"engine.dtype: unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``path``, left-padding, with a pad token (eos when it has none)."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ConfigError(f"model.path: {directory} is not a checkpoint directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ConfigError(f"model.path: the tokenizer in {directory} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(
    path: str | Path, device: str = "cpu", dtype: str | torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM and tokenizer saved in directory ``path``, the model on ``device`` in eval mode.

    ``device`` and ``dtype`` accept ``"auto"`` (see ``resolve_device`` / ``resolve_dtype``).
    """
    tokenizer = load_tokenizer(path)
    where = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(Path(path), local_files_only=True, dtype=resolve_dtype(dtype, where))
    model.to(where)
    model.eval()
    return model, tokenizer


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """``save_pretrained`` the model and tokenizer into ``path`` (created); ``load_policy`` reads it back."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
