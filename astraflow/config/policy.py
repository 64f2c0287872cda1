"""The ``policies`` section: one policy's overrides of the top-level sections in a multi-policy run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from astraflow.config.base import Section
from astraflow.config.model import ModelConfig, WarmupConfig
from astraflow.config.rollout import EngineConfig
from astraflow.config.stream import StreamConfig
from astraflow.config.train import TrainConfig

Role = Literal["answer", "judge"]


class PolicyRolloutConfig(Section):
    """The per-policy part of ``rollout``; an unset field inherits the top-level one."""

    group_size: int | None = Field(default=None, ge=1, le=1024)
    """Samples of this policy per group (the judge: judgements per answer)."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """Longest response of this policy in tokens."""
    temperature: float | None = Field(default=None, gt=0.0, le=10.0)
    """Sampling temperature of this policy."""


class PolicyConfig(Section):
    """One policy of a multi-policy run: overrides of the top-level sections (only the fields written here)."""

    role: Role | None = None
    """What the policy produces; unset: the top-level ``role``."""
    model: ModelConfig | None = None
    """Overrides of ``model`` (each policy has its own weights and base checkpoint)."""
    warmup: WarmupConfig | None = None
    """Overrides of ``warmup``."""
    train: TrainConfig | None = None
    """Overrides of ``train`` (optimizer, batch size, learning rate of this policy's trainer)."""
    stream: StreamConfig | None = None
    """Overrides of ``stream`` (this policy's pipeline and staleness bound)."""
    rollout: PolicyRolloutConfig | None = None
    """Overrides of ``rollout.group_size``, ``max_new_tokens`` and ``temperature``."""
    engine: EngineConfig | None = None
    """Overrides of ``engine`` (e.g. a shorter ``simulated.median_tokens`` for a judge's turns)."""

    @model_serializer(mode="wrap")
    def _only_written(self, handler: SerializerFunctionWrapHandler) -> dict:
        """The saved config keeps only the fields written, so it loads again with the same inheritance."""
        data = handler(self)
        return {name: _written(getattr(self, name), data[name]) for name in self.model_fields_set}


def _written(value: object, dumped: object) -> object:
    """``dumped`` (the serialised ``value``) cut to the fields written, at every depth."""
    if not isinstance(value, BaseModel) or not isinstance(dumped, dict):
        return dumped
    return {name: _written(getattr(value, name), dumped[name]) for name in value.model_fields_set if name in dumped}
