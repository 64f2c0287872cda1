"""Inference engines, chosen by ``engine.type``: ``torch`` | ``vllm`` | ``openai`` | ``simulated``.

``build_engine`` is the only place that knows the names; each builder imports its backend lazily,
so choosing ``openai`` never imports vLLM and a missing package fails with how to install it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.engines.base import Engine, EngineError, Generation

if TYPE_CHECKING:
    from astraflow.config import EngineConfig

__all__ = ["ENGINES", "Engine", "EngineError", "Generation", "build_engine"]


def _torch(config: EngineConfig, checkpoint: Path, seed: int | None) -> Engine:
    from astraflow.engines.loading import load_policy
    from astraflow.engines.torch_engine import TorchEngine

    model, tokenizer = load_policy(checkpoint, device=config.device, dtype=config.dtype)
    return TorchEngine(
        model, tokenizer, seed=seed, chat_template=config.chat_template, prefix_cache_bytes=config.prefix_cache_mb << 20
    )


def _vllm(config: EngineConfig, checkpoint: Path, seed: int | None) -> Engine:
    from astraflow.engines.vllm_engine import VllmEngine

    options = config.vllm
    return VllmEngine(
        checkpoint,
        chat_template=config.chat_template,
        dtype="auto" if config.dtype == "auto" else config.dtype,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_model_len=options.max_model_len,
        seed=seed,
    )


def _openai(config: EngineConfig, checkpoint: Path, seed: int | None) -> Engine:
    from astraflow.engines.loading import load_tokenizer
    from astraflow.engines.openai_api import OpenAIEngine

    options = config.openai
    return OpenAIEngine(
        load_tokenizer(checkpoint),
        options.base_url,
        model=options.model,
        chat_template=config.chat_template,
        timeout_s=options.timeout_s,
        max_parallel=options.max_parallel,
        weight_update=options.weight_update,
        update_dir=Path(options.update_dir) if options.update_dir else None,
        checkpoint=checkpoint,
    )


def _simulated(config: EngineConfig, checkpoint: Path, seed: int | None) -> Engine:
    from astraflow.engines.loading import load_tokenizer
    from astraflow.engines.simulated import SimulatedEngine

    return SimulatedEngine(load_tokenizer(checkpoint), config.simulated, seed=seed)


ENGINES: dict[str, Callable[[EngineConfig, Path, int | None], Engine]] = {
    "torch": _torch,
    "vllm": _vllm,
    "openai": _openai,
    "simulated": _simulated,
}


def build_engine(config: EngineConfig, checkpoint: Path, seed: int | None = None) -> Engine:
    """The engine named by ``config.type``, serving the checkpoint directory ``checkpoint`` at version 0."""
    return ENGINES[config.type](config, checkpoint, seed)
